"""The engine's recent past, server-wide: the tap's steps and ``/metrics`` snapshots.

Contract: ``EngineHistory(history_s)``; on the service's event loop ``collect(engine)`` appends
every ``EngineStep`` the engine's tap summarises (a task per engine; ``clear()`` at each new
engine) and ``poll_metrics(current)`` appends a ``/metrics`` snapshot of the engine
``current()`` returns once a second (attached servers too). Both keep ``history_s`` seconds;
a step's per-request rows (``EngineStep.requests``, the ledger's) only ``rows_s`` seconds: at
hundreds of requests per step they would be most of the history's memory.
``await acknowledged(control)`` waits for the first step run under a control command.
Readers on any thread: ``steps_since(t)`` (the steps after monotonic time ``t``, oldest first:
a binary search on a copy, so a page's poll costs the recent steps, not the whole history) and
``prom_history()``.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace

import httpx

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine.prometheus import fetch_snapshot
from engine_adapter.records import EngineStep, PromSnapshot

REQUEST_ROWS_S = 60.0  # seconds a step keeps its per-request rows (the ledger reads 10 s, its share chart 60)


class EngineHistory:
    def __init__(self, history_s: float = 600.0, rows_s: float = REQUEST_ROWS_S) -> None:
        self.history_s = history_s
        self.rows_s = rows_s
        self._steps: collections.deque[EngineStep] = collections.deque()
        self._without_rows = 0  # the oldest steps whose per-request rows were dropped
        self._prom: collections.deque[PromSnapshot] = collections.deque()

    def clear(self) -> None:
        self._steps.clear()
        self._without_rows = 0

    async def collect(self, engine: LiveEngine) -> None:
        q = engine.client.tap.watch()
        while True:
            self.add(await q.get())

    def add(self, step: EngineStep) -> None:
        """Keep ``step``; forget what is older than ``history_s``, and rows older than ``rows_s``."""
        steps = self._steps
        steps.append(step)
        cutoff = step.t - self.history_s
        while steps and steps[0].t < cutoff:
            steps.popleft()
            self._without_rows = max(0, self._without_rows - 1)
        rows_cutoff = step.t - self.rows_s
        while self._without_rows < len(steps) and steps[self._without_rows].t < rows_cutoff:
            old = steps[self._without_rows]
            if old.requests:
                steps[self._without_rows] = replace(old, requests=())
            self._without_rows += 1

    async def poll_metrics(self, current: Callable[[], LiveEngine | None]) -> None:
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                await asyncio.sleep(1.0)
                engine = current()
                if engine is None:
                    continue
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    snap = await fetch_snapshot(http, engine.url)
                    self._prom.append(snap)
                    while len(self._prom) > self.history_s:
                        self._prom.popleft()

    async def acknowledged(self, control: int, timeout_s: float = 10.0, idle: Callable[[], bool] | None = None) -> None:
        """Until a step ran under control command ``control`` (``EngineStep.controls``). An idle engine
        runs no step, and its next one runs under the command (the scheduler drains the control
        channel before it schedules): with ``idle()`` true (no request in flight) at once, else at
        most ``timeout_s``."""
        if idle is not None and idle():
            return
        since = time.monotonic() - 1.0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(s.controls >= control for s in self.steps_since(since)):
                return
            await asyncio.sleep(0.02)

    def steps_since(self, t: float) -> list[EngineStep]:
        steps = list(self._steps)  # one C-level copy: the loop appends meanwhile
        return steps[bisect.bisect_right(steps, t, key=lambda s: s.t) :]

    def prom_history(self) -> list[PromSnapshot]:
        return list(self._prom)
