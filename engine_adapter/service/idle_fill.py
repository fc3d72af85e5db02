"""Measuring the cost model in idle time: the cells traffic has not reached, never beside anyone's request.

Contract: ``IdleFill(policy, in_use, quiet_s=QUIET_S, period_s=PERIOD_S)``. ``await run()`` (a task
of the engine service's loop) looks every ``period_s`` seconds and asks ``policy.start_filling()``
for one more cell once, for ``quiet_s`` seconds, neither ``in_use()`` (a visitor's request, load,
a measurement, a restart) nor a claim has been seen. ``await claim()`` comes before any request
of anyone's goes in (a visitor's, the load's, the twin's, a measurement's): it stops the cell
measured meanwhile and returns once the engine runs none of its requests
(``LivePolicy.stop_filling``), so a profiling step never holds anyone else's request; no cell
starts while a claim is under way (``claimed()`` holds one for a block: a K policy chosen).
``cells_started`` counts the cells begun.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

QUIET_S = 20.0  # seconds nobody claimed the engine before idle time is used
PERIOD_S = 2.0  # seconds between two looks


class FillsCells(Protocol):
    def start_filling(self, still_quiet: Callable[[], bool]) -> bool: ...

    async def stop_filling(self) -> None: ...


class IdleFill:
    def __init__(
        self, policy: FillsCells, in_use: Callable[[], bool], quiet_s: float = QUIET_S, period_s: float = PERIOD_S
    ) -> None:
        self._policy, self._in_use = policy, in_use
        self.quiet_s, self.period_s = quiet_s, period_s
        self._used_t = time.monotonic()  # the last claim, or the last look that found the engine in use
        self._claims = 0  # claims under way: no cell starts meanwhile
        self.cells_started = 0

    def note_claim(self) -> None:
        """From any thread: the engine is wanted now (no cell starts for ``quiet_s``; one chosen a
        moment ago does not begin: ``quiet`` is asked again when it would)."""
        self._used_t = time.monotonic()

    async def claim(self) -> None:
        """The engine is wanted: no new cell for ``quiet_s``, and the one running stopped and gone."""
        async with self.claimed():
            pass

    @contextlib.asynccontextmanager
    async def claimed(self) -> AsyncIterator[None]:
        """``claim`` held for a block (choosing a K policy, whose own ``await``s let the loop run):
        the cell running stopped and gone first, none begins until ``quiet_s`` after the block."""
        self._claims += 1
        try:
            await self._policy.stop_filling()
            yield
        finally:
            self._claims -= 1
            self._used_t = time.monotonic()

    def quiet(self) -> bool:
        """Nobody used or claimed the engine for ``quiet_s`` (as of the looks so far), and nobody does."""
        if self._claims or self._in_use():
            self._used_t = time.monotonic()
            return False
        return time.monotonic() - self._used_t >= self.quiet_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                if self.quiet() and self._policy.start_filling(self.quiet):
                    self.cells_started += 1
            except Exception as e:  # said on stderr; the next look tries again
                print(f"spec-explorer: idle-time measuring skipped: {e!r}", file=sys.stderr, flush=True)
