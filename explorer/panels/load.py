"""The load panel: the concurrency slider (real background requests) and the live charts.

Contract: ``LoadPanel(ctx)`` (``explorer.panels.context``); ``build_controls()`` adds the
"Background load" accordion (slider 0..the backend's ``max_background`` requests kept in flight, closed loop, and the
readout), ``build_chart()`` the live chart of the whole server over the last
``WINDOW_S`` seconds; ``wire(page)`` connects them: a slider change asks the backend for this
session's share, closing the page releases the session's load. ``refresh(step_times, drawn,
request)``, run by the page's chart timer (``explorer.page``, every ``CHART_REFRESH_S``) into
``tick_outputs`` (``step_times`` is the ``gr.State`` of this page's foreground steps as (monotonic
t, tokens emitted), drawn as the foreground's tokens/s), updates the readout (and keeps the
session's load alive) and redraws the chart when the engine did something since the page drew it
(while the page's own request streams, at most every ``STREAMING_REFRESH_S``: the token view goes
first). The chart every page without a request of its own sees is built once per refresh tick
(``ctx.ticks``); a page's own is built only while a poll slot is free (``ctx.polls``). A session's
ask counts against its visitor's share (``ctx.visitor``: one address, however many sessions).

API names: /set_load (requests) -> readout; the page's /charts (``explorer.page``) -> (figure,
readout, then the K-policy panel's).
"""

from __future__ import annotations

import time
from typing import Any

import gradio as gr
from gradio.components import Component
from gradio.components.plot import PlotData

from engine_adapter.service.backend import Backend
from explorer.panels.context import PageContext
from explorer.views.live_charts import (
    WINDOW_S,
    bin_steps,
    chart_due,
    engine_activity,
    foreground_rate,
    live_chart_frame,
    live_figure,
)
from explorer.views.status import load_readout_markdown

# The slider's top where the backend cannot add load (a replay): its max_background is the
# recorded peak, and the slider keeps the live range so any value reaches the replay's note.
NO_LOAD_CONTROL_MAX = 64


def slider_max(backend: Backend) -> int:
    return backend.max_background if backend.capabilities.background_load else NO_LOAD_CONTROL_MAX


def plot_data(figure: Any) -> PlotData:
    """A plotly figure as the JSON Gradio sends (built once, sent to every page that polls)."""
    return PlotData(type="plotly", plot=figure.to_json())


ALL_KINDS = "all"  # the mix radio's value for every task kind


class LoadPanel:
    def __init__(self, ctx: PageContext) -> None:
        self.ctx = ctx
        self.backend = ctx.backend
        self.max_background = slider_max(ctx.backend)

    def build_controls(self) -> None:
        with gr.Accordion("Background load", open=True):
            self.load = gr.Slider(
                0,
                self.max_background,
                value=0,
                step=1,
                elem_id="load",
                label="Concurrent background requests (closed loop, preset prompts)",
            )
            self.readout = gr.Markdown("No background load.", elem_id="load-readout")
            mix = self.backend.load_mix()
            self.mix = gr.Radio(
                [("every task kind", ALL_KINDS), *((f"{kind} only", kind) for kind in mix.available)],
                value=ALL_KINDS if set(mix.chosen) == set(mix.available) else mix.chosen[0],
                label="The load's prompts (engine-wide: the presenter's choice)",
                elem_id="load-mix",
                visible=bool(mix.available),
            )
            self.mix_said = gr.Markdown("", elem_id="load-mix-said")

    def build_chart(self) -> None:
        gr.Markdown(f"## Live engine (whole server, last {WINDOW_S / 60:g} minutes)")
        self.live = gr.Plot(live_figure(bin_steps([], 0.0)), show_label=False, elem_id="live-charts")

    def wire(self, page: gr.Blocks) -> None:
        # change (not release) so a typed number counts too; always_last coalesces a drag
        self.load.change(self.set_load, self.load, self.readout, api_name="set_load", trigger_mode="always_last")
        self.mix.input(self.set_mix, self.mix, self.mix_said, api_name="set_load_mix", trigger_mode="always_last")
        # (key of what this page's chart shows (views.live_charts.engine_activity), when it was drawn)
        self.drawn = gr.State(None)
        self.tick_outputs = [self.live, self.readout, self.drawn]  # refresh's, on the page's chart timer
        page.unload(self.leave)  # a closed tab or a reload ends the session: its background load stops

    async def set_load(self, n: float, request: gr.Request) -> str:
        top = self.max_background
        try:
            n = float(n)
        except (TypeError, ValueError):
            return f"✕ The load must be a number of requests between 0 and {top}; got {n!r}."
        if not 0 <= n <= top or not n.is_integer():
            note = f"✕ {n:g} is not a whole number between 0 and {top}: nothing changed. "
            return note + self._readout(request)
        await self.backend.set_background(int(n), self.ctx.visitor(request))
        return self._readout(request)

    async def set_mix(self, kind: str, request: gr.Request) -> str:
        """Every task kind, or one kind only, for the whole load (a presenter's action)."""
        if refusal := self.ctx.refusal(request):
            return refusal
        available = self.backend.load_mix().available
        try:
            mix = await self.backend.set_load_mix(available if kind == ALL_KINDS else [str(kind)])
        except (ValueError, RuntimeError) as e:
            return f"✕ {e}"
        return f"✓ The load's next requests use {mix.describe()} (those running finish first)."

    def _readout(self, request: gr.Request) -> str:
        return self.ctx.shown(load_readout_markdown(self.backend, self.ctx.session(request)))

    def refresh_readout(self, request: gr.Request) -> dict[Component, Any]:
        """The readout alone (the page's chart gate said no redraw this tick); keeps the load alive."""
        self.backend.touch_session(self.ctx.session(request))  # a page that stops polling loses its load
        return {self.readout: self._readout(request)}

    def refresh(self, times: list[tuple[float, int]], drawn: tuple | None, request: gr.Request) -> dict[Component, Any]:
        """The readout every tick; the chart when the engine did something since this page drew it, and
        while this page's own request streams, at most every ``STREAMING_REFRESH_S`` (``chart_due``)."""
        now = time.monotonic()
        shown = self.refresh_readout(request)
        activity = self.ctx.ticks.get("activity", lambda: engine_activity(self.backend, time.monotonic()))
        key = (activity, len(times or []))
        drawn_key, drawn_at = drawn or (None, None)
        if key == drawn_key or not chart_due(drawn_at, now, times or []):
            return shown
        if not times:  # the chart every page without a request of its own sees: one per tick
            figure = self.ctx.ticks.get(("live", activity), lambda: plot_data(self._figure([], time.monotonic())))
            return {**shown, self.live: figure, self.drawn: (key, now)}
        with self.ctx.polls.slot() as mine:
            if not mine:  # every slot taken: the chart waits for the next tick
                return shown
            return {**shown, self.live: self._figure(times, now), self.drawn: (key, now)}

    def _figure(self, times: list[tuple[float, int]], now: float) -> Any:
        markers = [(t - now, n) for t, n in self.backend.load_changes]
        return live_figure(live_chart_frame(self.backend, now), markers, foreground_rate(times, now))

    def leave(self, request: gr.Request) -> None:
        self.backend.release_background(self.ctx.session(request))
        self.ctx.presenter.forget(self.ctx.session(request))
