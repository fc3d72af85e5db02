"""Closed-loop load: N requests always in flight, bounded in count and time.

Contract:
- ``run_prompts(client, prompts, concurrency, ...)`` runs every prompt once
  with ``concurrency`` requests in flight (like ``vllm bench serve
  --max-concurrency N``) and returns the results in prompt order.
- ``BackgroundLoad(client, prompts, ...)`` keeps ``set_concurrency(n)``
  requests in flight, cycling through the prompts (texts, or presets whose task kind each
  request's id then names: ``records.load_request_id``; ``set_prompts`` changes them for the
  next requests), until ``stop()``; lowering N
  cancels the extra requests at once (vLLM aborts a request whose stream is
  closed), and a worker that ended is replaced at the next ``set_concurrency``.
  A measurement bounds it with ``max_requests`` and ``max_seconds`` (none by
  default: a service's load lives as long as its engine and is bounded per
  session, ``service.fair_share``); once one runs out the load stays stopped
  and ``stats().stopped`` says which. ``clock`` is injectable for tests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from engine_adapter.engine.client import EngineClient
from engine_adapter.prompts import Preset
from engine_adapter.records import RequestResult, Step, load_request_id
from engine_adapter.service.fair_share import MAX_BACKGROUND


def _cycle(prompts: Sequence[str | Preset]) -> Iterator[Preset]:
    """The prompts over and over, task kinds taking turns (a load of six runs six kinds)."""
    by_kind: dict[str, list[Preset]] = {}
    for p in prompts:
        preset = p if isinstance(p, Preset) else Preset("", "", p)
        by_kind.setdefault(preset.category, []).append(preset)
    turns = itertools.zip_longest(*by_kind.values())
    return itertools.cycle([p for turn in turns for p in turn if p is not None])


async def _run_one(
    client: EngineClient,
    prompt: str,
    max_tokens: int,
    temperature: float,
    on_step: Callable[[Step], None] | None = None,
    request_id: str | None = None,
) -> RequestResult:
    result = None
    # aclosing: a cancelled task closes the stream (and vLLM aborts the request) at
    # once, not whenever the abandoned generator happens to be collected
    stream = client.generate(prompt, max_tokens=max_tokens, temperature=temperature, request_id=request_id)
    async with contextlib.aclosing(stream) as items:
        async for item in items:
            if isinstance(item, RequestResult):
                result = item
            elif on_step is not None:
                on_step(item)
    assert result is not None
    return result


async def run_prompts(
    client: EngineClient,
    prompts: Sequence[str],
    concurrency: int,
    *,
    max_tokens: int,
    temperature: float = 0.0,
    on_result: Callable[[int, RequestResult], None] | None = None,
) -> list[RequestResult]:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    results: list[RequestResult | None] = [None] * len(prompts)
    todo = iter(range(len(prompts)))

    async def worker() -> None:
        for i in todo:  # a shared iterator: each prompt is taken once
            results[i] = await _run_one(client, prompts[i], max_tokens, temperature)
            if on_result:
                on_result(i, results[i])

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return [r for r in results if r is not None]


@dataclass
class LoadStats:
    target: int  # requests the load tries to keep in flight
    in_flight: int
    completed: int
    failed: int
    tokens: int  # completion tokens of completed requests
    last_error: str | None
    stopped: str | None = None  # why the load stopped by itself (a measurement's bound ran out)


class BackgroundLoad:
    """A closed-loop load whose concurrency can change while it runs."""

    def __init__(
        self,
        client: EngineClient,
        prompts: Sequence[str | Preset],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        max_requests: int | None = None,
        max_seconds: float | None = None,
        max_concurrency: int = MAX_BACKGROUND,
        on_result: Callable[[RequestResult], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not prompts:
            raise ValueError("background load needs at least one prompt")
        self.client = client
        self._prompts = _cycle(prompts)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_requests = max_requests
        self.max_concurrency = max_concurrency
        self._clock = clock
        self._deadline = None if max_seconds is None else clock() + max_seconds
        self.stopped: str | None = None
        self._on_result = on_result  # sees every completed request (the sweep keeps them)
        self._tasks: list[asyncio.Task] = []
        self._target = 0
        self._started = 0
        self.completed = 0
        self.failed = 0
        self.tokens = 0
        self.last_error: str | None = None
        # (engine step time, tokens it emitted) for every step of every request, finished or not: the
        # load's rate as the engine delivers it (counting finished requests only lagged by a request's
        # whole life: at 64 requests in flight, many seconds with nothing finished read as 0 tokens/s)
        # The event loop's thread appends while a page's handler thread reads: the lock keeps a reader
        # from iterating a deque that changes under it ("deque mutated during iteration", seen in the soak).
        self._emitted: collections.deque[tuple[float, int]] = collections.deque(maxlen=100_000)
        self._emitted_lock = threading.Lock()

    @property
    def target(self) -> int:
        return self._target

    def set_prompts(self, prompts: Sequence[str | Preset]) -> None:
        """The prompts the next requests cycle through (those running finish as they are)."""
        if not prompts:
            raise ValueError("background load needs at least one prompt")
        self._prompts = _cycle(prompts)

    def stats(self) -> LoadStats:
        in_flight = sum(1 for t in self._tasks if not t.done())
        return LoadStats(
            self.target, in_flight, self.completed, self.failed, self.tokens, self.last_error, self.stopped
        )

    def tokens_per_second(self, window_s: float = 10.0) -> float:
        """Tokens the engine emitted for this load's requests in the last ``window_s`` seconds, per second."""
        now = time.monotonic()
        with self._emitted_lock:
            emitted = list(self._emitted)
        return sum(n for t, n in emitted if now - t <= window_s) / window_s

    def note_step(self, step: Step) -> None:
        """One engine step of one of this load's requests (``_run_one`` calls it as they stream)."""
        with self._emitted_lock:
            self._emitted.append((step.t, len(step.emitted)))

    def set_concurrency(self, n: int) -> int:
        """Keep ``n`` requests in flight (clamped to 0..max_concurrency); returns n. Workers that
        ended are replaced (unless a bound of the load ran out: ``stopped``)."""
        n = max(0, min(int(n), self.max_concurrency))
        self._target = n
        self._tasks = [t for t in self._tasks if not t.done()]
        while len(self._tasks) < n and self._may_start():
            self._tasks.append(asyncio.get_running_loop().create_task(self._worker()))
        while len(self._tasks) > n:
            self._tasks.pop().cancel()
        return n

    def _may_start(self) -> bool:
        """False once a bound ran out (``stopped`` says which)."""
        if self._deadline is not None and self._clock() >= self._deadline:
            self.stopped = self.stopped or "its time limit ran out"
        elif self.max_requests is not None and self._started >= self.max_requests:
            self.stopped = self.stopped or f"its {self.max_requests} requests ran out"
        return self.stopped is None

    async def _worker(self) -> None:
        me = asyncio.current_task()
        # cancelling(): a cancel that a request's clean-up swallowed must still end the worker
        # (seen: tests' loads ran on to max_seconds after stop()). The symptom, cancelled()
        # False with cancelling() 1, is anyio's issue #1214 (a CancelScope in the HTTP
        # stack swallows a concurrent native Task.cancel()); not reproduced in isolation.
        while self._may_start() and not (me is not None and me.cancelling()):
            self._started += 1
            preset = next(self._prompts)
            try:
                result = await _run_one(
                    self.client,
                    preset.prompt,
                    self.max_tokens,
                    self.temperature,
                    self.note_step,
                    load_request_id(preset.category),
                )
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep the load going; the count and message show it
                self.failed += 1
                self.last_error = str(e)
                await asyncio.sleep(1.0)
                continue
            self.completed += 1
            self.tokens += len(result.token_ids)
            if self._on_result:
                self._on_result(result)

    async def stop(self) -> None:
        tasks, self._tasks, self._target = self._tasks, [], 0
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
