"""The explorer page (Gradio 6): prompt in, provenance-coloured tokens out, live.

Contract: ``build_page(backend, presets, defaults)`` returns an ``ExplorerPage``: the
``gr.Blocks`` page, laid out from the panels in ``explorer.panels``, and the routes the HTTP
door answers itself (``explorer.request_limits``: the status line every page fetches each
second). ``PageDefaults`` holds
the engine config the page starts from (what "Apply engine settings" changes),
the presenter lock, how the page is reached (``Exposure``: public or not, behind a
Space's proxy), the ``--record`` status and the generation sliders' start values.
``launch_page(page, host, port, exposure)`` queues and launches it with the bounds a public
page needs (``QUEUE_SIZE``, ``MAX_UPLOAD``, ``SESSION_CAPACITY``, Gradio's file cache cleaned,
per-visitor rates, idle sessions' states forgotten: ``explorer.session_expiry``). One timer (API
/charts, every ``CHART_REFRESH_S``) refreshes the load
panel's live chart and readout, the K-policy panel and the ledger together, sent by the page between two
steps of its own request (``assets/chart_gate.js``). It reads only what the ``Backend``
(``engine_adapter.service.backend``) returns; it never parses vLLM's wire format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from engine_adapter.engine_config import EngineConfig
from engine_adapter.package_data import data_path, sweeps_dir
from engine_adapter.prompts import Preset
from engine_adapter.service.backend import Backend, RecordingStatus
from explorer.panels.acceptance import build_acceptance_panel
from explorer.panels.context import PageContext
from explorer.panels.engine import TOP_LINES_PATH, EnginePanel
from explorer.panels.export import build_csv_export
from explorer.panels.ledger import LedgerPanel
from explorer.panels.load import LIVE_CHART_PATH, LoadPanel
from explorer.panels.policy import PolicyPanel, build_policy_panel
from explorer.panels.presenter import Presenter
from explorer.panels.replay import build_replay_panel
from explorer.panels.run import STOP_API, RunPanel
from explorer.panels.sweep import build_sweep_panel
from explorer.panels.visitors import Exposure
from explorer.request_limits import StopCall, VisitorGate
from explorer.session_expiry import IdleSessionExpiry
from explorer.views.live_charts import CHART_REFRESH_S

TITLE = "Speculative decoding explorer"
INTRO = f"# {TITLE}\nEvery token below is coloured by where it came from, as the live vLLM engine ran it."


QUEUE_SIZE = 64  # events waiting in Gradio's queue, all visitors together; more are told the app is busy
# sessions whose state Gradio keeps (its default 10,000): each holds a copy of the page's whole config, and a
# script can make sessions freely; the least recently used go first (an open page uses its own every 2 s), and
# those idle for SESSION_IDLE_S go anyway (explorer.session_expiry)
SESSION_CAPACITY = 1000
MAX_UPLOAD = "1mb"  # the largest file a visitor may upload (a sweep CSV; the shipped ones are 1-6 KB)
# Gradio's copies of files sent and received (uploads, CSV exports): every hour, those over an hour old go
FILE_CACHE_CLEANUP = (3600, 3600)


@dataclass(frozen=True)
class ExplorerPage:
    blocks: gr.Blocks
    routes: dict[str, Callable[[], Any]]  # path -> what the HTTP door answers there (JSON), without Gradio
    stop: StopCall | None = None  # the page's Stop (the door bounds it as a Stop, not a poll)


@dataclass(frozen=True)
class PageDefaults:
    config: EngineConfig
    presenter: Presenter = field(default_factory=Presenter)
    exposure: Exposure = field(default_factory=Exposure)
    recording: Callable[[], RecordingStatus | None] | None = None
    max_tokens: int = 128
    temperature: float = 0.0


def build_page(backend: Backend, presets: Sequence[Preset], defaults: PageDefaults) -> ExplorerPage:
    ctx = PageContext(backend, defaults.presenter, defaults.exposure, defaults.recording)
    engine = EnginePanel(ctx, defaults.config)
    run = RunPanel(ctx, presets, defaults.max_tokens, defaults.temperature)
    load = LoadPanel(ctx)
    with gr.Blocks(title=TITLE, delete_cache=FILE_CACHE_CLEANUP) as page:
        gr.Markdown(INTRO)
        engine.build_status()
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                prompt = run.build_prompt()
                build_replay_panel(backend, prompt)  # replay only: what Run does, the recorded requests
                run.build_generation()
                engine.build_settings()
                load.build_controls()
            with gr.Column(scale=3, min_width=420):
                run.build_outputs()
        load.build_chart()
        build_csv_export(backend)  # the chart's data as CSV (live and replay)
        with gr.Accordion("Why does this happen?", open=False):
            gr.Markdown(data_path("assets", "explain.md").read_text())
        k_max = defaults.config.k_max or defaults.config.k
        policy = build_policy_panel(page, ctx, k_max)
        ledger = LedgerPanel(ctx)
        ledger.build()
        ledger.wire()
        build_acceptance_panel(ctx)
        build_sweep_panel(sweeps_dir())
        run.wire()
        engine.wire()
        load.wire(page)
        wire_chart_timer(load, policy, ledger, run)
    routes = {TOP_LINES_PATH: engine.top_lines, LIVE_CHART_PATH: load.chart_update}
    return ExplorerPage(page, routes, StopCall(STOP_API, run.stop_fn))


def launch_page(page: ExplorerPage, host: str, port: int, exposure: Exposure) -> None:
    """Queue and serve the page until the server stops (blocks), each visitor's request rate
    bounded at the door (``explorer.request_limits``)."""
    # api_open=False: a queued event answers only through the queue (Gradio's /run route would run it
    # outside the queue, unbounded); the page's own plain requests (queue=False) stay as they are.
    # run_history=False: Gradio 6.31 otherwise keeps every visitor's runs, prompts and outputs, in the
    # browser's localStorage (shown at /gradio_api/runs: on a shared workshop laptop, to the next
    # person), and re-reads and re-writes that whole history at every streamed step: at background
    # load 64 a third of the page's work between a step's arrival and its tokens (docs/benchmarks.md)
    gate = Middleware(VisitorGate, exposure=exposure, routes=page.routes, stop=page.stop)
    expiry = Middleware(IdleSessionExpiry)
    page.blocks.queue(max_size=QUEUE_SIZE, default_concurrency_limit=4, api_open=False).launch(
        server_name=host,
        server_port=port,
        run_history=False,
        max_file_size=MAX_UPLOAD,
        state_session_capacity=SESSION_CAPACITY,
        app_kwargs={"middleware": [gate, expiry]},
    )


def wire_chart_timer(load: LoadPanel, policy: PolicyPanel, ledger: LedgerPanel, run: RunPanel) -> None:
    """One timer for the load readout, the K-policy panel and the ledger (the live chart draws itself:
    ``assets/live_chart.js``), a plain request (queue=False): each event
    costs the page's main thread at each of its messages (Gradio updates the loading state of every
    component), and the token view waits (docs/benchmarks.md, "UI latency"). A gate in the page
    (``assets/chart_gate.js``) sends each tick between two steps of the page's own request and says
    in a hidden flag whether charts may be redrawn in its answer; the readouts are updated either way."""
    may_draw = gr.Checkbox(True, visible=False, elem_id="chart-gate", label="redraw charts")

    def refresh(
        times: list,
        request_id: str | None,
        policy_drawn: Any,
        ledger_drawn: Any,
        draw: bool,
        request: gr.Request,
    ) -> dict:
        if draw is False:
            return {**load.refresh_readout(request), **policy.refresh_readout(), **ledger.refresh_readout(request_id)}
        return {
            **load.refresh_readout(request),
            **policy.refresh(request_id, times, policy_drawn),
            **ledger.refresh(request_id, times, ledger_drawn),
        }

    inputs = [run.step_times, run.request_id, policy.drawn, ledger.drawn, may_draw]
    gate_js = data_path("assets", "chart_gate.js").read_text().replace("__N_INPUTS__", str(len(inputs)))
    gr.Timer(CHART_REFRESH_S).tick(
        refresh,
        inputs,
        [*load.tick_outputs, *policy.tick_outputs, *ledger.tick_outputs],
        js=gate_js,
        api_name="charts",
        show_progress="hidden",
        queue=False,
    )
