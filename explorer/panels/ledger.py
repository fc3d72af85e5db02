"""The "Who gets the discount" panel: every request the engine runs, its predictability and its
speedup over plain decoding, live; where the accepted drafts go over time.

Contract: ``LedgerPanel(ctx)``; ``build()`` adds its components inside the enclosing Blocks and
``wire()`` their events: the presenter's measurement of the speedup at this load (API
/measure_speedup, refused without the key; its table as CSV and Markdown: /speedup_table);
``refresh(fg, fg_steps, drawn)`` runs on the page's chart timer (``explorer.page``, API
/charts) into ``tick_outputs``: the summary, the table and, when what they show changed, the two
figures, and the quantisation lens (``explorer.panels.lens``); ``refresh_readout(fg)`` the
summary and the table only (the page's chart gate said no
redraw). What every page sees alike is built once per refresh tick (``ctx.ticks``); a page
whose own request is running (``fg``, its request id) sees it as "your request", built for it
alone and only while a poll slot is free. Other visitors' requests are "neighbour N": never
their text or their id. Reads ``steps_since`` and ``policy_view().cost`` from the Backend; a
backend without per-request rows (a trace recorded before they were kept) shows none.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.components import Component

from engine_adapter.ledger import LedgerRow, accepted_by_kind, jain_index, ledger_rows
from engine_adapter.records import EngineStep
from engine_adapter.service.backend import MAX_PROBE_TOKENS, MAX_REPEATS
from explorer.panels.context import ENGINE_CHANGES_AT_ONCE, PageContext
from explorer.panels.export import prune
from explorer.panels.lens import LensSection
from explorer.panels.load import plot_data
from explorer.views.ledger_view import (
    discount_share_figure,
    in_flight,
    ledger_figure,
    ledger_summary_markdown,
    ledger_table_markdown,
    speedup_probe_markdown,
)
from explorer.views.live_charts import streaming

LEDGER_WINDOW_S = 10.0  # seconds of steps each request's account reads
SHARE_WINDOW_S = 60.0  # seconds the discount-share chart shows (history.REQUEST_ROWS_S keeps them)
SHARE_BIN_S = 5.0


@dataclass(frozen=True)
class LedgerTick:
    """What every page's ledger reads in one refresh tick."""

    rows: list[LedgerRow]  # the requests running, every visitor's as a neighbour
    estimated: bool  # a cost model priced plain decoding
    newest_seq: int | None
    share_key: float | None  # the newest bin of the share chart


