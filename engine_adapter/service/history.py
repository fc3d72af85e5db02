"""The engine's recent past, server-wide: the tap's steps and ``/metrics`` snapshots.

Contract: ``EngineHistory(history_s)``; on the service's event loop ``collect(engine)`` appends
every ``EngineStep`` the engine's tap summarises (a task per engine; ``clear()`` at each new
engine) and ``poll_metrics(current)`` appends a ``/metrics`` snapshot of the engine
``current()`` returns once a second (attached servers too). Both keep ``history_s`` seconds.
Readers on any thread: ``steps_since(t)`` (the steps after monotonic time ``t``, oldest first:
a binary search on a copy, so a page's poll costs the recent steps, not the whole history) and
``prom_history()``.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
from collections.abc import Callable

import httpx

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine.prometheus import fetch_snapshot
from engine_adapter.records import EngineStep, PromSnapshot


class EngineHistory:
    def __init__(self, history_s: float = 600.0) -> None:
        self.history_s = history_s
        self._steps: collections.deque[EngineStep] = collections.deque()
        self._prom: collections.deque[PromSnapshot] = collections.deque()

    def clear(self) -> None:
        self._steps.clear()

    async def collect(self, engine: LiveEngine) -> None:
        q = engine.client.tap.watch()
        while True:
            step = await q.get()
            self._steps.append(step)
            cutoff = step.t - self.history_s
            while self._steps and self._steps[0].t < cutoff:
                self._steps.popleft()

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

    def steps_since(self, t: float) -> list[EngineStep]:
        steps = list(self._steps)  # one C-level copy: the loop appends meanwhile
        return steps[bisect.bisect_right(steps, t, key=lambda s: s.t) :]

    def prom_history(self) -> list[PromSnapshot]:
        return list(self._prom)
