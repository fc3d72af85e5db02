"""Engine watchdog: notice a dead or hung engine within seconds, restart it with back-off.

Contract (all of it runs on ``EngineService``'s own event loop):

- ``EngineGuard(service)``: ``watch(engine, generation)`` returns the task that
  checks the engine once a second; the service starts it every time an engine
  becomes ready and cancels it with the engine's other tasks (so an engine the
  user is restarting or stopping is never "recovered"). ``settings`` holds the
  thresholds (a ``WatchdogSettings``; tests shorten them).
- A fault is: the engine process exited (its exit code or signal, in words);
  vLLM's ``/health`` answering 503 (its engine core died); ``/health`` not
  answering, and no stream sending anything, for ``hang_after_s`` (a hang: the
  process group is killed, after the requests are ended);
  requests in flight but no engine step through the tap for ``stall_after_s``
  (an engine core that hangs while the HTTP server still answers).
- On a fault the service status becomes ``restarting`` with the cause, the
  countdown and the attempt; every in-flight request of the engine ends at
  once with that message (``EngineClient.fail_all``); then the engine is
  restarted with the configuration it had (the background load is restored by
  the service's restart), after ``backoff_delay(attempt)`` seconds: 2, 4, 8, ...
  capped at 60; the count starts again once an engine stayed healthy for
  ``healthy_reset_s``. A restart that fails is retried the same way, up to
  ``max_attempts``; then the state is ``failed`` with the last error.
- A user's restart (or ``close()``) during the back-off wins: the recovery sees
  the service's generation change and stops.

Pure helpers (table-tested): ``backoff_delay``, ``Backoff``, ``describe_exit``,
``HealthJudge``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:  # no import cycle at run time
    from engine_adapter.engine.live_engine import LiveEngine


@dataclass
class WatchdogSettings:
    interval_s: float = 1.0  # one check a second
    health_timeout_s: float = 2.0  # one /health request
    hang_after_s: float = 10.0  # /health silent this long = hung
    dead_after_503: int = 2  # consecutive 503 answers = vLLM says its engine core is dead
    # requests in flight, no engine step this long = engine core hung; a whole step must fit: on an
    # AVX2 CPU in bf16 a prefill of 4 prompts took about 70 s (docs/benchmarks.md, "a CPU without AVX-512")
    stall_after_s: float = 300.0
    backoff_base_s: float = 2.0
    backoff_cap_s: float = 60.0
    healthy_reset_s: float = 120.0  # healthy this long: the next fault counts as attempt 1 again
    max_attempts: int = 10


def backoff_delay(attempt: int, base_s: float = 2.0, cap_s: float = 60.0) -> float:
    """Seconds to wait before restart ``attempt`` (1-based): base, 2 base, 4 base, ... <= cap."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1; got {attempt}")
    return min(cap_s, base_s * 2.0 ** min(attempt - 1, 62))


class Backoff:
    """Attempt counter for restarts; resets after an engine stayed healthy long enough."""

    def __init__(self, base_s: float = 2.0, cap_s: float = 60.0, healthy_reset_s: float = 120.0) -> None:
        self.base_s, self.cap_s, self.healthy_reset_s = base_s, cap_s, healthy_reset_s
        self.attempt = 0
        self._healthy_since: float | None = None

    def healthy(self, now: float) -> None:
        """An engine came up and is being watched from ``now``."""
        self._healthy_since = now

    def reset(self) -> None:
        self.attempt = 0
        self._healthy_since = None

    def next(self, now: float) -> tuple[int, float]:
        """The next (attempt, delay) after a fault or a failed restart at ``now``."""
        if self._healthy_since is not None and now - self._healthy_since >= self.healthy_reset_s:
            self.attempt = 0
        self._healthy_since = None
        self.attempt += 1
        return self.attempt, backoff_delay(self.attempt, self.base_s, self.cap_s)


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def describe_exit(returncode: int) -> str:
    """Words for the engine supervisor's exit status.

    The supervisor (engine_adapter.engine.supervise) exits with 128+S when vLLM was
    killed by signal S, like a shell; a negative code means the supervisor
    itself was killed by that signal.
    """
    sig = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 128 + 65 else None
    if sig is None:
        return f"the engine process exited with code {returncode}"
    name = _signal_name(sig)
    why = " (killed from outside, e.g. by `kill -9` or the out-of-memory killer)" if sig == signal.SIGKILL else ""
    return f"the engine process was killed by signal {sig} ({name}){why}"


