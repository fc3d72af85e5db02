"""Faults: a dead or hung engine is reported, its requests end, it comes back by itself;
a machine too small for the models is told so; nothing outlives the app.

The pure parts (back-off, exit words, the health verdicts, the resource
estimate) are tables; the rest drives real tiny engines: one service whose
vLLM server is killed with SIGKILL, then frozen with SIGSTOP, and an app.py
killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from engine_adapter.engine.client import EngineClient, RequestError
from engine_adapter.engine_config import EngineConfig
from engine_adapter.engine.launcher import EngineProcess, EngineStartError, free_port
from engine_adapter.records import RequestResult, Step
from engine_adapter.engine.resources import DISK_ENV, MEM_ENV, NotEnoughResources, check_resources, estimate
from engine_adapter.service.engine_service import EngineService
from engine_adapter.engine.supervise import group_members
from engine_adapter.engine.token_text import load_tokenizer
from engine_adapter.service.watchdog import Backoff, HealthJudge, WatchdogSettings, backoff_delay, describe_exit
from explorer.views.status import status_markdown
from tests.support.fixtures import tiny_config
from tests.support.app_process import start_app, wait_ready
from tests.support.processes import processes_mentioning, wait_gone



# --- back-off, exit words, verdicts (pure) ------------------------------------------------------

@pytest.mark.parametrize("attempt, base, cap, delay", [
    (1, 2, 60, 2), (2, 2, 60, 4), (3, 2, 60, 8), (4, 2, 60, 16), (5, 2, 60, 32),
    (6, 2, 60, 60), (7, 2, 60, 60), (500, 2, 60, 60), (1, 0.5, 3, 0.5), (4, 0.5, 3, 3),
])
def test_backoff_schedule(attempt, base, cap, delay):
    assert backoff_delay(attempt, base, cap) == delay


def test_backoff_counts_up_and_resets_after_a_healthy_period():
    b = Backoff(base_s=2, cap_s=60, healthy_reset_s=120)
    assert b.next(0.0) == (1, 2)  # first fault
    assert b.next(3.0) == (2, 4)  # the restart failed
    b.healthy(10.0)  # up again ...
    assert b.next(50.0) == (3, 8)  # ... but only 40 s: still counting
    b.healthy(60.0)
    assert b.next(60.0 + 120) == (1, 2)  # healthy for 2 minutes: a fresh count
    b.reset()
    assert b.next(0.0) == (1, 2)
    with pytest.raises(ValueError):
        backoff_delay(0)


@pytest.mark.parametrize("code, words", [
    (128 + 9, "killed by signal 9 (SIGKILL)"),
    (128 + 15, "killed by signal 15 (SIGTERM)"),
    (128 + 11, "killed by signal 11 (SIGSEGV)"),
    (-9, "killed by signal 9 (SIGKILL)"),  # the supervisor itself
    (1, "exited with code 1"),
    (0, "exited with code 0"),
])
def test_exit_status_in_words(code, words):
    assert words in describe_exit(code)


S = WatchdogSettings(hang_after_s=10, dead_after_503=2, stall_after_s=30)


def _verdicts(observations, attached=False):
    """observations: (t, returncode, health, in_flight, steps_seen) -> the kind of each verdict."""
    judge = HealthJudge(S, 0.0, attached=attached)
    out = []
    for t, rc, health, in_flight, steps in observations:
        fault = judge.observe(t, returncode=rc, health=health, in_flight=in_flight, steps_seen=steps)
        out.append(fault.kind if fault else None)
    return out


@pytest.mark.parametrize("observations, kinds", [
    ([(1, None, 200, 0, 0), (2, 137, None, 0, 0)], [None, "exited"]),
    ([(1, None, 503, 0, 0), (2, None, 503, 0, 0)], [None, "dead"]),
    ([(1, None, 503, 0, 0), (2, None, 200, 0, 0), (3, None, 503, 0, 0)], [None, None, None]),
    # silent /health: a hang once 10 s passed since the last answer
    ([(1, None, 200, 0, 0), (5, None, None, 0, 0), (10, None, None, 0, 0), (11, None, None, 0, 0)],
     [None, None, None, "hung"]),
    ([(5, None, None, 0, 0), (9, None, 200, 0, 0), (18, None, None, 0, 0), (19, None, None, 0, 0)],
     [None, None, None, "hung"]),
    # requests in flight and no engine step for 30 s: stalled; steps moving or nothing in flight: fine
    ([(1, None, 200, 2, 5), (20, None, 200, 2, 5), (31, None, 200, 2, 5)], [None, None, "stalled"]),
    ([(1, None, 200, 2, 5), (20, None, 200, 2, 6), (45, None, 200, 2, 7)], [None, None, None]),
    ([(1, None, 200, 0, 5), (40, None, 200, 0, 5), (41, None, 200, 1, 5)], [None, None, None]),
    ([(1, None, 200, 2, None), (100, None, 200, 2, None)], [None, None]),  # no tap: no stall check
])
def test_health_verdicts(observations, kinds):
    assert _verdicts(observations) == kinds


def test_a_busy_server_streaming_tokens_is_not_hung():
    judge = HealthJudge(S, 0.0)
    # /health times out for 15 s, but the streams kept receiving until t=12: hung only 10 s after that
    verdicts = [judge.observe(t, returncode=None, health=None, http_t=min(t, 12.0)) for t in range(1, 23)]
    assert [v.kind if v else None for v in verdicts].index("hung") == 21


# --- requests that lose their engine end with a plain message (a fake server, no vLLM) --------

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
            _one_step_then(client, lambda: loop.call_later(0.2, client.fail_all, "the engine stopped answering")),
            10)
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


# --- the recovery loop, on an attached fake server (no vLLM): fault, failed retries, back, give up ---

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
        bodies = {"/v1/models": json.dumps({"data": [{"id": "m", "root": str(self.tokenizer_dir)}]}),
                  "/health": "", "/version": json.dumps({"version": "fake"})}
        body = bodies.get(path)
        status = "200 OK" if body is not None else "404 Not Found"
        body = (body or "").encode()
        writer.write(f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                     + body)
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


# --- not enough memory or disk --------------------------------------------------------------------

def test_not_enough_memory_is_refused_before_anything_starts(tiny, monkeypatch):
    monkeypatch.setenv(MEM_ENV, "0.5")  # pretend the machine has half a GiB free
    cfg = tiny_config(tiny, "draft", "same")
    proc = EngineProcess(cfg, resolve=Path)
    with pytest.raises(EngineStartError) as err:
        proc.start(timeout_s=60)
    text = str(err.value)
    assert "not enough free memory" in text and "0.5 GiB is available" in text
    assert "needs about 2.5 GiB" in text  # tiny weights + 1 GiB KV cache + 1.5 GiB for the processes
    assert "--kv-cache-gib" in text and "close other programs" in text
    assert proc.pid is None  # refused before vLLM was started


def test_not_enough_disk_for_the_packaged_models_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_EXPLORER_CACHE", str(tmp_path / "cache"))  # nothing converted there yet
    monkeypatch.setenv(DISK_ENV, "1")
    cfg = EngineConfig(method="draft", target="packaged:1.5b", draft="packaged:0.5b")
    need = estimate(cfg)
    assert need.build == ["packaged:1.5b", "packaged:0.5b"]
    with pytest.raises(EngineStartError) as err:
        EngineProcess(cfg).start(timeout_s=60)
    text = str(err.value)
    assert "not enough free disk space to prepare packaged:1.5b and packaged:0.5b" in text
    assert f"{need.disk_bytes / (1 << 30):.1f} GiB in {tmp_path / 'cache'}" in text and "1.0 GiB is free" in text


def test_resource_estimate_counts_the_draft_only_for_the_draft_method(tiny):
    off = estimate(tiny_config(tiny, "off"))
    draft = estimate(tiny_config(tiny, "draft", "random"))
    assert [r for r, _, _ in off.models] == ["target"] and [r for r, _, _ in draft.models] == ["target", "draft"]
    assert draft.memory_bytes > off.memory_bytes > (1 + 1.5) * (1 << 30)
    check_resources(tiny_config(tiny, "draft"), available=64 << 30)  # plenty: no error
    with pytest.raises(NotEnoughResources):
        check_resources(tiny_config(tiny, "draft"), available=1 << 30)


def test_the_page_says_what_is_missing(tiny, monkeypatch):
    monkeypatch.setenv(MEM_ENV, "0.5")
    svc = EngineService()
    try:
        svc.start(tiny_config(tiny, "off")).result(timeout=60)
        st = svc.status()
        assert st.state == "failed" and "not enough free memory" in st.error
        assert "Engine failed to start" in status_markdown(svc) and "0.5 GiB is available" in status_markdown(svc)
    finally:
        svc.close()


# --- a real engine dies, hangs, comes back ---------------------------------------------------------

BG_PROMPTS = ["def add(a, b):", "The quick brown fox"]


@pytest.fixture(scope="module")
def service(tiny):
    svc = EngineService(background_prompts=BG_PROMPTS, background_max_tokens=64, session_idle_s=3600)
    svc.start(tiny_config(tiny, "draft", "same"))
    yield svc
    svc.close()
    assert wait_gone(str(tiny.same), 30) == [], "an engine outlived the service"


def _wait(service: EngineService, states: set[str], timeout_s: float, min_generation: int = 0):
    """Until the service is in one of ``states`` (with an engine of at least ``min_generation``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = service.status()
        if st.state in states and st.generation >= min_generation:
            return st
        time.sleep(0.2)
    st = service.status()
    pytest.fail(f"service state {st.state} ({st.error}; {st.progress}), wanted {states}")


def _vllm_server_pid(service: EngineService, timeout_s: float = 30) -> tuple[int, int]:
    """(process group of the engine, pid of its vLLM API server), once the engine is ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        _wait(service, {"ready"}, 300)
        pgid = service._engine.process.pid
        for pid in group_members(pgid):
            with contextlib.suppress(FileNotFoundError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if pid != pgid and b"vllm.entrypoints.openai.api_server" in cmd:  # not its supervisor
                    return pgid, pid
        if time.monotonic() > deadline:
            raise AssertionError(f"no vLLM API server in the engine's group: {service.status()}, "
                                 f"faults seen {service.guard.faults}")
        time.sleep(0.5)


class FinishedBeforeTheFault(AssertionError):
    """The whole answer had left the server before the fault bit."""


async def _fault_under_a_request(service: EngineService, fault) -> tuple[Exception, float]:
    """Run a long foreground request, apply ``fault`` after its first step; (error, seconds to it)."""
    t_fault = None
    try:
        async for item in service.stream("Once upon a time there was", max_tokens=900, temperature=0.0):
            if t_fault is None:
                fault()
                t_fault = time.monotonic()
    except Exception as e:
        assert t_fault is not None, f"the request failed before the fault: {e}"
        return e, time.monotonic() - t_fault
    raise FinishedBeforeTheFault("the request finished normally in spite of the fault")


async def _serves_a_request(service: EngineService) -> RequestResult:
    result = None
    async for item in service.stream("def add(a, b):", max_tokens=16, temperature=0.0):
        result = item
    assert isinstance(result, RequestResult) and result.token_ids
    return result


async def test_a_killed_engine_is_reported_ends_its_requests_and_comes_back(service):
    assert await service.set_background(2) == 2
    for _ in range(3):
        _wait(service, {"ready"}, 300)
        gen = service.status().generation
        pgid, server = _vllm_server_pid(service)
        try:
            err, took = await _fault_under_a_request(service, lambda: os.kill(server, signal.SIGKILL))
            break
        except FinishedBeforeTheFault:
            # The whole answer reached the socket before the kill landed (a busy 2-core
            # machine can delay the first item that long): wait out that restart, try again.
            _wait(service, {"ready"}, 240, min_generation=gen + 1)
    else:
        pytest.fail("three requests in a row finished before the kill reached the engine")
    assert isinstance(err, RequestError) and "engine" in str(err), err
    assert took < 5, f"the request took {took:.1f} s to end"
    # the page says so within seconds, with the cause, the countdown and the attempt
    st = _wait(service, {"restarting"}, 5)
    assert "killed by signal 9 (SIGKILL)" in st.error and "restarting in" in st.error and "attempt 1" in st.error
    assert "Engine down, restarting" in status_markdown(service)
    # it comes back by itself, with its background load, and serves
    st = _wait(service, {"ready"}, 240)
    assert st.generation == gen + 1 and "SIGKILL" in st.fault
    assert "Restarted by itself after" in status_markdown(service)
    assert group_members(pgid) == [], "the dead engine's group was not cleaned up"
    assert service.background_stats().target == 2
    await _serves_a_request(service)
    await service.set_background(0)


async def test_a_hung_engine_is_killed_and_restarted(service):
    _wait(service, {"ready"}, 300)
    gen = service.status().generation
    await service.set_background(2)  # slower steps, so the long request is still running when frozen
    pgid, server = _vllm_server_pid(service)
    try:
        try:
            err, took = await _fault_under_a_request(service, lambda: os.kill(server, signal.SIGSTOP))
        except FinishedBeforeTheFault:
            # A fast machine can hand the whole answer to the socket before the freeze
            # bites; a request sent to the frozen server is then the one under the hang.
            t0 = time.monotonic()
            with pytest.raises(RequestError) as caught:
                await _serves_a_request(service)
            err, took = caught.value, time.monotonic() - t0
        # hang_after_s (10 s) of silence on /health, plus a check or two
        assert isinstance(err, RequestError) and "stopped answering" in str(err), err
        assert took < 20, f"the hang took {took:.1f} s to be noticed"
        st = service.status()
        assert st.state in ("restarting", "starting") and "stopped answering" in st.fault and "killed" in st.fault
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert group_members(pgid) == [], "the hung engine was not killed"
        st = _wait(service, {"ready"}, 240)
        assert st.generation == gen + 1
        await _serves_a_request(service)
    finally:
        if server in group_members(pgid):  # never leave a frozen process behind (and never a reused pid)
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server, sig)
        await service.set_background(0)


async def test_a_user_restart_during_the_back_off_wins(service, tiny):
    _wait(service, {"ready"}, 300)
    service.guard.settings.backoff_base_s = 30  # a long wait, so the user's restart comes first
    try:
        _, server = _vllm_server_pid(service)
        os.kill(server, signal.SIGKILL)
        st = _wait(service, {"restarting"}, 10)
        gen = st.generation
        await service.restart(tiny_config(tiny, "draft", "same", k=2))
        st = service.status()
        assert st.state == "ready" and st.generation == gen + 1 and st.fault is None and st.config.k == 2
        await asyncio.sleep(2)  # the guard's recovery gave up its turn: no second restart
        assert service.status().generation == gen + 1
    finally:
        service.guard.settings.backoff_base_s = 2


# --- nothing outlives the app, however it exits ----------------------------------------------------

def test_no_engine_survives_a_sigkilled_app(tiny, tmp_path):
    marker = str(tiny.random)  # only this test starts an engine on it
    app = start_app(["--method", "off", "--target", marker, "--dtype", "float32", "--max-model-len", "1024",
                     "--kv-cache-gib", "1"], tmp_path / "app.log")
    try:
        wait_ready(app, lambda status: "● **Engine ready**" in status)
        assert len(processes_mentioning(marker)) >= 2  # the supervisor and vLLM's server (+ engine core)
        app.proc.send_signal(signal.SIGKILL)  # no clean-up code of ours runs
        app.proc.wait()
        assert wait_gone(marker, 30) == [], "the engine outlived a SIGKILLed app"
    finally:
        if app.proc.poll() is None:
            os.killpg(app.proc.pid, signal.SIGKILL)