"""Faults on real tiny engines: one service whose vLLM server is killed with SIGKILL, then frozen with
SIGSTOP (reported, its requests end, it comes back by itself), a user's restart during the back-off, and
an app.py killed with SIGKILL (nothing outlives it)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import time
from pathlib import Path

import pytest

from engine_adapter.engine.client import RequestError
from engine_adapter.engine.supervise import group_members
from engine_adapter.records import RequestResult
from engine_adapter.service.engine_service import EngineService
from engine_adapter.vllm_plugin.paths import SERVER_MODULE
from explorer.views.status import status_markdown
from tests.support.app_process import start_app, wait_ready
from tests.support.fixtures import tiny_config
from tests.support.processes import processes_mentioning, wait_gone

BG_PROMPTS = ["def add(a, b):", "The quick brown fox"]


@pytest.fixture(scope="module")
def service(tiny):
    svc = EngineService(background_prompts=BG_PROMPTS, background_max_tokens=64, session_idle_s=3600)
    svc.start(tiny_config(tiny, "draft", "same"))
    yield svc
    svc.close()
    assert wait_gone(str(tiny.same), 30) == [], "an engine outlived the service"
    assert gc.get_freeze_count() == 0, "the closed engine's objects are still frozen (out of the collector's reach)"


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


def test_a_ready_engines_start_up_heap_is_out_of_the_collectors_way(service):
    """gc.freeze at ready: full collections of the start-up heap stalled the page's event loop."""
    _wait(service, {"ready"}, 300)
    assert gc.get_freeze_count() > 0


def _vllm_server_pid(service: EngineService, timeout_s: float = 30) -> tuple[int, int]:
    """(process group of the engine, pid of its vLLM API server), once the engine is ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        _wait(service, {"ready"}, 300)
        pgid = service._engine.process.pid
        for pid in group_members(pgid):
            with contextlib.suppress(FileNotFoundError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if pid != pgid and SERVER_MODULE.encode() in cmd:  # not its supervisor
                    return pgid, pid
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no vLLM API server in the engine's group: {service.status()}, faults seen {service.guard.faults}"
            )
        time.sleep(0.5)


class FinishedBeforeTheFault(AssertionError):
    """The whole answer had left the server before the fault bit."""


async def _fault_under_a_request(service: EngineService, fault) -> tuple[Exception, float]:
    """Run a long foreground request, apply ``fault`` after its first step; (error, seconds to it)."""
    t_fault = None
    try:
        async for _item in service.stream("Once upon a time there was", max_tokens=900, temperature=0.0):
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
            err, took = await _fault_under_a_request(service, lambda pid=server: os.kill(pid, signal.SIGKILL))
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


def test_no_engine_survives_a_sigkilled_app(tiny, tmp_path):
    marker = str(tiny.random)  # only this test starts an engine on it
    app = start_app(
        ["--method", "off", "--target", marker, "--dtype", "float32", "--max-model-len", "1024", "--kv-cache-gib", "1"]
        + ["--reserved-cpus", "1"],
        tmp_path / "app.log",
    )
    try:
        wait_ready(app, lambda status: "● **Engine ready**" in status)
        assert len(processes_mentioning(marker)) >= 2  # the supervisor and vLLM's server (+ engine core)
        app.proc.send_signal(signal.SIGKILL)  # no clean-up code of ours runs
        app.proc.wait()
        assert wait_gone(marker, 30) == [], "the engine outlived a SIGKILLed app"
    finally:
        if app.proc.poll() is None:
            os.killpg(app.proc.pid, signal.SIGKILL)
