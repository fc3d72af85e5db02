"""The tap receiver hands each step's rows to their requests, a reader's own request first."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from engine_adapter.engine.step_stream import TapRow
from engine_adapter.engine.tap_receiver import TapReceiver
from engine_adapter.vllm_plugin.wire import TapRequestStep, TapStep
from tests.support.tap_records import tap_row, tap_step


def _row(rid: str) -> TapRequestStep:
    return tap_row(f"cmpl-{rid}-0-0123abcd", drafted=[5], accepted=1, emitted=[5, 6])


def _step(rids: list[str]) -> TapStep:
    return tap_step(batch_size=len(rids), k=1, num_tokens=2 * len(rids), reqs=[_row(r) for r in rids])


@pytest.mark.parametrize(
    "engine_order, first, expected_wake_order",
    [
        (["bg1", "bg2", "fg"], {"fg"}, ["fg", "bg1", "bg2"]),  # the reader's own request jumps the load
        (["fg", "bg1", "bg2"], {"fg"}, ["fg", "bg1", "bg2"]),
        (["bg2", "bg1"], set(), ["bg2", "bg1"]),  # no reader: the engine's order
        (["a", "bg", "b"], {"a", "b"}, ["a", "b", "bg"]),  # two readers: theirs in engine order, then the rest
        (["bg", "gone"], set(), ["bg"]),  # a row nobody registered for is dropped
    ],
)
def test_a_step_wakes_the_first_requests_consumers_first(engine_order, first, expected_wake_order):
    async def run() -> list[str]:
        tap = TapReceiver(f"ipc:///tmp/spec-explorer-test-{uuid.uuid4().hex}")
        woken: list[str] = []
        try:
            queues = {r: tap.register(r, watched=r in first) for r in engine_order if r != "gone"}

            async def consume(rid: str) -> None:
                event = await queues[rid].get()
                assert isinstance(event, TapRow)
                row = event.row
                assert row.engine_request_id.startswith(f"cmpl-{rid}-")
                woken.append(rid)

            tasks = [asyncio.create_task(consume(r)) for r in queues]
            await asyncio.sleep(0)  # every consumer waits on its queue, in registration order
            tap.route(_step(engine_order))
            await asyncio.gather(*tasks)
        finally:
            await tap.close()
        return woken

    assert asyncio.run(run()) == expected_wake_order


async def _note(name: str, queue: asyncio.Queue, order: list[str]) -> None:
    await queue.get()
    order.append(name)


def test_unregister_forgets_a_first_request():
    async def run() -> None:
        tap = TapReceiver(f"ipc:///tmp/spec-explorer-test-{uuid.uuid4().hex}")
        try:
            q = tap.register("fg", watched=True)
            tap.unregister("fg")
            tap.route(_step(["fg"]))
            assert q.empty()
            # registered again, not first: it takes its turn in engine order, behind a request before it
            bg, fg = tap.register("bg"), tap.register("fg")
            order: list[str] = []
            tasks = [asyncio.create_task(_note(name, queue, order)) for name, queue in (("fg", fg), ("bg", bg))]
            await asyncio.sleep(0)
            tap.route(_step(["bg", "fg"]))
            await asyncio.gather(*tasks)
            assert order == ["bg", "fg"]
        finally:
            await tap.close()

    asyncio.run(run())
