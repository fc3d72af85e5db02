"""The run panel: prompt and presets, Run/Stop, the token view, the request card, the lossless check.

Contract: ``RunPanel(ctx, presets, max_tokens, temperature)`` (``explorer.panels.context``);
``build_prompt()`` adds the preset dropdown, the prompt box and Run/Stop,
``build_generation()`` the temperature and max-tokens sliders,
``build_outputs()`` the token view, the request card with its two charts, the
lossless check and the request's trace, and this page's state: ``last`` (the
last ``RequestResult``), ``step_times`` ((monotonic t, tokens emitted) per
foreground step, for the live chart) and ``request_id`` (for the auction grid).
``wire()`` connects them. Run streams: the token view updates at every engine
step of the request (``Backend.stream``); on a replay Run plays the recorded
request for the prompt (``Recording.prompt_for``). Stop (/stop, outside the
queue) sets the page's run's stop signal (``RunSlots.stop``): the run closes its
stream at once (vLLM aborts the request) and ends normally with a last update
that says how far it got; a run that finished first keeps its finished view.
Refusals and errors show in the token view, never as exceptions.

API names: /run (prompt, temperature, max tokens) -> (token view, card,
histogram, positions, trace: the recorder's JSON line as a string) streamed; /lossless (temperature) -> (verdict,
text with speculation, text without); /pick (preset label) -> prompt; /stop () -> nothing (stops
the caller's session's run, if one streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import gradio as gr
from gradio.components import Component

from engine_adapter.prompts import Preset
from engine_adapter.records import RequestResult, Step
from engine_adapter.service.backend import ReferenceTwin, SpeedSettings
from engine_adapter.trace.format import request_line
from explorer.components import TokenView
from explorer.panels.context import PageContext
from explorer.panels.pacing import paced
from explorer.views.input_checks import MAX_TOKENS, check_run
from explorer.views.lossless import compare, verdict_markdown
from explorer.views.presets import preset_choices, presets_by_label
from explorer.views.request_card import card_markdown, histogram_figure, position_figure
from explorer.views.token_view import run_tally, token_view_value

Updates = dict[Component, Any]
MIN_UPDATE_S = 0.1  # the token view is redrawn at most this often (explorer/panels/pacing.py)
# and the page is sent at most this many bytes of token view a second: every update re-sends the whole
# view (about 300 bytes a token with its tooltip), so a long run is redrawn less often and the page's
# main thread stays free for Stop on a busy machine (0.1 s up to 50 kB, 0.5 s at 250 kB)
VIEW_BYTES_PER_S = 500_000
SLIDER_MAX_TEMPERATURE = 1.5  # the page's slider; API callers may go up to input_checks.MAX_TEMPERATURE
MAX_FOREGROUND_RUNS = 16  # visitors' runs streaming at once, however started (Run, Shift+Enter, the API)
MAX_CHECKS = 2  # lossless checks running at once (each a request on the speculation-off engine)
STOP_API = "stop"  # Stop's API name (the app's door knows Stop's calls by it: request_limits.StopCall)


class RunPanel:
    def __init__(self, ctx: PageContext, presets: Sequence[Preset], max_tokens: int, temperature: float) -> None:
        self.ctx = ctx
        self.backend = ctx.backend
        self.presets = list(presets)
        self.by_label = presets_by_label(self.presets)
        self.default_max_tokens = max_tokens
        self.default_temperature = temperature

    # --- layout -----------------------------------------------------------------
    def build_prompt(self) -> gr.Textbox:
        self.preset = gr.Dropdown(preset_choices(self.presets), label="Preset (by task)", value=None)
        self.prompt = gr.Textbox(
            label="Prompt",
            lines=5,
            max_lines=20,
            elem_id="prompt",
            placeholder="Type a prompt or pick a preset (Shift+Enter runs it)",
        )
        with gr.Row():
            self.run_btn = gr.Button("Run", variant="primary", elem_id="run")
            self.stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
        return self.prompt

    def build_generation(self) -> None:
        with gr.Accordion("Generation", open=True):
            self.temperature = gr.Slider(
                0.0, SLIDER_MAX_TEMPERATURE, value=self.default_temperature, step=0.05, label="Temperature"
            )
            self.max_tokens = gr.Slider(
                8, MAX_TOKENS, value=self.default_max_tokens, step=8, label="Max tokens", elem_id="max-tokens"
            )

    def build_outputs(self) -> None:
        self.view = TokenView(elem_id="token-view")
        self.card = gr.Markdown(card_markdown(None), elem_id="request-card")
        with gr.Row():
            self.hist = gr.Plot(histogram_figure(None), show_label=False)
            self.pos = gr.Plot(position_figure(None), show_label=False)
        with gr.Accordion(
            "Compare with speculation off: the lossless check, or what a lossy acceptance rule changed", open=False
        ):
            self.check_btn = gr.Button("Run the check", elem_id="lossless")
            self.verdict = gr.Markdown("", elem_id="verdict")
            with gr.Row():
                self.spec_text = gr.Textbox(label="with speculation", lines=8, interactive=False)
                self.plain_text = gr.Textbox(label="speculation off", lines=8, interactive=False)
        with gr.Accordion("This request's trace (the recorder's JSON)", open=False):
            # the JSON as text: a string is cheap for the page's client to copy at every event (a nested
            # value is deep-copied at each status message; docs/benchmarks.md, "UI latency")
            self.trace = gr.Code(language="json", elem_id="trace", show_label=False, interactive=False)
        self.last = gr.State(None)  # this page's last RequestResult
        self.step_times = gr.State([])  # (t, tokens) of this page's foreground steps
        self.request_id = gr.State(None)  # this page's current request id (to find it in the auction grid)

    def wire(self) -> None:
        self.preset.change(self.pick, self.preset, self.prompt, api_name="pick")
        inputs = [self.prompt, self.temperature, self.max_tokens]
        outputs = [self.view, self.card, self.hist, self.pos, self.last, self.step_times, self.trace, self.request_id]
        # no Gradio progress overlay: the token view shows its own cursor from the click on, and the
        # overlay's timers and loading states cost the browser's main thread at every streamed step
        # one concurrency group for every way a run starts, really capped
        runs = dict(show_progress="hidden", concurrency_id="foreground-run", concurrency_limit=MAX_FOREGROUND_RUNS)
        self.run_btn.click(self.run, inputs, outputs, api_name="run", **runs)
        self.prompt.submit(self.run, inputs, outputs, api_name=False, **runs)
        # Stop is the run's own signal, not Gradio's cancel: the run ends normally, its last update
        # (the stopped view) comes after every update it sent before, in order, and the event
        # completes without an error; outside the queue, so a full queue never holds a Stop back
        stop = self.stop_btn.click(self.stop, None, None, api_name=STOP_API, queue=False, show_progress="hidden")
        self.stop_fn = int(stop["id"])  # the page calls it as /run/predict with this fn_index
        self.check_btn.click(
            self.check,
            [self.last, self.temperature],
            [self.verdict, self.spec_text, self.plain_text],
            api_name="lossless",
            concurrency_id="lossless-check",
            concurrency_limit=MAX_CHECKS,
        )

    # --- handlers ----------------------------------------------------------------
    def pick(self, label: str | None) -> str:
        # a single output: skip() leaves the prompt as it is when the dropdown is cleared
        return self.by_label[label].prompt if label in self.by_label else gr.skip()

    async def run(self, text: str, temp: float, n_tokens: float, request: gr.Request) -> AsyncIterator[Updates]:
        # a replay plays the recorded request for this prompt, or the next one (live: the prompt itself)
        text = text if isinstance(text, str) else ""
        if self.backend.recording is not None:
            text = self.backend.recording.prompt_for(text)
        problem = check_run(text, temp, n_tokens) or self._not_ready()
        if problem:
            yield {self.view: token_view_value([], message=problem, level="warn")}
            return
        visitor = self.ctx.visitor(request)
        if refusal := self.ctx.runs.take(visitor):
            yield {self.view: token_view_value([], message=refusal, level="warn")}
            return
        try:
            stop = self.ctx.runs.stop_signal(visitor.session)
            async for updates in self._stream(text, int(n_tokens), float(temp), stop):
                yield updates
        finally:
            self.ctx.runs.give_back(visitor)

    async def stop(self, request: gr.Request) -> None:
        """Stops this page's run, if one streams (a coroutine: the signal is set on the event loop)."""
        self.ctx.runs.stop(self.ctx.visitor(request).session)  # the session's name as run() takes its slot

    def _not_ready(self) -> str | None:
        st = self.backend.status()
        if st.state != "ready":
            if st.progress is not None and st.progress.stage == "measure":
                return f"The engine is measuring this machine ({st.progress.message}); run your prompt when it is done."
            return "The engine is not ready yet: see the status line above."
        return None

    async def _stream(self, text: str, n_tokens: int, temp: float, stop: asyncio.Event) -> AsyncIterator[Updates]:
        steps: list[Step] = []
        times: list[tuple[float, int]] = []
        rid = uuid.uuid4().hex
        sent = 0  # bytes of the token view's markup in the last update
        finished = False

        def interval() -> float:
            return max(MIN_UPDATE_S, sent / VIEW_BYTES_PER_S)

        # at once: the request is on its way; the last request's charts go (this one's come at its end)
        yield {
            self.view: token_view_value([], streaming=True, prompt=text),
            self.hist: histogram_figure(None, running=True),
            self.pos: position_figure(None, running=True),
        }
        try:
            stream = self.backend.stream(text, max_tokens=n_tokens, temperature=temp, request_id=rid)
            # Stop ends paced's reading of the stream, which closes it: vLLM aborts the request. aclosing:
            # a closed page (Gradio closes this generator) closes the stream too
            async with contextlib.aclosing(paced(stream, interval, stop)) as batches:
                async for batch in batches:
                    new = [item for item in batch if isinstance(item, Step)]
                    steps += new
                    times += [(s.t, len(s.emitted)) for s in new]
                    results = [item for item in batch if isinstance(item, RequestResult)]
                    if results:
                        finished = True
                        final = self._finished(results[-1], text, times)
                        # the last tokens first, without the request's two charts (drawing them held the
                        # page for a step), then the whole result: an API caller's last message is complete
                        yield {c: v for c, v in final.items() if c not in (self.hist, self.pos)}
                        yield final
                    elif new:
                        view = token_view_value(steps, streaming=True, prompt=text)
                        sent = len(view["html"])
                        yield {
                            self.view: view,
                            self.card: card_markdown(None, steps),
                            self.step_times: times,
                            self.request_id: rid,
                        }
            if stop.is_set() and not finished:
                yield self._stopped(steps, text, times)
        except Exception as e:  # the page says what went wrong, and keeps what streamed
            what = "The request ended early" if steps else "The engine refused the request"
            message = self.ctx.shown(f"{what}: {e}")
            yield {
                self.view: token_view_value(steps, prompt=text, message=message, level="error"),
                self.step_times: times,
            }

    def _stopped(self, steps: list[Step], text: str, times: list[tuple[float, int]]) -> Updates:
        """The stopped run's last update; ``last`` is cleared, so the lossless check asks for a run
        rather than checking the one before."""
        got = run_tally(sum(len(s.emitted) for s in steps), len(steps))
        closed = "the app closed its request to vLLM, which aborts it"
        return {
            self.view: token_view_value(steps, prompt=text, footer=f"Stopped: {got}; {closed}."),
            self.card: f"**Stopped** after {got}: {closed}, so it has no final numbers.",
            self.step_times: times,
            self.last: None,
        }

    def _settings(self) -> SpeedSettings | None:
        return self.ctx.ticks.get("speed_settings", self.backend.speed_settings)

    def _finished(self, result: RequestResult, text: str, times: list[tuple[float, int]]) -> Updates:
        footer = run_tally(len(result.token_ids), len(result.steps))
        return {
            self.view: token_view_value(result.steps, prompt=text, footer=footer),
            self.card: card_markdown(result, settings=self._settings()),
            self.hist: histogram_figure(result),
            self.pos: position_figure(result),
            self.last: result,
            self.step_times: times,
            self.trace: json.dumps(request_line(result), indent=1, ensure_ascii=False),
            self.request_id: result.request_id,
        }

    async def check(self, result: RequestResult | None, temp: float, request: gr.Request) -> AsyncIterator[Updates]:
        """The same prompt with speculation off (a second engine), compared token for token."""
        if result is None:
            yield {self.verdict: "Run a prompt first; the check repeats it with speculation off."}
            return
        reference = self.backend.reference
        if reference is None:
            yield {
                self.verdict: "✕ This is a replay of a recorded session: there is no engine to run the "
                "speculation-off twin on. The lossless check needs a live engine (python app.py)."
            }
            return
        # a second engine is the presenter's to start on a public page (anyone's on loopback)
        may_start = not self.ctx.exposure.public or self.ctx.refusal(request) is None
        twin = reference.status(may_start)
        if twin.state != "ready" and not may_start:
            note = f" (last: {twin.note})" if twin.note else ""
            yield {
                self.verdict: "✕ The speculation-off engine is not running, and on this public page only the "
                f"presenter may start it: it is a second engine, with a second copy of the target in memory{note}."
            }
            return
        visitor = self.ctx.visitor(request)
        if refusal := self.ctx.runs.take(visitor):
            yield {self.verdict: f"✕ {refusal}"}
            return
        try:
            async for updates in self._check(reference, result, temp, may_start):
                yield updates
        finally:
            self.ctx.runs.give_back(visitor)

    async def _check(
        self, reference: ReferenceTwin, result: RequestResult, temp: float, may_start: bool
    ) -> AsyncIterator[Updates]:
        yield {
            self.verdict: "Running the same prompt with speculation off (the first check starts a second "
            "engine, about half a minute)…",
            self.spec_text: result.text,
            self.plain_text: "",
        }
        plain = None
        try:
            async for item in reference.stream(
                result.prompt, max_tokens=len(result.token_ids), temperature=float(temp), may_start=may_start
            ):
                if isinstance(item, RequestResult):
                    plain = item
        except Exception as e:  # any failure: the page says why the check did not run
            yield {self.verdict: f"The check could not run: {self.ctx.shown(str(e))}"}
            return
        verdict = compare(result, plain, float(temp))
        yield {
            self.verdict: verdict_markdown(verdict, result, plain, self._settings()),
            self.spec_text: result.text,
            self.plain_text: plain.text,
        }
