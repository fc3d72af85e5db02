"""explorer/panels/pacing.py: a fast source is batched, a slow one passes item by item, nothing is lost."""

from __future__ import annotations

import asyncio

import pytest

from explorer.panels.pacing import paced


async def _source(gaps: list[float], fail_at: int | None = None, closed: list | None = None):
    try:
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            if i == fail_at:
                raise RuntimeError("engine gone")
            yield i
    finally:
        if closed is not None:
            closed.append(True)


async def _batches(gaps, interval, **kw):
    return [b async for b in paced(_source(gaps, **kw), interval)]


@pytest.mark.parametrize(
    "gaps, interval, most_batches, least_batches",
    [
        ([0.0] * 50, 0.05, 3, 1),  # all at once: the first, then one or two batches
        ([0.002] * 50, 0.05, 6, 2),  # 100 ms of items at 2 ms: about one batch per 50 ms
        ([0.03] * 5, 0.01, 5, 5),  # slower than the interval: one item per batch
        ([], 0.05, 0, 0),
    ],
)
def test_batches_follow_the_interval_and_keep_every_item(gaps, interval, most_batches, least_batches):
    batches = asyncio.run(_batches(gaps, interval))
    assert [i for b in batches for i in b] == list(range(len(gaps)))
    assert least_batches <= len(batches) <= most_batches, batches
    assert all(batches)


def test_the_last_item_is_not_held_back_when_the_source_pauses():
    async def run():
        seen = []
        async for batch in paced(_source([0.0, 0.0, 0.3]), 0.05):
            seen.append((batch, asyncio.get_running_loop().time()))
        return seen

    seen = asyncio.run(run())
    assert [b for b, _ in seen][:2] == [[0], [1]]  # item 1 shown once its interval was up, not with item 2
    assert seen[1][1] - seen[0][1] < 0.2


def test_an_error_comes_after_the_items_before_it():
    async def run():
        got = []
        with pytest.raises(RuntimeError, match="engine gone"):
            async for batch in paced(_source([0.0, 0.0, 0.0], fail_at=2), 0.05):
                got += batch
        return got

    assert asyncio.run(run()) == [0, 1]


def test_stopping_early_closes_the_source():
    closed: list = []

    async def run():
        async for _ in paced(_source([0.01] * 100, closed=closed), 0.01):
            break

    asyncio.run(run())
    assert closed == [True]


def test_an_interval_that_grows_spaces_the_batches_out():
    """A function interval is read before each wait: as it grows, fewer batches carry more items."""

    async def run():
        sizes: list[int] = []
        async for batch in paced(_source([0.002] * 100), lambda: 0.01 * (1 + len(sizes))):
            sizes.append(len(batch))
        return sizes

    sizes = asyncio.run(run())
    assert sum(sizes) == 100
    assert max(sizes[2:]) > sizes[1], sizes  # later batches wait longer, so they carry more
    assert len(sizes) < 20, sizes  # a fixed 10 ms interval would give about 20


def test_a_stop_ends_the_batches_closes_the_source_and_keeps_what_was_read():
    """Stop while the source waits (an engine held mid-run): the batches end at once, normally, with
    every item read before the stop, and the source is closed."""
    closed: list = []

    async def run():
        stop = asyncio.Event()
        got: list[int] = []
        async for batch in paced(_source([0.0, 0.0, 30.0], closed=closed), 0.01, stop=stop):
            got += batch
            if got == [0, 1]:
                asyncio.get_running_loop().call_later(0.05, stop.set)
        return got

    started = asyncio.run(asyncio.wait_for(run(), 5))
    assert started == [0, 1]
    assert closed == [True]


def test_a_stop_set_before_reading_starts_ends_the_batches_at_once():
    closed: list = []

    async def run():
        stop = asyncio.Event()
        stop.set()
        return [b async for b in paced(_source([0.0] * 3, closed=closed), 0.01, stop=stop)]

    assert asyncio.run(asyncio.wait_for(run(), 5)) == []
