"""What every panel of one page shares: the backend, the presenter's lock, who is asking, the bounds.

Contract: ``PageContext(backend, presenter, exposure, recording)`` holds, for all the panels of a
page (and every visitor of it): the ``Backend``; the ``Presenter`` (``refusal(request)``: None
when the request's session may change engine-wide settings, else the sentence to show); the
``Exposure`` (``visitor(request)``, ``shown(text)``: on a public page, text without engine
addresses or server paths); ``ticks``, a ``TickCache`` of one refresh tick shared by every page's
polls and ``polls``, the ``PollBound`` on how many of them compute at once; ``runs``, the
foreground ``RunSlots`` (one run per session, a few per visitor); ``recording``, the
``--record`` status, if the session is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr

from engine_adapter.service.backend import Backend, RecordingStatus, Visitor
from explorer.panels.poll_cache import PollBound, TickCache
from explorer.panels.presenter import Presenter
from explorer.panels.visitors import Exposure, RunSlots, visitor_of
from explorer.views.status import for_visitors

TICK_S = 1.0  # seconds one shared answer to the pages' polls stays fresh
ENGINE_CHANGES_AT_ONCE = 2  # engine-wide changes (restart, K policy, rule, re-measure) handled at once


@dataclass
class PageContext:
    backend: Backend
    presenter: Presenter = field(default_factory=Presenter)
    exposure: Exposure = field(default_factory=Exposure)
    recording: Callable[[], RecordingStatus | None] | None = None
    ticks: TickCache = field(default_factory=lambda: TickCache(TICK_S))
    polls: PollBound = field(default_factory=PollBound)
    runs: RunSlots = field(default_factory=RunSlots)

    def session(self, request: gr.Request | None) -> str:
        return (request.session_hash if request is not None else None) or "local"

    def visitor(self, request: gr.Request | None) -> Visitor:
        return visitor_of(request, self.exposure, presenter=self.presenter.may_act(self.session(request)))

    def refusal(self, request: gr.Request | None) -> str | None:
        return self.presenter.refusal(self.session(request))

    def shown(self, text: str) -> str:
        return for_visitors(text) if self.exposure.public else text
