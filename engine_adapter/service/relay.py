"""An async iterator that runs on one event loop, read from another: a foreground request's items.

Contract: ``relay(loop, items)`` runs the async iterator ``items`` on ``loop`` (the service's own)
and yields its items on the caller's loop, in order; an exception it raises is raised to the
caller. Closing the relay (the caller's Stop, a closed page) cancels the producer at once, and
``items`` is closed with it (``contextlib.aclosing``: a request's stream closed, vLLM aborts it).
A caller whose event loop has closed is sent nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def relay(loop: asyncio.AbstractEventLoop, items: AsyncIterator[T]) -> AsyncIterator[T]:
    caller = asyncio.get_running_loop()
    out: asyncio.Queue = asyncio.Queue()
    done = object()

    def send(item: object) -> None:
        if not caller.is_closed():  # a caller whose loop ended (a script's asyncio.run) reads nothing
            caller.call_soon_threadsafe(out.put_nowait, item)

    async def produce() -> None:
        try:
            async with contextlib.aclosing(items) as running:
                async for item in running:
                    send(item)
        except Exception as e:
            send(e)
        finally:
            send(done)

    fut = asyncio.run_coroutine_threadsafe(produce(), loop)
    try:
        while True:
            item = await out.get()
            if item is done:
                return
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        fut.cancel()
