"""``IdleCells``: which tries count, what ``after`` is told, and that ``stop`` waits for the end.

No engine: the measurement is a coroutine that sleeps, fails or finishes, and the step history
is empty (the engine runs none of the profiler's requests, so a cell ends ``GONE_SETTLE_S`` after
its measurement).
"""

from __future__ import annotations

import asyncio

from engine_adapter.policy.idle_cells import FILL_TRIES, IdleCells


def _cells() -> tuple[IdleCells, list[tuple[str, object]]]:
    events: list[tuple[str, object]] = []
    return IdleCells(lambda t: []), events


def _recording(events: list[tuple[str, object]]):
    """An ``after`` that notes what it was told in ``events``."""

    async def after(finished: bool) -> None:
        events.append(("after", finished))

    return after


async def _never(b: int, k: int) -> None:
    raise AssertionError("this cell must not begin")


def test_a_finished_cell_counts_a_try_and_after_hears_it_finished():
    async def go():
        idle, events = _cells()

        async def measure(b, k):
            events.append(("measure", (b, k, idle.label)))

        after = _recording(events)

        await idle.start((4, 3), measure, after, lambda: True)
        assert events == [("measure", (4, 3, "4 requests x K=3")), ("after", True)]
        assert idle.label is None and not idle.running()
        for _ in range(FILL_TRIES - 1):
            assert idle.untried([(4, 3)]) == [(4, 3)]
            await idle.start((4, 3), measure, after, lambda: True)
        assert idle.untried([(4, 3), (1, 2)]) == [(1, 2)]  # tried FILL_TRIES times: left to traffic

    asyncio.run(go())


def test_a_cell_stopped_by_a_request_is_not_a_try_and_stop_waits_for_after():
    async def go():
        idle, events = _cells()
        started = asyncio.Event()

        async def measure(b, k):
            started.set()
            await asyncio.sleep(60)

        async def after(finished):
            await asyncio.sleep(0.05)
            events.append(("after", finished))

        task = idle.start((1, 5), measure, after, lambda: True)
        await started.wait()
        assert idle.running() and idle.label == "1 request x K=5"
        await idle.stop()
        assert events == [("after", False)] and task.done() and idle.label is None
        assert idle.untried([(1, 5)]) == [(1, 5)]
        for _ in range(FILL_TRIES + 1):  # stopped every time: never left to traffic
            task = idle.start((1, 5), measure, after, lambda: True)
            await asyncio.sleep(0)
            await idle.stop()
        assert idle.untried([(1, 5)]) == [(1, 5)]

    asyncio.run(go())


def test_a_failed_measurement_counts_and_a_claimed_cell_never_begins():
    async def go():
        idle, events = _cells()

        async def failing(b, k):
            raise RuntimeError("the engine said no")

        after = _recording(events)

        for _ in range(FILL_TRIES):
            await idle.start((16, 1), failing, after, lambda: True)
        assert events == [("after", False)] * FILL_TRIES and idle.untried([(16, 1)]) == []

        for _ in range(FILL_TRIES):  # claimed every time: never a try
            await idle.start((16, 0), _never, after, lambda: False)
        assert len(events) == FILL_TRIES and idle.untried([(16, 0)]) == [(16, 0)]
        idle.forget_tries()
        assert idle.untried([(16, 1)]) == [(16, 1)]

    asyncio.run(go())


def test_the_engine_going_away_cancels_the_measurement_and_skips_after():
    async def go():
        idle, events = _cells()
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def measure(b, k):
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        after = _recording(events)

        task = idle.start((4, 1), measure, after, lambda: True)
        await started.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        assert cancelled.is_set() and events == [] and task.cancelled()

    asyncio.run(go())


def test_a_cell_stopped_before_it_begins_never_measures_and_is_not_a_try():
    async def go():
        idle, events = _cells()
        after = _recording(events)

        task = idle.start((1, 3), _never, after, lambda: True)
        await idle.stop()  # called before the task's first step
        await idle.stop()  # and again: nothing more to stop, nothing more to count
        assert task.cancelled() and events == [] and not idle.running()
        assert idle.untried([(1, 3)]) == [(1, 3)]
        for _ in range(FILL_TRIES):  # stopped every time: the tries still start from none
            idle.start((1, 3), _never, after, lambda: True)
            await idle.stop()
        assert idle.untried([(1, 3)]) == [(1, 3)]

    asyncio.run(go())


def test_the_label_goes_back_to_none_when_after_raises():
    async def go():
        idle, _ = _cells()

        async def measure(b, k):
            return None

        async def after(finished):
            raise RuntimeError("the policy could not be applied")

        task = idle.start((4, 0), measure, after, lambda: True)
        await asyncio.gather(task, return_exceptions=True)
        assert isinstance(task.exception(), RuntimeError) and idle.label is None

    asyncio.run(go())
