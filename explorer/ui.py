"""The explorer page (Gradio 6): prompt in, provenance-coloured tokens out, live.

Contract: ``build_ui(service, presets, defaults)`` returns a ``gr.Blocks``.
It reads only engine-neutral records from ``EngineService``; it never parses
vLLM's wire format. Handlers are async and stream: the token view updates at
every engine step of the foreground request.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr

from engine_adapter.engine_config import EngineConfig, available_methods
from engine_adapter.records import RequestResult, Step
from engine_adapter.service import EngineService
from explorer.presets import Preset, preset_choices
from explorer.request_card import card_markdown, histogram_figure, position_figure
from explorer.token_view import TokenView, token_view_value

MAX_PROMPT_CHARS = 8000

METHOD_LABELS = {"off": "off (no speculation)", "ngram": "ngram (prompt lookup)",
                 "draft": "draft model", "suffix": "suffix tree"}


@dataclass(frozen=True)
class UiDefaults:
    config: EngineConfig
    max_tokens: int = 128
    temperature: float = 0.0


def status_markdown(service: EngineService) -> str:
    st = service.status()
    cfg = st.config
    what = "attached server" if st.attached else (
        f"method **{cfg.method}**, K={cfg.k}" + (f", K table {cfg.k_table}" if cfg and cfg.k_table else "")
        if cfg else "")
    if st.state == "ready":
        return f"🟢 Engine ready ({what}) at `{st.url}`."
    if st.state == "starting":
        p = st.progress
        frac = p.fraction if p else 0.0
        bar = "█" * int(frac * 20) + "░" * (20 - int(frac * 20))
        return f"🟡 Engine starting ({what}): `{bar}` {frac:.0%} — {p.message if p else ''}"
    if st.state == "failed":
        return f"🔴 Engine failed to start: {st.error}"
    return f"⚪ Engine {st.state}."


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
                with gr.Accordion("Generation", open=True):
                    temperature = gr.Slider(0.0, 1.5, value=defaults.temperature, step=0.05, label="Temperature")
                    max_tokens = gr.Slider(8, 1024, value=defaults.max_tokens, step=8, label="Max tokens")
                with gr.Accordion("Engine (restarts the engine)", open=True):
                    method = gr.Radio([(METHOD_LABELS[m], m) for m in methods], value=defaults.config.method,
                                      label="Speculation method", elem_id="method")
                    k = gr.Slider(1, 8, value=defaults.config.k, step=1, label="K (num_speculative_tokens)")
                    apply_btn = gr.Button("Apply engine settings", elem_id="apply")
            with gr.Column(scale=3, min_width=420):
                view = TokenView(elem_id="token-view")
                card = gr.Markdown(card_markdown(None), elem_id="request-card")
                with gr.Row():
                    hist = gr.Plot(histogram_figure(None), show_label=False)
                    pos = gr.Plot(position_figure(None), show_label=False)

        def pick(label: str | None) -> str:
            return by_label[label].prompt if label in by_label else gr.skip()

        preset.change(pick, preset, prompt)

        async def run(text: str, temp: float, n_tokens: int):
            text = text or ""
            if not text.strip():
                yield token_view_value([], message="Type a prompt (or pick a preset) first.", level="warn"), \
                    gr.skip(), gr.skip(), gr.skip()
                return
            if len(text) > MAX_PROMPT_CHARS:
                yield token_view_value([], message=f"The prompt is {len(text)} characters long; the limit here "
                                       f"is {MAX_PROMPT_CHARS}. Shorten it and run again.", level="warn"), \
                    gr.skip(), gr.skip(), gr.skip()
                return
            if service.status().state != "ready":
                yield token_view_value([], message="The engine is not ready yet: see the status line above.",
                                       level="warn"), gr.skip(), gr.skip(), gr.skip()
                return
            steps: list[Step] = []
            try:
                async for item in service.stream(text, max_tokens=int(n_tokens), temperature=float(temp)):
                    if isinstance(item, Step):
                        steps.append(item)
                        yield token_view_value(steps, streaming=True), card_markdown(None, steps), \
                            gr.skip(), gr.skip()
                    elif isinstance(item, RequestResult):
                        yield token_view_value(item.steps, footer=f"{len(item.token_ids)} tokens, "
                                               f"{len(item.steps)} engine steps"), \
                            card_markdown(item), histogram_figure(item), position_figure(item)
            except Exception as e:  # the page says what went wrong, and keeps what streamed
                yield token_view_value(steps, message=f"The request ended early: {e}", level="error"), \
                    gr.skip(), gr.skip(), gr.skip()

        run_event = run_btn.click(run, [prompt, temperature, max_tokens], [view, card, hist, pos])
        prompt.submit(run, [prompt, temperature, max_tokens], [view, card, hist, pos])
        stop_btn.click(None, None, None, cancels=[run_event])

        async def apply(m: str, k_value: float) -> str:
            cfg = replace(defaults.config, method=m, k=int(k_value))
            try:
                cfg.validate()
            except ValueError as e:
                return f"🔴 {e}"
            service.start(cfg)  # returns at once; the status line shows progress
            return status_markdown(service)

        apply_btn.click(apply, [method, k], status)
        gr.Timer(1.0).tick(lambda: status_markdown(service), None, status)
    return demo
