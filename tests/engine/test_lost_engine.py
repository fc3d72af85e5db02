"""A request that loses its engine ends with a plain message; an attached server that goes away is
reattached, and recovery gives up after its attempts (a fake vLLM server on loopback, a real tokenizer)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest

from engine_adapter.engine.client import EngineClient, RequestError
from engine_adapter.engine.launcher import free_port
from engine_adapter.engine.token_text import load_tokenizer
from engine_adapter.records import Step
from engine_adapter.service.engine_service import EngineService
from engine_adapter.service.watchdog import WatchdogSettings
from explorer.views.status import status_markdown


async def _fake_engine(mode: str):
    """An HTTP server that streams one token, then hangs or drops the connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        line = b'data: {"choices": [{"token_ids": [65], "text": "x", "finish_reason": null}]}\n\n'
        writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        await writer.drain()
        if mode == "close":
            writer.transport.abort()
            return
        await asyncio.sleep(3600)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _one_step_then(client: EngineClient, action=None) -> RequestError:
    got_step = False
    with pytest.raises(RequestError) as err:
        async for item in client.generate("hi", max_tokens=10):
            assert isinstance(item, Step)
            got_step = True
            if action:
                action()
    assert got_step
    return err.value


async def test_a_dropped_connection_ends_the_request_with_a_plain_message(tiny):
    server, url = await _fake_engine("close")
    client = EngineClient(url, load_tokenizer(tiny.target), model="m")
    try:
        t0 = time.monotonic()
        err = await asyncio.wait_for(_one_step_then(client), 10)
        assert "closed the connection in the middle of the request" in str(err)
        assert time.monotonic() - t0 < 5 and client.in_flight == 0
    finally:
        await client.close()
        server.close()


async def test_fail_all_ends_a_hanging_request_at_once(tiny):
    server, url = await _fake_engine("hang")
    client = EngineClient(url, load_tokenizer(tiny.target), model="m")
    try:
        # the stream hangs after one token; the watchdog's fail_all ends it
        loop = asyncio.get_running_loop()
        err = await asyncio.wait_for(
            _one_step_then(client, lambda: loop.call_later(0.2, client.fail_all, "the engine stopped answering")), 10
        )
        assert str(err) == "the engine stopped answering" and client.in_flight == 0
    finally:
        await client.close()
        server.close()


async def test_no_engine_at_all_is_said_plainly(tiny):
    url = f"http://127.0.0.1:{free_port()}"
    client = EngineClient(url, load_tokenizer(tiny.target), model="m")
    try:
        with pytest.raises(RequestError, match="could not reach the engine"):
            async for _ in client.generate("hi", max_tokens=4):
                pass
    finally:
        await client.close()


class FakeVllm:
    """Answers /v1/models, /health and /version like a vLLM server; stop() and start() it at will."""

    def __init__(self, tokenizer_dir: Path) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        path = head.split()[1]
        bodies = {
            "/v1/models": json.dumps({"data": [{"id": "m", "root": str(self.tokenizer_dir)}]}),
            "/health": "",
            "/version": json.dumps({"version": "fake"}),
        }
        body = bodies.get(path)
        status = "200 OK" if body is not None else "404 Not Found"
        body = (body or "").encode()
        writer.write(f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def stop(self) -> None:
        self._server.close()
        await self._server.wait_closed()


async def _await_state(service: EngineService, states: set[str], timeout_s: float):
    """Like _wait, but lets this loop (where a fake server may run) go on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.status().state in states:
            return service.status()
        await asyncio.sleep(0.05)
    st = service.status()
    pytest.fail(f"service state {st.state} ({st.error}), wanted {states}")


FAST = dict(interval_s=0.2, health_timeout_s=0.5, hang_after_s=1.0, backoff_base_s=0.5, backoff_cap_s=1.0)


async def test_an_attached_server_that_goes_away_is_reattached_after_failed_tries(tiny):
    fake = FakeVllm(tiny.target)
    await fake.start()
    svc = EngineService()
    svc.guard.settings = WatchdogSettings(**FAST)
    try:
        svc.attach(fake.url, str(tiny.target))
        st = await _await_state(svc, {"ready"}, 30)
        gen = st.generation
        await fake.stop()
        st = await _await_state(svc, {"restarting"}, 10)
        assert "the attached vLLM server stopped answering" in st.error and "attempt 1" in st.error
        assert "it was killed" not in st.error  # not ours to kill
        # the first re-attach fails (nobody answers), and says so; the next try is attempt 2
        deadline = time.monotonic() + 10
        while "restart attempt 1 failed" not in (svc.status().error or "") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        st = svc.status()
        assert st.state == "restarting" and "no vLLM server answers" in st.error and "(attempt 2)" in st.error, st
        await fake.start()
        st = await _await_state(svc, {"ready"}, 15)
        assert st.generation >= gen + 2 and "stopped answering" in st.fault and st.attached
        assert "Restarted by itself after" in status_markdown(svc)
    finally:
        svc.close()
        with contextlib.suppress(Exception):
            await fake.stop()


async def test_recovery_gives_up_after_max_attempts(tiny):
    fake = FakeVllm(tiny.target)
    await fake.start()
    svc = EngineService()
    svc.guard.settings = WatchdogSettings(**FAST, max_attempts=2)
    try:
        svc.attach(fake.url, str(tiny.target))
        await _await_state(svc, {"ready"}, 30)
        await fake.stop()
        await _await_state(svc, {"restarting"}, 10)
        deadline = time.monotonic() + 20
        while "gave up" not in (svc.status().error or "") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        st = svc.status()
        assert st.state == "failed" and "gave up after 2 restart attempts" in st.error
        assert "Engine down" in status_markdown(svc)
    finally:
        svc.close()