class LedgerPanel:
    def __init__(self, ctx: PageContext) -> None:
        self.ctx = ctx
        self.backend = ctx.backend

    def build(self) -> None:
        with gr.Accordion("Who gets the discount: every request running, its predictability and speedup", open=True):
            self.summary = gr.Markdown(ledger_summary_markdown([], None, False), elem_id="ledger-summary")
            with gr.Row():
                self.ledger_plot = gr.Plot(show_label=False, elem_id="ledger-plot")
                self.share_plot = gr.Plot(show_label=False, elem_id="discount-share")
            self.table = gr.Markdown("", elem_id="ledger-table")
            self._build_probe()
            self.lens = LensSection(self.ctx)
            self.lens.build()
        self.drawn = gr.State(None)
        self.tick_outputs = [
            self.summary,
            self.table,
            self.probe,
            self.ledger_plot,
            self.share_plot,
            *self.lens.outputs,
            self.drawn,
        ]

    def _build_probe(self) -> None:
        """The presenter's measurement of the speedup at this load, and its exports."""
        gr.Markdown("### The speedup at this load, measured")
        with gr.Row():
            self.repeats = gr.Slider(1, MAX_REPEATS, value=2, step=1, label="Repeats", elem_id="probe-repeats")
            self.tokens = gr.Slider(
                8, MAX_PROBE_TOKENS, value=64, step=8, label="Tokens per request", elem_id="probe-tokens"
            )
        self.probe_btn = gr.Button(
            "Measure the speedup at this load (presenter; K switches for everyone meanwhile)", elem_id="probe"
        )
        self.probe_said = gr.Markdown("", elem_id="probe-said")
        self.probe = gr.Markdown(speedup_probe_markdown(self.backend.speedup_view()), elem_id="probe-table")
        with gr.Row():
            self.probe_csv_btn = gr.Button("Export the table as CSV", elem_id="probe-csv-btn")
            # shown with the first export: empty boxes are only clutter
            self.probe_csv = gr.File(label="CSV", elem_id="probe-csv", interactive=False, height=80, visible=False)
        self.probe_md = gr.Code(
            label="The table as Markdown, to paste", language="markdown", elem_id="probe-md", visible=False
        )

    def wire(self) -> None:
        self.probe_btn.click(
            self.measure,
            [self.repeats, self.tokens],
            self.probe_said,
            api_name="measure_speedup",
            concurrency_id="engine",
            concurrency_limit=ENGINE_CHANGES_AT_ONCE,
        )
        self._exports = tempfile.TemporaryDirectory(prefix="spec-explorer-speedup-")  # removed when the app exits
        self.probe_csv_btn.click(
            self.export,
            None,
            [self.probe_csv, self.probe_md],
            api_name="speedup_table",
            concurrency_id="export",
            concurrency_limit=2,
        )
        self.probe_csv_btn.click(
            self.show_exports, None, [self.probe_csv, self.probe_md], queue=False, api_visibility="private"
        )

    async def measure(self, repeats: float, tokens: float, request: gr.Request) -> str:
        if refusal := self.ctx.refusal(request):
            return refusal
        try:
            view = await self.backend.measure_speedup(int(repeats), int(tokens))
        except (ValueError, RuntimeError, TypeError) as e:
            return f"✕ {e}"
        return f"✓ Started: {view.total_runs} requests, plain decoding and the policy in turn (progress below)."

    def export(self) -> tuple[str | None, str]:
        """The last measurement's table as a CSV file and as Markdown (nothing before one)."""
        view = self.backend.speedup_view()
        if not view.rows:
            return None, "No measured table yet."
        directory = Path(self._exports.name)
        path = directory / f"speedup_{time.strftime('%Y%m%d-%H%M%S')}_{uuid.uuid4().hex[:6]}.csv"
        path.write_text(view.csv(), encoding="utf-8")
        prune(directory)
        return str(path), view.markdown()

    @staticmethod
    def show_exports() -> tuple[Any, Any]:
        """The page's click shows the export's boxes (``export`` fills them)."""
        return gr.File(visible=True), gr.Code(visible=True)

    # --- shared, once per tick ---------------------------------------------
    def _tick(self) -> LedgerTick:
        return self.ctx.ticks.get("ledger_tick", self._build_tick)

    def _build_tick(self) -> LedgerTick:
        steps = self.backend.steps_since(time.monotonic() - LEDGER_WINDOW_S)
        cost = self.backend.policy_view().cost
        plain = (lambda b: cost.step_s(b, 0)) if cost is not None else None
        rows = ledger_rows(steps, plain)
        newest = steps[-1] if steps else None
        running = in_flight(rows, newest.t) if newest else []
        return LedgerTick(running, cost is not None, newest.seq if newest else None, self._share_key(steps))

    @staticmethod
    def _share_key(steps: list[EngineStep]) -> float | None:
        return steps[-1].t - steps[-1].t % SHARE_BIN_S if steps else None

    def _share_figure(self) -> Any:
        now = time.monotonic()
        series = accepted_by_kind(self.backend.steps_since(now - SHARE_WINDOW_S), SHARE_BIN_S)
        if "neighbours" in series:  # shared by every page: each visitor's own request is among these
            series["visitors"] = series.pop("neighbours")
        return plot_data(discount_share_figure(series, now, SHARE_BIN_S))

    # --- per page ----------------------------------------------------------
    @staticmethod
    def _as_mine(rows: list[LedgerRow], fg: str | None) -> tuple[list[LedgerRow], bool]:
        """The rows with this page's own request as "you" (and whether it is among them)."""
        if fg is None or all(r.request_id != fg for r in rows):
            return rows, False
        return [replace(r, owner="you", kind="") if r.request_id == fg else r for r in rows], True

    def _readout(self, rows: list[LedgerRow], estimated: bool) -> dict[Component, Any]:
        jain = jain_index([r.speedup for r in rows if r.speedup is not None])
        probe = self.ctx.ticks.get("speedup_probe", lambda: speedup_probe_markdown(self.backend.speedup_view()))
        return {
            self.summary: ledger_summary_markdown(rows, jain, estimated),
            self.table: ledger_table_markdown(rows),
            self.probe: probe,
            **self.lens.readout(),
        }

    def refresh_readout(self, fg: str | None) -> dict[Component, Any]:
        tick = self._tick()
        return self._readout(self._as_mine(tick.rows, fg)[0], tick.estimated)

    def refresh(self, fg: str | None, fg_steps: list | None, drawn: dict | None) -> dict[Component, Any]:
        """The readouts every tick; each figure only when what it shows changed since this page
        drew it (``drawn``), and not while this page's own request streams."""
        tick = self._tick()
        rows, mine = self._as_mine(tick.rows, fg)
        shown = self._readout(rows, tick.estimated)
        if streaming(time.monotonic(), fg_steps or []):
            return shown
        drawn = dict(drawn or {})
        keys = {"ledger": (tick.newest_seq, fg if mine else None), "share": tick.share_key}
        if keys["ledger"] != drawn.get("ledger"):
            if not mine:
                build = lambda: plot_data(ledger_figure(rows, tick.estimated))  # noqa: E731
                shown[self.ledger_plot] = self.ctx.ticks.get(("ledger", keys["ledger"]), build)
            else:
                with self.ctx.polls.slot() as free:
                    if free:
                        shown[self.ledger_plot] = plot_data(ledger_figure(rows, tick.estimated))
                    else:  # every slot taken: this page's picture waits for the next tick
                        keys["ledger"] = drawn.get("ledger")
        if keys["share"] != drawn.get("share"):
            shown[self.share_plot] = self.ctx.ticks.get(("share", keys["share"]), self._share_figure)
        lens_shown, keys["lens"] = self.lens.figure(drawn.get("lens"))
        shown |= lens_shown
        if keys != drawn:
            shown[self.drawn] = keys
        return shown
