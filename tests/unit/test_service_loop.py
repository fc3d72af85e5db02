"""ServiceLoop: coroutines run on its own thread, an iterator there is read from the caller's
loop, and ``stop`` runs its last coroutine, then does nothing again."""

from __future__ import annotations

import asyncio
import threading

import pytest

from engine_adapter.service.service_loop import ServiceLoop


async def _thread_name() -> str:
    return threading.current_thread().name


async def _count(n: int):
    for i in range(n):
        yield i, threading.current_thread().name


def test_call_and_relay_run_on_the_service_thread() -> None:
    loop = ServiceLoop(name="test-service")

    async def caller() -> tuple[str, list]:
        return await loop.call(_thread_name()), [item async for item in loop.relay(_count(3))]

    try:
        name, items = asyncio.run(caller())
        assert name == "test-service"
        assert items == [(0, "test-service"), (1, "test-service"), (2, "test-service")]
        assert loop.submit(_thread_name()).result(timeout=5) == "test-service"
    finally:
        loop.stop(asyncio.sleep(0))


def test_stop_runs_the_last_coroutine_once_and_then_nothing() -> None:
    loop = ServiceLoop()
    ran: list[str] = []

    async def last(tag: str) -> None:
        ran.append(tag)

    loop.stop(last("first"))
    assert loop.closed
    loop.stop(last("second"))  # closed: the coroutine is closed unrun, no "never awaited" warning
    assert ran == ["first"]


def test_stop_returns_what_the_last_coroutine_raised_and_stops_all_the_same() -> None:
    loop = ServiceLoop()

    async def fails() -> None:
        raise RuntimeError("a step of the shutdown")

    failure = loop.stop(fails())
    assert isinstance(failure, RuntimeError) and "a step of the shutdown" in str(failure)
    assert loop.closed and not any(t.name == "engine-service" for t in threading.enumerate())
    late = ServiceLoop(name="slow-stop")
    assert isinstance(late.stop(asyncio.sleep(5), timeout_s=0.2), TimeoutError)
    assert loop.stop(asyncio.sleep(0)) is None  # stopped already: nothing ran, nothing failed


def test_an_error_on_the_service_loop_reaches_the_caller() -> None:
    loop = ServiceLoop()

    async def fails() -> None:
        raise ValueError("on the service loop")

    try:
        with pytest.raises(ValueError, match="on the service loop"):
            asyncio.run(loop.call(fails()))
    finally:
        loop.stop(asyncio.sleep(0))


async def _forever():
    i = 0
    while True:
        yield i
        i += 1
        await asyncio.sleep(0.01)


def test_a_caller_whose_loop_ended_is_sent_nothing_more(caplog) -> None:
    loop = ServiceLoop()

    async def reads_one_and_leaves() -> int:
        async for item in loop.relay(_forever()):
            return item
        return -1

    try:
        assert asyncio.run(reads_one_and_leaves()) == 0  # the caller's loop closes here
        loop.submit(asyncio.sleep(0.2)).result(timeout=5)  # the producer ends meanwhile
    finally:
        loop.stop(asyncio.sleep(0))
    assert "Event loop is closed" not in caplog.text, caplog.text
