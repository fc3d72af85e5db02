"""Per-request step streams from a vLLM server: the adapter's primary API.

Contract:
    client = EngineClient(url, tokenizer, tap_addr=...)   # tap_addr None = attach mode
    await client.start()
    async for item in client.generate(prompt, max_tokens=64, temperature=0.0):
        # item is a Step (as the engine executes it) ... then one RequestResult
    await client.close()

``api_key``: the server's (``EngineProcess.api_key``), sent with every request.

With the tap, each Step carries the exact draft ids verified, how many were
accepted, the ids emitted, the K in force and the batch size, as the engine
ran them. Without it (a server we did not start), steps are rebuilt from the
stream's chunks plus vLLM's ``per_step_accepted``/``per_step_drafted``;
rejected drafts are then known only as counts (``drafted`` is None,
``provenance == "counts"``), never guessed.

The completion text always comes from the OpenAI-compatible stream
(``return_token_ids``); the tap's emitted ids are checked against it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import zmq

from engine_adapter.acceptance_rule import AcceptanceRule
from engine_adapter.engine.step_stream import (
    HttpState,
    StreamEnded,
    StreamEvent,
    StreamTokens,
    reconcile_counts,
    steps_from_chunks,
    steps_from_tap,
)
from engine_adapter.engine.tap_receiver import TapReceiver
from engine_adapter.engine.token_text import IncrementalText
from engine_adapter.engine_config import MAX_CATCH_UP_TOKENS, KTable, validate_k_table
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.provenance import metrics_from_steps
from engine_adapter.records import RequestResult, Step
from engine_adapter.vllm_plugin.wire import encode_control

if TYPE_CHECKING:  # transformers loads with the tokenizer, after the engine is spawned
    from transformers import PreTrainedTokenizerBase


class RequestError(RuntimeError):
    """The engine refused or failed a request; the message is the engine's."""


def _connection_message(url: str, e: httpx.HTTPError) -> str:
    """A plain sentence for a request that lost its engine."""
    if isinstance(e, httpx.ConnectError):
        return f"could not reach the engine at {url} (it is not running, or restarting)"
    if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
        return "the engine closed the connection in the middle of the request (it stopped or crashed)"
    if isinstance(e, httpx.TimeoutException):
        return f"the engine did not answer in time ({type(e).__name__})"
    return f"lost the connection to the engine: {e!r}"