@dataclass(frozen=True)
class Fault:
    kind: str  # "exited" | "dead" | "hung" | "stalled"
    message: str
    log: str | None = None  # the engine's log, kept for a look


class HealthJudge:
    """Turns one observation a second into a verdict: None (healthy so far) or a Fault."""

    def __init__(self, settings: WatchdogSettings, now: float, attached: bool = False) -> None:
        self.s = settings
        self.attached = attached
        self.last_ok = now
        self.n_503 = 0
        self.last_progress = now
        self._steps: int | None = None
        self._busy = False

    def observe(
        self,
        now: float,
        *,
        returncode: int | None,
        health: int | None,
        in_flight: int = 0,
        steps_seen: int | None = None,
        http_t: float | None = None,
    ) -> Fault | None:
        """``returncode``: None while the process runs (or unknown); ``health``: /health's
        status code, None when it did not answer in time or refused the connection;
        ``http_t``: when the server last sent a line on any stream (a busy server whose
        /health is slow is not hung)."""
        if returncode is not None:
            return Fault("exited", describe_exit(returncode))
        who = "the attached vLLM server" if self.attached else "the engine"
        if http_t is not None and http_t > self.last_ok:
            self.last_ok = http_t
        if health == 200:
            self.last_ok, self.n_503 = now, 0
        elif health == 503:
            self.n_503 += 1
            if self.n_503 >= self.s.dead_after_503:
                return Fault("dead", f"{who} reports its engine core dead (/health answers 503)")
        elif now - self.last_ok >= self.s.hang_after_s:
            return Fault("hung", f"{who} stopped answering (no reply to /health for {now - self.last_ok:.0f} s)")
        # a stalled engine core: requests wait, the HTTP server answers, no step comes through the tap
        if steps_seen is None:
            return None
        if in_flight <= 0:
            self._busy = False
            self._steps = steps_seen
            return None
        if not self._busy or steps_seen != self._steps:
            self._busy, self._steps, self.last_progress = True, steps_seen, now
            return None
        if now - self.last_progress >= self.s.stall_after_s:
            return Fault(
                "stalled",
                f"{who} stopped stepping ({in_flight} requests in flight, no engine step "
                f"for {now - self.last_progress:.0f} s)",
            )
        return None


async def watch_engine(
    engine: LiveEngine,
    settings: WatchdogSettings,
    *,
    clock=time.monotonic,
) -> Fault:
    """Check ``engine`` every ``interval_s`` until a fault, and return it."""
    proc = engine.process
    judge = HealthJudge(settings, clock(), attached=proc is None)
    async with httpx.AsyncClient(timeout=settings.health_timeout_s) as http:
        while True:
            await asyncio.sleep(settings.interval_s)
            rc = proc.returncode if proc is not None else None
            health = None
            if rc is None:
                try:
                    health = (await http.get(f"{engine.url}/health")).status_code
                except httpx.HTTPError:
                    health = None
                rc = proc.returncode if proc is not None else None  # it may have died meanwhile
            tap = engine.client.tap
            fault = judge.observe(
                clock(),
                returncode=rc,
                health=health,
                in_flight=engine.client.in_flight,
                steps_seen=tap.steps_seen if tap is not None else None,
                http_t=engine.client.last_chunk_t,
            )
            if fault is None:
                continue
            if proc is not None:
                proc.keep_log()  # the message points at it
                fault = Fault(fault.kind, fault.message, str(proc.log_path))
            return fault


