"""Visitors' own requests (not the background load): streamed from the service loop to the
caller's, counted while they run, their results handed on.

Contract: ``ForegroundRequests(loop)``; ``stream(engine_for, prompt, ...)`` awaits ``engine_for()``
(the engine to run on, or an error: not ready, no twin) and yields the request's ``Step`` items
then its ``RequestResult`` on the caller's loop; closing it (Stop, a closed page) closes the
request's stream on the service loop at once and vLLM aborts the request. With ``report`` each
result goes to every callback in ``on_result`` (the session recorder; must not block).
``in_flight`` counts the requests running (changed on the service loop only); ``await
wait_done(timeout_s, waiting)`` returns once none runs (or at the timeout), calling
``waiting(n)`` every 0.2 s meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.records import RequestResult, Step
from engine_adapter.service.service_loop import ServiceLoop

WAIT_POLL_S = 0.2


class ForegroundRequests:
    def __init__(self, loop: ServiceLoop) -> None:
        self._loop = loop
        self.in_flight = 0
        self.on_result: list[Callable[[RequestResult], None]] = []

    async def stream(
        self,
        engine_for: Callable[[], Awaitable[LiveEngine]],
        prompt: str,
        *,
        max_tokens: int,
        temperature: float,
        request_id: str | None = None,
        report: bool = True,
    ) -> AsyncIterator[Step | RequestResult]:
        engine = await engine_for()

        async def counted() -> AsyncIterator[Step | RequestResult]:
            self.in_flight += 1  # on the service loop: a measurement waits for these
            try:
                async with contextlib.aclosing(
                    engine.client.generate(
                        prompt, max_tokens=max_tokens, temperature=temperature, request_id=request_id, watched=True
                    )
                ) as items:
                    async for item in items:
                        yield item
            finally:
                self.in_flight -= 1

        async with contextlib.aclosing(self._loop.relay(counted())) as items:
            async for item in items:
                if report and isinstance(item, RequestResult):
                    for callback in self.on_result:
                        callback(item)
                yield item

    async def wait_done(self, timeout_s: float, waiting: Callable[[int], None]) -> None:
        """On the service loop: until no visitor's request runs (each is bounded by its max_tokens)."""
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            waiting(self.in_flight)
            await asyncio.sleep(WAIT_POLL_S)
