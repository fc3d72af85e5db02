"""Restarts a person asks for, coalesced: never a queue of restarts.

Contract (on the service's event loop): ``RestartGate(run, settle_s, min_interval_s, clock)``;
``request(what)`` records ``what`` (an engine config) as THE pending restart, replacing any
pending one, and returns a ``RestartTicket`` saying when it will run. The pending restart runs
``run(what)`` once ``settle_s`` has passed since the first request of the burst (so a few quick
clicks give one restart, with the last click's settings), no restart is running, and
``min_interval_s`` has passed since the last restart ended (a restart takes the engine away from
everyone for a minute or more). ``pending`` and ``due_in_s()`` say where it stands; ``close()``
drops what is pending. The gate is for restarts people ask for; the app's first start and the
watchdog's recovery start at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

RESTART_SETTLE_S = 3.0  # seconds a burst of Apply clicks has to settle into one restart
MIN_RESTART_INTERVAL_S = 30.0  # seconds from the end of one asked-for restart to the start of the next


@dataclass(frozen=True)
class RestartTicket:
    due_in_s: float  # seconds until the restart starts (about: a running restart may take longer)
    replaced: bool  # an earlier pending restart was replaced by this one
    behind_running: bool  # a restart is running; this one follows it


class RestartGate(Generic[T]):
    def __init__(
        self,
        run: Callable[[T], Awaitable[None]],
        *,
        settle_s: float = RESTART_SETTLE_S,
        min_interval_s: float = MIN_RESTART_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run
        self.settle_s = settle_s
        self.min_interval_s = min_interval_s
        self._clock = clock
        self.pending: T | None = None
        self._burst_t = 0.0  # when the pending burst began
        self._ended_t = float("-inf")  # when the last restart ended
        self.running = False
        self.restarts = 0  # restarts run through the gate
        self._task: asyncio.Task | None = None

    def _due_t(self) -> float:
        return max(self._burst_t + self.settle_s, self._ended_t + self.min_interval_s)

    def due_in_s(self) -> float | None:
        """Seconds until the pending restart starts (None: nothing pending)."""
        return None if self.pending is None else max(self._due_t() - self._clock(), 0.0)

    def request(self, what: T) -> RestartTicket:
        replaced = self.pending is not None
        if not replaced:
            self._burst_t = self._clock()
        self.pending = what
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return RestartTicket(self.due_in_s() or 0.0, replaced, self.running)

    async def _drain(self) -> None:
        while self.pending is not None:
            wait = self._due_t() - self._clock()
            if wait > 0 or self.running:
                await asyncio.sleep(max(wait, 0.05))
                continue
            what, self.pending = self.pending, None
            self.running = True
            try:
                await self._run(what)
            finally:
                self.running = False
                self.restarts += 1
                self._ended_t = self._clock()

    async def close(self) -> None:
        self.pending = None
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
