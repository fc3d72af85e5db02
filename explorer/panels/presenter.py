"""Presenter mode (a panel): engine-wide settings locked behind a key, or shared with a notice.

Contract: ``Presenter(key)``; with ``key`` None every session may change the engine-wide
settings (method and K restart the engine, the K policy, the acceptance rule and re-measuring
apply live) and the page says that a change applies to everyone; with a key (``app.py
--presenter-key``, or the key the app makes itself on a public bind) a session changes them
only after entering the key, so one visitor cannot restart the engine under the class.

The lock is the server's: which sessions hold the key is kept here, by session, and every
engine-wide handler asks ``refusal(session)`` whichever way it is called (the page, an API
client, an event the page never shows). ``unlock(visitor, attempt)`` compares in constant time
and is throttled (``KeyThrottle``): a wrong key makes the next attempt from that session and
from that address wait longer each time (1, 2, 4, ... s, at most ``MAX_WAIT_S``), and more than
``MAX_WRONG_PER_MINUTE`` wrong keys on the whole server make everyone wait for the minute to
pass. ``forget(session)`` when a page closes. ``build_presenter_box(presenter, exposure)`` adds
the key box. API name: /unlock (key) -> the answer.
"""

from __future__ import annotations

import collections
import hmac
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import gradio as gr

from engine_adapter.service.backend import Visitor
from explorer.panels.visitors import Exposure, visitor_of

SHARED_NOTICE = (
    "Engine-wide settings are shared: a change here (method, K, K policy) applies to everyone "
    "using this explorer right now."
)
FIRST_WAIT_S = 1.0  # after one wrong key; doubles with each further one
MAX_WAIT_S = 300.0
MAX_WRONG_PER_MINUTE = 30  # wrong keys on the whole server in any minute, at most
FORGET_S = 3600.0  # a session's or address's wrong keys are forgotten after this long without one
MAX_TRACKED = 10_000  # sessions and addresses with wrong keys kept at most (the oldest go first)


@dataclass
class KeyThrottle:
    """Growing waits after wrong keys, per session and per address, and a server-wide cap."""

    clock: Callable[[], float] = time.monotonic
    wrong: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (wrong keys, last wrong at)
    recent: collections.deque = field(default_factory=collections.deque)  # times of wrong keys, last minute

    def wait_s(self, keys: Iterable[str]) -> float:
        """Seconds before another attempt from ``keys`` (a session and an address) is heard."""
        now = self.clock()
        while self.recent and now - self.recent[0] > 60.0:
            self.recent.popleft()
        waits = [0.0]
        if len(self.recent) >= MAX_WRONG_PER_MINUTE:
            waits.append(60.0 - (now - self.recent[0]))
        for key in keys:
            count, at = self.wrong.get(key, (0, 0.0))
            if count:
                waits.append(at + min(FIRST_WAIT_S * 2 ** (count - 1), MAX_WAIT_S) - now)
        return max(waits)

    def failed(self, keys: Iterable[str]) -> None:
        now = self.clock()
        self.recent.append(now)
        for key in keys:
            count, at = self.wrong.get(key, (0, 0.0))
            self.wrong[key] = (count + 1 if now - at < FORGET_S else 1, now)
        if len(self.wrong) > MAX_TRACKED:
            for key in sorted(self.wrong, key=lambda k: self.wrong[k][1])[: len(self.wrong) - MAX_TRACKED]:
                del self.wrong[key]


class Presenter:
    def __init__(self, key: str | None = None, throttle: KeyThrottle | None = None) -> None:
        self.key = key or None
        self.throttle = throttle or KeyThrottle()
        self._unlocked: set[str] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.key is not None

    def may_act(self, session: str) -> bool:
        return not self.enabled or session in self._unlocked

    def refusal(self, session: str) -> str | None:
        if self.may_act(session):
            return None
        return (
            "🔒 Engine-wide settings are locked by the presenter: this server refused the change. "
            "Enter the presenter key above to change them; everything else on the page is yours."
        )

    def unlock(self, visitor: Visitor, attempt: str | None) -> tuple[bool, str]:
        """(unlocked, what to say)."""
        if not self.enabled:
            return True, f"ⓘ {SHARED_NOTICE}"
        keys = (f"session:{visitor.session}", f"address:{visitor.address}")
        with self._lock:
            wait = self.throttle.wait_s(keys)
            if wait > 0:
                return False, f"✕ Too many wrong keys: try again in {wait:.0f} s."
            if hmac.compare_digest((attempt or "").encode(), self.key.encode()):
                self._unlocked.add(visitor.session)
                return True, "🔓 Unlocked for this page: your changes apply to everyone's engine."
            self.throttle.failed(keys)
            return False, "✕ That is not the presenter key."

    def forget(self, session: str) -> None:
        with self._lock:
            self._unlocked.discard(session)


def build_presenter_box(presenter: Presenter, exposure: Exposure) -> None:
    if not presenter.enabled:
        gr.Markdown(f"ⓘ {SHARED_NOTICE}", elem_id="shared-notice")
        return
    with gr.Row():
        key = gr.Textbox(
            label="Presenter key (engine-wide settings are locked)", type="password", elem_id="presenter-key", scale=3
        )
        unlock_btn = gr.Button("Unlock", elem_id="unlock", scale=1)
    said = gr.Markdown("🔒 Locked: method, K and the K policy are the presenter's.", elem_id="presenter-status")

    def unlock(attempt: str, request: gr.Request) -> tuple[str, str]:
        return presenter.unlock(visitor_of(request, exposure), attempt)[1], ""

    unlock_btn.click(unlock, key, [said, key], api_name="unlock", concurrency_id="unlock")
    key.submit(unlock, key, [said, key], api_name=False, concurrency_id="unlock")
