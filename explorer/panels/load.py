"""The load panel: the concurrency slider (real background requests) and the live charts.

Contract: ``LoadPanel(ctx)`` (``explorer.panels.context``); ``build_controls()`` adds the
"Background load" accordion (slider 0..the backend's ``max_background`` requests kept in flight, closed loop, and the
readout), ``build_chart()`` the live chart of the whole server over the last
``WINDOW_S`` seconds; ``wire(page)`` connects them: a slider change asks the backend for this
session's share, closing the page releases the session's load. ``refresh_readout(request)``, run by
the page's chart timer (``explorer.page``) into ``tick_outputs``, updates the readout and keeps the
session's load alive. The chart is drawn by the page itself (``assets/live_chart.js``, every
``CHART_REFRESH_S``, its own request streaming or not): it fetches ``chart_update()`` from
``LIVE_CHART_PATH`` (answered by the app's HTTP door, no Gradio event: the engine's traces and
the load markers, built once per tick for every page, ``ctx.ticks``) and adds its own request's
tokens/s from the token view's steps. A session's ask counts against its visitor's share
(``ctx.visitor``: one address, however many sessions).

API names: /set_load (requests) -> readout; the page's /charts (``explorer.page``) -> (readout,
then the K-policy panel's and the ledger's).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.components import Component
from gradio.components.plot import PlotData

from engine_adapter.package_data import assets_dir
from engine_adapter.service.backend import Backend
from explorer.panels.context import PageContext
from explorer.views.live_charts import (
    CHART_REFRESH_S,
    FOREGROUND_TRACE,
    FRESH_S,
    WINDOW_S,
    bin_steps,
    engine_activity,
    live_chart_frame,
    live_chart_update,
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
LIVE_CHART_PATH = "/explorer/live_chart"


def live_chart_js(assets: Path) -> str:
    """The page's live-chart loop (``assets/live_chart.js``), its path and constants filled in."""
    return (
        (assets / "live_chart.js")
        .read_text()
        .replace("__LIVE_CHART_PATH__", LIVE_CHART_PATH)
        .replace("__REFRESH_MS__", str(int(CHART_REFRESH_S * 1000)))
        .replace("__FOREGROUND_TRACE__", FOREGROUND_TRACE)
    )


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
        self.tick_outputs = [self.readout]  # refresh_readout's, on the page's chart timer
        page.load(None, js=live_chart_js(assets_dir()))  # the chart's own loop, started once per page
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
        """The readout; keeps the session's load alive (a page that stops polling loses it)."""
        self.backend.touch_session(self.ctx.session(request))
        return {self.readout: self._readout(request)}

    def chart_update(self) -> dict[str, Any]:
        """The live chart's data for every page (``views.live_charts.live_chart_update``), built
        at most once per tick; its key is what the engine did lately (``engine_activity``), so a
        page redraws only when that changed."""
        return self.ctx.ticks.get("live chart", self._chart_update)

    def _chart_update(self) -> dict[str, Any]:
        now = time.monotonic()
        activity = self.ctx.ticks.get("activity", lambda: engine_activity(self.backend, now))
        markers = [(t - now, n) for t, n in self.backend.load_changes]
        load = self.backend.background_stats()
        working = bool(self.backend.steps_since(now - FRESH_S)) or bool(load and load.in_flight)
        return live_chart_update(live_chart_frame(self.backend, now), markers, now, repr(activity), working)

    def leave(self, request: gr.Request) -> None:
        self.backend.release_background(self.ctx.session(request))
        self.ctx.presenter.forget(self.ctx.session(request))