class EngineGuard:
    """Watches the service's engine and brings it back after a fault.

    Drives the service through its narrow recovery API only: ``status()``,
    ``report_fault(...)`` and ``relaunch(expect_generation)``.
    """

    def __init__(self, service: Any, settings: WatchdogSettings | None = None) -> None:
        self.service = service
        self.settings = settings or WatchdogSettings()
        self.enabled = True
        self.backoff = Backoff(self.settings.backoff_base_s, self.settings.backoff_cap_s, self.settings.healthy_reset_s)
        self.faults: list[tuple[float, Fault]] = []  # (monotonic t, fault), for tests and the recorder
        self._recovery: asyncio.Task | None = None

    def watch(self, engine: LiveEngine, generation: int) -> asyncio.Task:
        """Start watching a ready engine (call on the service loop)."""
        self._sync()
        if self.service.status().fault is None:  # a user's (re)start: a fresh count
            self.backoff.reset()
        self.backoff.healthy(time.monotonic())
        return asyncio.get_running_loop().create_task(self._watch(engine, generation))

    def _sync(self) -> None:  # settings may be changed at any time (tests do)
        s = self.settings
        self.backoff.base_s, self.backoff.cap_s, self.backoff.healthy_reset_s = (
            s.backoff_base_s,
            s.backoff_cap_s,
            s.healthy_reset_s,
        )

    async def _watch(self, engine: LiveEngine, generation: int) -> None:
        if not self.enabled:
            return
        fault = await watch_engine(engine, self.settings)
        svc = self.service
        if svc.status().generation != generation or svc.status().state in ("idle", "stopped"):
            return  # the user restarted or stopped it meanwhile
        self.faults.append((time.monotonic(), fault))
        proc = engine.process
        hung = fault.kind != "exited" and proc is not None
        message = fault.message + ("; it was killed" if hung else "")
        stamp = time.strftime("%H:%M:%S")
        where = f"; its log: {fault.log}" if fault.log else ""
        cause = f"{message} (at {stamp}{where})"
        self._sync()
        attempt, delay = self.backoff.next(time.monotonic())
        svc.report_fault(
            state="restarting",
            fault=cause,  # the page says so at its next tick
            error=f"{cause}; restarting in {math.ceil(delay)} s (attempt {attempt})",
        )
        # requests first (their streams would end with a vaguer "connection closed"), then the process:
        engine.client.fail_all(f"{message}; the engine is restarting")
        if hung:  # a hung group ignores SIGTERM: end it now
            await asyncio.to_thread(proc.kill)
        self._recovery = asyncio.get_running_loop().create_task(self._recover(cause, generation, attempt, delay))

    async def _recover(self, cause: str, generation: int, attempt: int, delay: float) -> None:
        svc = self.service
        first = cause
        while True:
            if attempt > self.settings.max_attempts:
                svc.report_fault(state="failed", error=f"{cause}; gave up after {attempt - 1} restart attempts")
                return
            deadline = time.monotonic() + delay
            while (left := deadline - time.monotonic()) > 0:
                if svc.status().generation != generation:
                    return  # a user's restart or stop took over
                svc.report_fault(
                    state="restarting", error=f"{cause}; restarting in {math.ceil(left)} s (attempt {attempt})"
                )
                await asyncio.sleep(min(1.0, left))
            if svc.status().generation != generation:
                return
            await svc.relaunch(expect_generation=generation)
            st = svc.status()
            if st.state != "failed" or st.generation != generation + 1:
                return  # ready (a new watch runs), or someone else's restart
            generation = st.generation
            cause = f"{first}; restart attempt {attempt} failed: {st.error}"
            svc.report_fault(fault=cause)
            self._sync()
            attempt, delay = self.backoff.next(time.monotonic())

    async def stop(self) -> None:
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._recovery
            self._recovery = None