class EngineClient:
    def __init__(
        self,
        base_url: str,
        tokenizer: PreTrainedTokenizerBase,
        *,
        tap_addr: str | None = None,
        control_addr: str | None = None,
        model: str | None = None,
        use_chat_template: bool = True,
        k_hint: int = 0,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.model = model
        self.use_chat_template = use_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.k_hint = k_hint  # K to label attach-mode steps until vLLM's counts arrive
        self.tap = TapReceiver(tap_addr) if tap_addr else None
        self._control = None
        self.controls_sent = 0  # compare with EngineStep.controls: applied by the engine
        if control_addr:
            self._control = self.tap.socket(zmq.PUSH) if self.tap else None
            if self._control is not None:
                self._control.setsockopt(zmq.LINGER, 0)
                self._control.setsockopt(zmq.SNDTIMEO, 2000)
                self._control.bind(control_addr)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=600.0),
            limits=httpx.Limits(max_connections=256),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,  # vLLM checks it on /v1/*
        )
        # request id -> (its HTTP state, its wake queue): what fail_all ends
        self._inflight: dict[str, tuple[HttpState, asyncio.Queue]] = {}
        self.last_chunk_t: float | None = None  # monotonic time of the last SSE line from the server (watchdog)

    @property
    def in_flight(self) -> int:
        """Requests of this client now running (foreground and background)."""
        return len(self._inflight)

    def fail_all(self, message: str) -> int:
        """End every in-flight ``generate`` at once with ``RequestError(message)`` (the engine
        died or hung: its streams may never end by themselves). Returns how many."""
        n = 0
        for state, wake in list(self._inflight.values()):
            if not state.done:
                state.error, state.done = message, True
                wake.put_nowait(StreamEnded())
                n += 1
        return n

    async def start(self, handshake_timeout_s: float = 60.0) -> None:
        if self.model is None:
            r = await self._http.get(f"{self.base_url}/v1/models")
            r.raise_for_status()
            self.model = r.json()["data"][0]["id"]
        if self.tap is not None:
            self.tap.start()
            await self._handshake(handshake_timeout_s)

    async def _handshake(self, timeout_s: float) -> None:
        """Run one-token requests until the tap's messages arrive.

        A ZMQ subscriber only receives what is published after its connection
        is up, so provenance is trusted only once a step has come through.
        """
        deadline = time.monotonic() + timeout_s
        body = {"model": self.model, "prompt": "hi", "max_tokens": 1, "temperature": 0.0}
        while time.monotonic() < deadline:
            seen = self.tap.steps_seen
            r = await self._http.post(f"{self.base_url}/v1/completions", json=body)
            if r.status_code != 200:
                raise RequestError(f"the engine answered {r.status_code} to a one-token request: {r.text[:500]}")
            for _ in range(20):
                if self.tap.steps_seen > seen:
                    return
                await asyncio.sleep(0.05)
        raise RequestError(
            f"the scheduler tap sent nothing to {self.tap.addr} within {timeout_s:.0f} s: "
            "was the engine started with the tap (--scheduler-cls engine_adapter.vllm_plugin.schedulers...)?"
        )

    @property
    def live_policies(self) -> bool:
        """True when the engine takes K tables live (started with k_max and the tap)."""
        return self._control is not None

    async def set_k_table(self, table: Any) -> KTable:
        """Replace the engine's batch-size -> K table while it runs (vLLM's rules).

        Takes effect at the engine's next schedule() call; K is capped at the
        engine's num_speculative_tokens (k_max). Raises ValueError for a bad table.
        """
        self._check_live()
        rows = validate_k_table(table)
        await self._send_control({"table": [list(r) for r in rows]})
        return rows

    async def set_k(self, k: int) -> KTable:
        """Fixed K for every batch size (0 = no drafts), live."""
        return await self.set_k_table([[1, 1 << 20, int(k)]])

    async def set_auction(
        self, cost: CostModel, prior: float = 0.5, strength: float = 2.0, allocation: str = "auction"
    ) -> None:
        """The slot auction under ``cost``: drafts of K = k_max, trimmed per request, live;
        ``allocation`` "equal": the number of slots the auction admits, shared alike instead."""
        if allocation not in ("auction", "equal"):
            raise ValueError(f"allocation must be 'auction' or 'equal'; got {allocation!r}")
        # with its measured cells: the auction prices a measured (b, K) as measured
        auction = {"cost": cost.to_dict(), "prior": prior, "strength": strength, "allocation": allocation}
        await self._send_control({"auction": auction})

    async def set_catch_up_tokens(self, tokens: int) -> None:
        """The idle drafter's catch-up budget, live: the most tokens per step its draft model
        re-runs for requests with a hole (0 = none: such a request drafts across its hole)."""
        self._check_live()
        if not 0 <= int(tokens) <= MAX_CATCH_UP_TOKENS:
            raise ValueError(f"catch-up tokens must be between 0 and {MAX_CATCH_UP_TOKENS}; got {tokens}")
        await self._send_control({"catch_up": int(tokens)})

    async def set_acceptance(self, rule: AcceptanceRule) -> None:
        """The acceptance rule, engine-wide, from the engine's next step on (``acceptance_rule.py``);
        ``controls_sent`` counts it, and each step's ``rule`` says which rule verified it."""
        rule.check()
        await self._send_control({"acceptance": rule.to_dict()})

    def _check_live(self) -> None:
        if self._control is None:
            raise RuntimeError("this engine was not started for live K policies (EngineConfig.k_max)")

    async def _send_control(self, msg: dict[str, Any]) -> None:
        """One command on the control channel; ``controls_sent`` counts it (the tap acknowledges)."""
        self._check_live()
        await self._control.send(encode_control(msg))
        self.controls_sent += 1

    async def close(self) -> None:
        if self._control is not None:
            self._control.close(0)
        await self._http.aclose()
        if self.tap is not None:
            await self.tap.close()

    def render_prompt(self, prompt: str) -> str:
        if not self.use_chat_template:
            return prompt
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )

    async def _stream_http(self, body: dict[str, Any], state: HttpState, wake: asyncio.Queue) -> None:
        try:
            async with self._http.stream("POST", f"{self.base_url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    try:
                        msg = json.loads(text).get("error", {}).get("message", text)
                    except (json.JSONDecodeError, AttributeError):
                        msg = text
                    state.error = f"engine answered {r.status_code}: {msg}"
                    return
                async for line in r.aiter_lines():
                    self.last_chunk_t = time.monotonic()  # the server is alive, however slow /health is
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    data = json.loads(line[6:])
                    if "error" in data:
                        state.error = str(data["error"].get("message", data["error"]))
                        return
                    for choice in data.get("choices", []):
                        ids = choice.get("token_ids") or []
                        if ids:
                            state.t_first = state.t_first or time.monotonic()
                            state.chunks.append(list(ids))
                            wake.put_nowait(StreamTokens(list(ids)))
                        if choice.get("finish_reason"):
                            state.finish_reason = choice["finish_reason"]
                    if data.get("usage"):
                        state.num_prompt_tokens = data["usage"].get("prompt_tokens", 0)
                    if data.get("metrics"):
                        state.metrics = data["metrics"].get("speculative_decoding")
        except httpx.HTTPError as e:
            state.error = state.error or _connection_message(self.base_url, e)
        finally:
            state.done = True
            wake.put_nowait(StreamEnded())

    async def generate(
        self,
        prompt: str,
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int | None = None,
        request_id: str | None = None,
        ignore_eos: bool = False,
        watched: bool = False,
    ) -> AsyncIterator[Step | RequestResult]:
        """Yield each Step as the engine runs it, then the RequestResult.

        ``watched``: a reader is watching this request (the page's own): in each engine step its
        row is handled before the background load's (``TapReceiver.register``).

        ``ignore_eos`` (vLLM's sampling parameter) keeps a request going to
        ``max_tokens``: profiling needs full batches, not early stops.
        """
        rid = request_id or uuid.uuid4().hex
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": self.render_prompt(prompt),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "request_id": rid,
        }
        if seed is not None:
            body["seed"] = seed
        if ignore_eos:
            body["ignore_eos"] = True
        state = HttpState()
        wake: asyncio.Queue[StreamEvent] = self.tap.register(rid, watched) if self.tap else asyncio.Queue()
        self._inflight[rid] = (state, wake)
        t_start = time.monotonic()
        task = asyncio.create_task(self._stream_http(body, state, wake))
        text = IncrementalText(self.tokenizer)
        steps: list[Step] = []
        try:
            if self.tap is not None:
                live = steps_from_tap(self.tokenizer, wake, state, text)
            else:
                live = steps_from_chunks(self.tokenizer, self.k_hint, wake, text)
            async for step in live:
                steps.append(step)
                yield step
            if state.error is None:  # after fail_all the stream may hang: do not wait for it
                await task
        finally:
            self._inflight.pop(rid, None)
            if not task.done():
                task.cancel()  # the consumer went away: abort the request
            if self.tap:
                self.tap.unregister(rid)
        if state.error:
            raise RequestError(state.error)
        provenance = "tap" if self.tap is not None else "counts"
        if self.tap is None:
            steps = reconcile_counts(self.tokenizer, state, steps)
        token_ids = [i for s in steps for i in s.emitted]
        http_ids = [i for c in state.chunks for i in c]
        if token_ids != http_ids:
            raise RequestError(
                f"provenance mismatch for request {rid}: the tap saw {len(token_ids)} tokens, "
                f"the stream {len(http_ids)} (tap messages lost?)"
            )
        k_max = state.metrics["num_spec_tokens"] if state.metrics else max((s.k for s in steps), default=0)
        tap_metrics = (
            metrics_from_steps([(s.num_drafted, s.accepted) for s in steps], k_max)
            if state.metrics is not None
            else None
        )
        yield RequestResult(
            request_id=rid,
            prompt=prompt,
            text="".join(tok.text for s in steps for tok in s.tokens),
            token_ids=token_ids,
            kinds=[tok.kind for s in steps for tok in s.tokens],  # type: ignore[misc]
            steps=steps,
            provenance=provenance,
            spec_decode_metrics=state.metrics,
            tap_metrics=tap_metrics,
            finish_reason=state.finish_reason,
            num_prompt_tokens=state.num_prompt_tokens,
            t_start=t_start,
            t_first_token=state.t_first,
            t_end=time.monotonic(),
        )
