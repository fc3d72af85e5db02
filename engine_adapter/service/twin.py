"""The speculation-off twin: a second engine on the main engine's target, for the lossless check.

Contract (everything runs on ``EngineService``'s event loop):

- ``SpeculationOffTwin(launch, clock)``; ``await twin.get(config, may_start, reserve_bytes)``
  returns the running twin for ``config`` (the main engine's; the twin runs it with speculation
  off and a small KV cache), starting it on first use when ``may_start`` (on a public page only
  the presenter may start a second engine) and raising ``TwinUnavailable`` with a sentence a
  visitor can act on otherwise. ``reserve_bytes`` is host memory the twin's resource check must
  leave free: the main engine's KV cache is mapped at start and committed as it fills, so the
  machine's free memory overstates what is left.
- ``watch()`` (a task the service starts) checks the twin every ``CHECK_S``: a twin whose
  process died is relaunched if it was used in the last ``idle_s`` seconds and forgotten
  otherwise; a twin unused for ``idle_s`` is stopped (it holds a whole engine's memory).
  ``state`` and ``note`` say where it stands (for the page); ``relaunches`` counts recoveries.
- ``close()`` stops it. A change of target (``get`` with another target) replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Literal

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig

TWIN_IDLE_S = 600.0  # a twin nobody compared with for this long is stopped
TWIN_KV_CACHE_GIB = 1  # one request at a time: a small cache is plenty
CHECK_S = 5.0

TwinState = Literal["off", "starting", "ready", "failed"]
Launch = Callable[..., Awaitable[LiveEngine]]


class TwinUnavailable(RuntimeError):
    """The twin is not running and may not be started now; the message says why."""


def twin_config(config: EngineConfig) -> EngineConfig:
    """The main engine's config with speculation off and a small KV cache."""
    kv_gib = min(config.kv_cache_gib, TWIN_KV_CACHE_GIB)
    return replace(config, method="off", k_table=None, k_max=None, kv_cache_gib=kv_gib)


class SpeculationOffTwin:
    def __init__(
        self,
        launch: Launch = LiveEngine.launch,
        *,
        idle_s: float = TWIN_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._launch = launch
        self.idle_s = idle_s
        self._clock = clock
        self._engine: LiveEngine | None = None
        self._config: EngineConfig | None = None  # the twin's own (``twin_config``)
        self._reserve = 0
        self._lock = asyncio.Lock()
        self._used_at = float("-inf")
        self.state: TwinState = "off"
        self.note: str | None = None  # the last thing that happened to it, in words
        self.relaunches = 0

    @property
    def engine(self) -> LiveEngine | None:
        return self._engine

    async def get(self, config: EngineConfig, *, may_start: bool, reserve_bytes: int = 0) -> LiveEngine:
        self._used_at = self._clock()
        wanted = twin_config(config)
        async with self._lock:
            if self._engine is not None and self._config is not None and self._config.target != wanted.target:
                await self._stop("the main engine's target changed")
            if self._engine is not None and self._alive(self._engine):
                return self._engine
            if self._engine is not None:  # died since the last check
                await self._stop("its process ended")
            if not may_start:
                raise TwinUnavailable(
                    "the speculation-off engine is not running, and on a public page only the presenter may "
                    "start it (it is a second engine, with a second copy of the target in memory)"
                )
            self._reserve = reserve_bytes
            return await self._start(wanted)

    async def _start(self, config: EngineConfig) -> LiveEngine:
        self.state, self._config = "starting", config
        try:
            self._engine = await self._launch(config, reserve_bytes=self._reserve)
        except Exception as e:
            self.state, self.note = "failed", f"could not start: {e}"
            raise
        self.state, self.note = "ready", None
        return self._engine

    @staticmethod
    def _alive(engine: LiveEngine) -> bool:
        return engine.process is None or engine.process.is_alive()

    async def _stop(self, why: str) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        self.state, self.note = "off", f"stopped: {why}"
        if engine is not None:
            with contextlib.suppress(Exception):
                await engine.close()

    async def check(self) -> None:
        """One round of the watch: relaunch a dead twin in use, stop an idle one."""
        async with self._lock:
            engine = self._engine
            if engine is None:
                return
            idle = self._clock() - self._used_at > self.idle_s
            if idle:
                await self._stop(f"unused for {self.idle_s / 60:.0f} minutes")
            elif not self._alive(engine):
                await self._stop("its process ended")
                self.relaunches += 1
                with contextlib.suppress(Exception):  # said in ``note``; the next ``get`` tries again
                    await self._start(self._config)
                    self.note = f"relaunched after its process ended ({self.relaunches} so far)"

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            await self.check()

    async def close(self) -> None:
        async with self._lock:
            await self._stop("closed")
