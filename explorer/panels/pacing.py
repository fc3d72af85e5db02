"""Pace a stream for a browser: batch items that arrive faster than a page can draw them.

Contract: ``async for batch in paced(source, min_interval_s)`` yields non-empty lists of the
source's items, in order, none lost: the first item at once, then at most one batch per
``min_interval_s`` seconds while items keep coming, and whatever is pending as soon as the
interval is up (a slow source is shown item by item, as it comes). ``min_interval_s`` is a
number, or a function read before each wait (an interval that grows with what the consumer
sends). The source is read by a task of its own and closed (``aclose``) when the consumer stops
early (a closed page). ``stop``, an ``asyncio.Event``: once it is set, reading the source ends at
once (its reading task is cancelled inside the source's wait, so the source closes what it holds:
the run panel's Stop), what was read is still yielded, and the batches end normally.

Why: the run panel re-sends the whole token view at each update; a tiny engine steps every
10 ms, faster than Gradio and the browser draw, and the page fell seconds behind
(docs/benchmarks.md, "UI latency"). Units: seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

T = TypeVar("T")
_END = object()


async def paced(
    source: AsyncIterator[T], min_interval_s: float | Callable[[], float], stop: asyncio.Event | None = None
) -> AsyncIterator[list[T]]:
    interval = min_interval_s if callable(min_interval_s) else lambda: min_interval_s
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except Exception as e:  # handed to the consumer, raised there
            queue.put_nowait(e)
        finally:
            queue.put_nowait(_END)

    async def end_reading_when(stop: asyncio.Event) -> None:
        await stop.wait()
        task.cancel()  # the source closes when pump runs next (paced's finally waits for it)
        queue.put_nowait(_END)  # pump may not have started: its own _END would never come

    task = asyncio.create_task(pump())
    watcher = asyncio.create_task(end_reading_when(stop)) if stop is not None else None
    try:
        pending: list[T] = []
        last = float("-inf")
        while True:
            wait = None if not pending else max(0.0, last + interval() - time.monotonic())
            try:
                item = await asyncio.wait_for(queue.get(), wait)
            except TimeoutError:
                item = None  # the interval is up: show what is pending
            else:
                if item is _END:
                    break
                if isinstance(item, Exception):
                    if pending:
                        yield pending
                    raise item
                pending.append(item)
            if pending and time.monotonic() - last >= interval():
                yield pending
                pending, last = [], time.monotonic()
        if pending:
            yield pending
    finally:
        if watcher is not None:
            watcher.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
