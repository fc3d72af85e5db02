"""The background load lives as long as the engine: past the old 30 minutes and 10,000 requests,
finished workers replaced; a measurement's bounded load stops by itself and says why.

The client is a stand-in that answers each request at once (a real engine runs in
tests/ui/test_hostile.py); the clock is injected, so hours pass in milliseconds."""

from __future__ import annotations

import asyncio

from engine_adapter.prompts import Preset
from engine_adapter.records import RequestResult, load_request_kind
from engine_adapter.service.load import BackgroundLoad
from tests.support.manual_clock import ManualClock


class InstantClient:
    """Answers every request with one token at once, and counts them."""

    def __init__(self) -> None:
        self.requests = 0
        self.last_request_id: str | None = None

    async def generate(self, prompt: str, *, max_tokens: int, temperature: float, request_id: str | None = None):
        self.requests += 1
        self.last_request_id = request_id
        await asyncio.sleep(0)
        yield RequestResult(
            request_id=str(self.requests),
            prompt=prompt,
            text="x",
            token_ids=[7],
            kinds=["prefill"],
            steps=[],
            provenance="tap",
            spec_decode_metrics=None,
            tap_metrics=None,
            finish_reason="length",
            num_prompt_tokens=1,
            t_start=0.0,
            t_first_token=0.0,
            t_end=0.0,
        )


def test_a_service_load_runs_past_thirty_minutes_and_ten_thousand_requests():
    async def run() -> tuple[int, int, int]:
        client, clock = InstantClient(), ManualClock()
        load = BackgroundLoad(client, ["p"], clock=clock)  # a service's load: no bounds of its own
        load.set_concurrency(4)
        for _ in range(100_000):  # bounded: a load that stopped must fail the test, not hang it
            if client.requests >= 12_000 or load.failed:
                break
            clock.t += 1.0  # 12,000 s: over three hours
            await asyncio.sleep(0)
        stats = load.stats()
        await load.stop()
        return stats.in_flight, stats.target, client.requests

    in_flight, target, requests = asyncio.run(run())
    assert in_flight == 4 and target == 4 and requests >= 12_000


def test_workers_that_ended_are_replaced_at_the_next_change():
    async def run() -> tuple[int, int]:
        load = BackgroundLoad(InstantClient(), ["p"])
        load.set_concurrency(3)
        for t in load._tasks[:2]:  # two workers end (as a crash would end them)
            t.cancel()
        await asyncio.sleep(0.01)
        before = load.stats().in_flight
        load.set_concurrency(3)
        after = load.stats().in_flight
        await load.stop()
        return before, after

    before, after = asyncio.run(run())
    assert before == 1 and after == 3


def test_a_bounded_load_stops_by_itself_and_says_why():
    async def run() -> tuple[str | None, int, str | None]:
        client, clock = InstantClient(), ManualClock()
        load = BackgroundLoad(client, ["p"], max_seconds=60, clock=clock)
        load.set_concurrency(2)
        for _ in range(5):
            await asyncio.sleep(0)
        clock.t = 61.0
        for _ in range(20):
            await asyncio.sleep(0)
        first = load.stats().stopped
        load.set_concurrency(4)  # asking again starts nothing: the bound is the measurement's
        await asyncio.sleep(0.01)
        stats = load.stats()
        await load.stop()
        return first, stats.in_flight, stats.stopped

    first, in_flight, stopped = asyncio.run(run())
    assert first == "its time limit ran out" and in_flight == 0 and stopped == first


def test_each_load_request_names_its_prompts_task_kind():
    async def run() -> list[str | None]:
        client = InstantClient()
        load = BackgroundLoad(client, [Preset("code", "t", "def f():"), Preset("story", "t", "Once")])
        seen: list[str | None] = []
        load.set_concurrency(1)
        for _ in range(20):
            await asyncio.sleep(0)
            if client.last_request_id not in seen:
                seen.append(client.last_request_id)
        await load.stop()
        return seen

    kinds = {load_request_kind(rid) for rid in asyncio.run(run()) if rid is not None}
    assert kinds == {"code", "story"}
