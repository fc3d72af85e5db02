"""The speculation-off twin: started only when allowed, relaunched when its process dies while in
use, stopped when idle, its memory check told what the main engine will still commit.

The launch is a stand-in that records its calls (a real twin starts in tests/ui/test_hostile.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import pytest

from engine_adapter.engine_config import EngineConfig
from engine_adapter.service.twin import SpeculationOffTwin, TwinUnavailable, twin_config
from tests.support.manual_clock import ManualClock


@dataclass
class FakeProcess:
    alive: bool = True

    def is_alive(self) -> bool:
        return self.alive


@dataclass
class FakeEngine:
    config: EngineConfig
    process: FakeProcess = field(default_factory=FakeProcess)
    closed: bool = False

    async def close(self) -> None:
        self.closed = True


class Launches:
    def __init__(self) -> None:
        self.calls: list[tuple[EngineConfig, int]] = []

    async def __call__(self, config: EngineConfig, *, reserve_bytes: int = 0) -> FakeEngine:
        self.calls.append((config, reserve_bytes))
        return FakeEngine(config)


MAIN = EngineConfig(method="draft", k=3, kv_cache_gib=2, k_max=5)


def test_the_twin_runs_the_target_with_speculation_off_and_a_small_cache():
    cfg = twin_config(MAIN)
    assert cfg.method == "off" and cfg.k_max is None and cfg.k_table is None and cfg.kv_cache_gib == 1
    assert cfg.target == MAIN.target


def test_the_twin_of_a_quantised_engine_runs_the_same_quantised_target():
    """The lossless check compares with the target that runs: an int8 engine's twin is int8 too."""
    assert twin_config(replace(MAIN, variant="int8-pair")).variant == "int8-pair"


def test_a_visitor_may_not_start_it_and_is_told_why():
    async def run() -> None:
        twin = SpeculationOffTwin(Launches())
        with pytest.raises(TwinUnavailable, match="only the presenter may start it"):
            await twin.get(MAIN, may_start=False)
        assert twin.state == "off"

    asyncio.run(run())


def test_a_dead_twin_in_use_comes_back_and_an_idle_one_stops():
    async def run() -> None:
        launches, clock = Launches(), ManualClock()
        twin = SpeculationOffTwin(launches, idle_s=600, clock=clock)
        first = await twin.get(MAIN, may_start=True, reserve_bytes=2 << 30)
        assert launches.calls[0][1] == 2 << 30  # the main engine's KV cache is kept out of what is free
        first.process.alive = False  # killed
        clock.t = 10
        await twin.check()
        assert twin.relaunches == 1 and twin.state == "ready" and first.closed
        assert "relaunched" in twin.note and twin.engine is not first
        # a visitor may use the relaunched twin without starting anything
        assert await twin.get(MAIN, may_start=False) is twin.engine
        clock.t = 10 + 601
        await twin.check()
        assert twin.state == "off" and twin.engine is None and "unused for 10 minutes" in twin.note
        assert len(launches.calls) == 2

    asyncio.run(run())


def test_a_dead_twin_nobody_uses_is_not_relaunched_but_the_next_use_starts_it():
    async def run() -> None:
        launches, clock = Launches(), ManualClock()
        twin = SpeculationOffTwin(launches, idle_s=600, clock=clock)
        first = await twin.get(MAIN, may_start=True)
        first.process.alive = False
        clock.t = 700
        await twin.check()  # idle: stopped, not relaunched
        assert twin.engine is None and len(launches.calls) == 1
        await twin.get(MAIN, may_start=True)
        assert len(launches.calls) == 2

    asyncio.run(run())
