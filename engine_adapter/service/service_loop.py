"""The service's own event loop, in a thread of its own: where the engine, its clients and the
load live, reached from any thread or event loop (the UI's).

Contract: ``ServiceLoop()`` starts the loop; ``submit(coro)`` schedules a coroutine there and
returns a ``concurrent.futures.Future``; ``await call(coro)`` runs it there and awaits it from the
caller's loop; ``relay(items)`` reads an async iterator that runs there from the caller's loop
(``service.relay``); ``stop(last)`` runs the coroutine ``last`` to the end (at most ``timeout_s``),
stops the loop and its thread and returns what ``last`` raised (``TimeoutError`` past
``timeout_s``), else None; after ``stop`` it does nothing again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from engine_adapter.service.relay import relay

T = TypeVar("T")


class ServiceLoop:
    def __init__(self, name: str = "engine-service") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._stopped = False

    @property
    def closed(self) -> bool:
        return self._stopped

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self.submit(coro))

    def relay(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        return relay(self._loop, items)

    def stop(self, last: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Exception | None:
        if self._stopped:
            last.close()
            return None
        self._stopped = True
        failure: Exception | None = None
        try:
            self.submit(last).result(timeout=timeout_s)
        except Exception as e:  # the caller says it; the loop stops all the same
            failure = e
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        return failure
