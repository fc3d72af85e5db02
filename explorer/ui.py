"""The explorer page (Gradio 6): prompt in, provenance-coloured tokens out, live.

Contract: ``build_ui(service, presets, defaults)`` returns a ``gr.Blocks``.
It reads only engine-neutral records from ``EngineService``; it never parses
vLLM's wire format. Handlers are async and stream: the token view updates at
every engine step of the foreground request.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import gradio as gr

from engine_adapter.engine_config import EngineConfig, available_methods
from engine_adapter.trace.format import request_line
from engine_adapter.records import RequestResult, Step
from engine_adapter.service.engine_service import EngineService
from explorer.chart_export import add_csv_export
from explorer.live_charts import bin_prom, bin_steps, foreground_rate, live_figure
from explorer.input_checks import MAX_TOKENS, check_run
from explorer.lossless import compare
from explorer.policy_panel import build_policy_panel
from explorer.presenter import Presenter, build_presenter_box
from explorer.presets import Preset, preset_choices
from explorer.replay_panel import add_replay_panel, replay_status_markdown
from explorer.sweep_view import build_sweep_panel
from explorer.request_card import card_markdown, histogram_figure, position_figure
from explorer.token_view import TokenView, token_view_value

MAX_BACKGROUND = 64
EXPLAIN = (Path(__file__).resolve().parent.parent / "assets" / "explain.md").read_text()
SWEEP_DIR = Path(__file__).resolve().parent.parent / "docs" / "sweeps"  # sweeps shipped with the explorer

METHOD_LABELS = {"off": "off (no speculation)", "ngram": "ngram (prompt lookup)",
                 "draft": "draft model", "suffix": "suffix tree"}


@dataclass(frozen=True)
class UiDefaults:
    config: EngineConfig
    presenter: Presenter = Presenter()
    max_tokens: int = 128
    temperature: float = 0.0


def status_markdown(service: EngineService) -> str:
    # --- replay (app.py --replay): a recorded session, no engine; see explorer/replay_panel.py
    if getattr(service, "replay_info", None) is not None:
        return replay_status_markdown(service.replay_info)
    st = service.status()
    cfg = st.config
    what = "attached server" if st.attached else (
        f"method **{cfg.method}**, K={cfg.k}" + (f", K table {cfg.k_table}" if cfg and cfg.k_table else "")
        if cfg else "")
    if st.state == "ready":
        profiling = service.policy_view().profiling
        if profiling:  # K is switched while it runs: say so where everyone looks
            return (f"● **Engine ready** ({what}) at `{st.url}`. ◐ Measuring the cost model for K policies: "
                    f"{profiling}. Requests run meanwhile, under the K being measured.")
        fault = getattr(st, "fault", None)  # the watchdog brought it back (engine_adapter/watchdog.py)
        return f"● **Engine ready** ({what}) at `{st.url}`." + (f" Restarted by itself after: {fault}." if fault else "")
    if st.state == "starting":
        p = st.progress
        frac = p.fraction if p else 0.0
        bar = "█" * int(frac * 20) + "░" * (20 - int(frac * 20))
        if getattr(st, "fault", None):
            return (f"◐ **Engine restarting after a fault** ({what}): `{bar}` {frac:.0%} — "
                    f"{p.message if p else ''}. Cause: {st.fault}")
        return f"◐ **Engine starting** ({what}): `{bar}` {frac:.0%} — {p.message if p else ''}"
    if st.state == "restarting":  # dead or hung; requests in flight ended with this message
        return f"⚠ **Engine down, restarting:** {st.error}"
    if st.state == "failed":
        return f"✕ **Engine {'down' if getattr(st, 'fault', None) else 'failed to start'}:** {st.error}"
    return f"○ Engine {st.state}."


def build_ui(service: EngineService, presets: list[Preset], defaults: UiDefaults) -> gr.Blocks:
    by_label = {p.label: p for p in presets}
    methods = available_methods()

    with gr.Blocks(title="Speculative decoding explorer") as demo:
        gr.Markdown("# Speculative decoding explorer\nEvery token below is coloured by where it came "
                    "from, as the live vLLM engine ran it.")
        status = gr.Markdown(status_markdown(service), elem_id="engine-status")
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                preset = gr.Dropdown(preset_choices(presets), label="Preset (by task)", value=None)
                prompt = gr.Textbox(label="Prompt", lines=5, max_lines=20, elem_id="prompt",
                                    placeholder="Type a prompt or pick a preset")
                with gr.Row():
                    run_btn = gr.Button("Run", variant="primary", elem_id="run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                add_replay_panel(service, prompt)  # replay only: what Run does, the recorded requests
                with gr.Accordion("Generation", open=True):
                    temperature = gr.Slider(0.0, 1.5, value=defaults.temperature, step=0.05, label="Temperature")
                    max_tokens = gr.Slider(8, MAX_TOKENS, value=defaults.max_tokens, step=8, label="Max tokens")
                with gr.Accordion("Engine (restarts the engine)", open=True):
                    unlocked = build_presenter_box(defaults.presenter)
                    method = gr.Radio([(METHOD_LABELS[m], m) for m in methods], value=defaults.config.method,
                                      label="Speculation method", elem_id="method")
                    k = gr.Slider(1, 8, value=defaults.config.k, step=1, label="K (num_speculative_tokens)")
                    apply_btn = gr.Button("Apply engine settings", elem_id="apply")
                with gr.Accordion("Background load", open=True):
                    load = gr.Slider(0, MAX_BACKGROUND, value=0, step=1, elem_id="load",
                                     label="Concurrent background requests (closed loop, preset prompts)")
                    load_readout = gr.Markdown("No background load.", elem_id="load-readout")
            with gr.Column(scale=3, min_width=420):
                view = TokenView(elem_id="token-view")
                card = gr.Markdown(card_markdown(None), elem_id="request-card")
                with gr.Row():
                    hist = gr.Plot(histogram_figure(None), show_label=False)
                    pos = gr.Plot(position_figure(None), show_label=False)
                with gr.Accordion("Lossless check: the same prompt with speculation off", open=False):
                    check_btn = gr.Button("Run the check", elem_id="lossless")
                    verdict = gr.Markdown("", elem_id="verdict")
                    with gr.Row():
                        spec_text = gr.Textbox(label="with speculation", lines=8, interactive=False)
                        plain_text = gr.Textbox(label="speculation off", lines=8, interactive=False)
                with gr.Accordion("This request's trace (the recorder's JSON)", open=False):
                    trace = gr.JSON(elem_id="trace", show_label=False)
        gr.Markdown("## Live engine (whole server, last 3 minutes)")
        live = gr.Plot(live_figure(bin_steps([], 0.0)), show_label=False, elem_id="live-charts")
        add_csv_export(service)  # the chart's data as CSV (live and replay)
        with gr.Accordion("Why does this happen?", open=False):
            gr.Markdown(EXPLAIN)
        last = gr.State(None)  # this page's last RequestResult
        fg_steps = gr.State([])  # (t, tokens) of this page's foreground steps
        fg_id = gr.State(None)  # this page's current request id (to find it in the auction grid)
        build_policy_panel(demo, service, fg_id, defaults.config.k_max or defaults.config.k, unlocked, defaults.presenter)
        build_sweep_panel(SWEEP_DIR)

        def pick(label: str | None) -> str:
            return by_label[label].prompt if label in by_label else gr.skip()

        preset.change(pick, preset, prompt)

        def refuse(message: str):
            return token_view_value([], message=message, level="warn"), gr.skip(), gr.skip(), gr.skip(), \
                gr.skip(), gr.skip(), gr.skip(), gr.skip()

        async def run(text: str, temp: float, n_tokens: int):
            text = text or ""
            # --- replay: Run plays the recorded request for this prompt, or the next one
            if getattr(service, "replay_info", None) is not None:
                text = service.replay_prompt(text)
            if problem := check_run(text, temp, n_tokens):
                yield refuse(problem)
                return
            if service.status().state != "ready":
                yield refuse("The engine is not ready yet: see the status line above.")
                return
            steps: list[Step] = []
            times: list[tuple[float, int]] = []
            rid = uuid.uuid4().hex
            try:
                async for item in service.stream(text, max_tokens=int(n_tokens), temperature=float(temp),
                                                 request_id=rid):
                    if isinstance(item, Step):
                        steps.append(item)
                        times.append((item.t, len(item.emitted)))
                        yield token_view_value(steps, streaming=True, prompt=text), card_markdown(None, steps), \
                            gr.skip(), gr.skip(), gr.skip(), times, gr.skip(), rid
                    elif isinstance(item, RequestResult):
                        yield token_view_value(item.steps, prompt=text, footer=f"{len(item.token_ids)} tokens, "
                                               f"{len(item.steps)} engine steps"), \
                            card_markdown(item), histogram_figure(item), position_figure(item), item, times, \
                            request_line(item), item.request_id
            except Exception as e:  # the page says what went wrong, and keeps what streamed
                what = "The request ended early" if steps else "The engine refused the request"
                yield token_view_value(steps, prompt=text, message=f"{what}: {e}",
                                       level="error"), \
                    gr.skip(), gr.skip(), gr.skip(), gr.skip(), times, gr.skip(), gr.skip()

        run_outputs = [view, card, hist, pos, last, fg_steps, trace, fg_id]
        run_event = run_btn.click(run, [prompt, temperature, max_tokens], run_outputs, api_name="run")
        prompt.submit(run, [prompt, temperature, max_tokens], run_outputs, api_name=False)
        stop_btn.click(None, None, None, cancels=[run_event])

        async def apply(m: str, k_value: float, may: bool) -> str:
            if refusal := defaults.presenter.refusal(may):
                return refusal
            cfg = replace(defaults.config, method=m, k=int(k_value))
            if cfg.k_max is not None:  # live policies stay on, with room for the chosen K
                cfg.k_max = max(cfg.k_max, cfg.k)
            try:
                cfg.validate()
            except ValueError as e:
                return f"✕ {e}"
            service.start(cfg)  # returns at once; the status line shows progress
            return status_markdown(service)

        apply_btn.click(apply, [method, k, unlocked], status, api_name="apply")

        async def check(result: RequestResult | None, temp: float):
            if result is None:
                yield "Run a prompt first; the check repeats it with speculation off.", gr.skip(), gr.skip()
                return
            yield ("Running the same prompt with speculation off (the first check starts a second engine, "
                   "about half a minute)…"), result.text, ""
            plain = None
            try:
                async for item in service.stream(result.prompt, max_tokens=len(result.token_ids),
                                                 temperature=float(temp), reference=True):
                    if isinstance(item, RequestResult):
                        plain = item
            except Exception as e:
                yield f"The check could not run: {e}", gr.skip(), gr.skip()
                return
            v = compare(result, plain, float(temp))
            speed = (f" Speed: {result.tokens_per_second:.2f} tokens/s with speculation, "
                     f"{plain.tokens_per_second:.2f} without: **{v.speedup:.2f}x**." if v.speedup else "")
            yield f"**{'✓' if v.identical else '≠'} {v.message}**{speed}", result.text, plain.text

        check_btn.click(check, [last, temperature], [verdict, spec_text, plain_text], api_name="lossless")

        async def set_load(n: float, request: gr.Request) -> str:
            if service.status().state != "ready":
                return "The engine is not ready; the load starts once it is."
            try:
                n = float(n)
            except (TypeError, ValueError):
                return f"✕ The load must be a number of requests between 0 and {MAX_BACKGROUND}; got {n!r}."
            if not 0 <= n <= MAX_BACKGROUND or not n.is_integer():
                note = f"✕ {n:g} is not a whole number between 0 and {MAX_BACKGROUND}: nothing changed. "
                return note + load_text(request.session_hash)
            await service.set_background(int(n), session=request.session_hash)
            return load_text(request.session_hash)

        def load_text(session: str) -> str:
            st = service.background_stats()
            share = service.background_share(session)
            last_step = service.steps_since(time.monotonic() - 2.0)
            running = max((s.batch_size for s in last_step), default=0)
            if service.status().attached and service.prom_history():
                running = int(service.prom_history()[-1].running)
            engine = f"Requests running in the engine: **{running}**."
            if service.policy_view().profiling:  # its requests are in that count
                engine += " The cost model is being measured meanwhile: its requests count here too."
            if st is None or (share.total == 0 and st.in_flight == 0):
                return f"No background load. {engine}"
            mine = (f"Your background load: **{share.asked}** requested, **{share.granted}** granted"
                    if share.asked else "You ask for no background load")
            shared = (f" (the cap of {share.cap} is shared by {share.sessions} session"
                      f"{'s' if share.sessions != 1 else ''})")
            err = f" Last error: {st.last_error}" if st.last_error else ""
            return (f"{mine}{shared}. All sessions: **{st.in_flight}** in flight, {st.completed} done, "
                    f"{st.failed} failed; **{service.background_tokens_per_second():.1f} tokens/s**. "
                    f"{engine}{err}")

        # change (not release) so a typed number counts too; always_last coalesces a drag
        load.change(set_load, load, load_readout, api_name="set_load", trigger_mode="always_last")

        def refresh(times: list[tuple[float, int]], request: gr.Request):
            service.touch_session(request.session_hash)  # a page that stops polling loses its load
            now = time.monotonic()
            if service.status().attached:  # no tap: server-wide counters from /metrics
                df = bin_prom(service.prom_history(), now)
            else:
                df = bin_steps(service.steps_since(now - 180.0), now)
            markers = [(t - now, n) for t, n in service.load_changes]
            return live_figure(df, markers, foreground_rate(times or [], now)), load_text(request.session_hash)

        gr.Timer(1.0).tick(refresh, fg_steps, [live, load_readout], api_name="live", show_progress="hidden")
        gr.Timer(1.0).tick(lambda: status_markdown(service), None, status, api_name="status",
                           show_progress="hidden")
        # a closed tab or a reload ends the session: its background load stops
        def leave(request: gr.Request) -> None:
            service.release_background(request.session_hash)

        demo.unload(leave)
    return demo
