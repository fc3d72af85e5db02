"""Idle time's cost-model cells: how one runs, how it stops, how often each is tried.

Contract: ``IdleCells(steps_since)`` runs one cell (batch size, K) at a time for its owner
(``live_state.LivePolicy``), which chooses the cell and says what measuring it and finishing it
mean:

- ``start(cell, measure, after, still_quiet)`` counts a try of ``cell`` and returns the task that
  runs it: if ``still_quiet()`` when the task first runs (a claim from another thread may have come
  in between; else nothing ran and no try counts), ``label`` names the cell ("4 requests x K=3"),
  ``await measure(b, k)`` runs as a task of its own (the profiler's requests), then, however that
  ended, the task waits until the engine runs none of the profiler's requests
  (``_until_profiling_gone``) and ``await after(finished)`` (the owner learns a finished cell and
  applies its policy again; it should not raise), and ``label`` goes back to None (whatever
  happened);
- ``stop()`` cancels the measurement, if one runs (a cell not begun never begins), and returns
  once the task has ended (its requests gone, ``after`` done); a cell stopped so is not counted
  as a try; safe from several tasks at once, and a caller's own cancellation is not passed on to
  the cell;
- ``untried(cells)``: those tried fewer than ``FILL_TRIES`` times (a failed measurement counts, so
  the work ends); ``forget_tries()`` starts afresh (a new cost model to learn);
- ``running()``: whether a cell's task exists and has not ended (a plain read, from any thread).

Cancelling the task itself (the engine going away) cancels the measurement and skips ``after``.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from engine_adapter.records import EngineStep

FILL_TRIES = 2  # idle-time measurements of one cell before it is left to traffic (its steps may not count)
GONE_TIMEOUT_S = 10.0  # a cell's end waits at most this long for the engine to drop its requests
GONE_SETTLE_S = 0.15  # ... and at least this long: a request the cell had just sent may yet reach the engine

Cell = tuple[int, int]  # (batch size, K)
MeasureCell = Callable[[int, int], Coroutine[Any, Any, object]]  # runs the cell (b, k): the profiler's requests
AfterCell = Callable[[bool], Awaitable[None]]  # once its requests are gone: whether it finished


class IdleCells:
    """One idle-time cell at a time, its tries counted per cell."""

    def __init__(self, steps_since: Callable[[float], list[EngineStep]]) -> None:
        self._steps_since = steps_since
        self._tries: collections.Counter[Cell] = collections.Counter()
        self._task: asyncio.Task | None = None
        self._cell: Cell | None = None  # the cell ``_task`` runs
        self._measuring: asyncio.Task | None = None  # the cell's measurement, which ``stop`` cancels
        self.label: str | None = None  # the cell measured now, in the page's words

    def untried(self, cells: list[Cell]) -> list[Cell]:
        return [cell for cell in cells if self._tries[cell] < FILL_TRIES]

    def forget_tries(self) -> None:
        self._tries.clear()

    def forget(self) -> None:
        """The engine is gone (its tasks cancelled by the owner): nothing runs, nothing was tried."""
        self._task, self._cell, self._measuring, self.label = None, None, None, None
        self._tries.clear()

    def running(self) -> bool:
        task = self._task
        return task is not None and not task.done()

    def start(
        self,
        cell: Cell,
        measure: MeasureCell,
        after: AfterCell,
        still_quiet: Callable[[], bool],
    ) -> asyncio.Task:
        self._tries[cell] += 1
        self._cell, self._measuring = cell, None
        self._task = asyncio.create_task(self._run(cell, measure, after, still_quiet))
        return self._task

    async def _run(
        self,
        cell: Cell,
        measure: MeasureCell,
        after: AfterCell,
        still_quiet: Callable[[], bool],
    ) -> None:
        if not still_quiet():  # claimed since the cell was chosen: not begun, not a try
            self._tries[cell] -= 1
            return
        b, k = cell
        self.label = f"{b} request{'s' * (b > 1)} x K={k}"
        measuring = asyncio.create_task(measure(b, k))
        self._measuring = measuring
        finished = False
        try:
            try:
                await measuring
                finished = True
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # the engine is going: no clean-up to wait for
                    measuring.cancel()
                    raise
                self._tries[cell] -= 1  # stopped by someone's request
            except Exception as e:  # tried again later, up to ``FILL_TRIES``
                print(f"spec-explorer: measuring {self.label} in idle time failed: {e!r}", file=sys.stderr, flush=True)
            await self._until_profiling_gone()
            await after(finished)
        finally:
            self.label = None

    async def _until_profiling_gone(self) -> None:
        """Until the engine runs none of the profiler's requests: its last step had none, or no step
        came for twice its last step's time (the engine idle); after ``GONE_SETTLE_S``, at most
        ``GONE_TIMEOUT_S`` (said on stderr)."""
        since = time.monotonic()
        await asyncio.sleep(GONE_SETTLE_S)
        while time.monotonic() - since < GONE_TIMEOUT_S:
            steps = self._steps_since(since - GONE_TIMEOUT_S)
            last = steps[-1] if steps else None
            idle = last is not None and time.monotonic() - last.t > 2 * last.wall_s + GONE_SETTLE_S
            if last is None or not last.profiling_requests or idle:
                return
            await asyncio.sleep(0.02)
        print(f"spec-explorer: profiling requests still ran {GONE_TIMEOUT_S:.0f} s after their end", file=sys.stderr)

    async def stop(self) -> None:
        task, measuring = self._task, self._measuring
        if task is None or task.done():
            return
        if measuring is None:  # not begun (no await comes before the measurement): it never will
            if not task.cancelling() and task.cancel() and self._cell is not None:  # once, if stopped twice
                self._tries[self._cell] -= 1
        elif not measuring.done():
            measuring.cancel()
        await asyncio.wait([task])
