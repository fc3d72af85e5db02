"""Start (or attach to) a vLLM OpenAI-compatible server, and never orphan it.

Contract:
- ``EngineProcess(config).start(progress)`` resolves the models, starts vLLM's
  server as a child on 127.0.0.1 (a free port unless one is given) under
  ``engine_adapter.engine.supervise`` in its own process group, reports start-up
  progress as ``StartProgress`` records, and returns once ``/health`` answers.
  Failure raises ``EngineStartError`` with a message naming the cause (bad
  model path, port taken, out of memory, ...) and leaves no process behind.
  A port the launcher chose that another program took before vLLM bound it (two engines
  starting at once, or any program's connection) is chosen again, up to ``PORT_ATTEMPTS``
  starts of vLLM in all; a port given by the caller is never changed.
  Memory and disk are checked first (``engine_adapter.engine.resources``): a machine
  too small for the models is told so before anything is started.
- The server takes requests only with ``api_key`` (a fresh random key per launch, handed to
  vLLM in its environment, ``VLLM_API_KEY``, never on its command line, which any local user
  can read; vLLM checks it on ``/v1/*``) and allows no cross-origin access
  (``--allowed-origins []``): another local process or a web page cannot use the engine
  around the app's limits.
- ``reserve_bytes``: host memory the resource check leaves free for others (the twin's check
  keeps the main engine's KV cache, mapped but not yet committed, out of what is free).
- ``stop()`` ends the whole process group (API server, engine core, worker).
  If the app dies, the supervisor sees its stdin pipe close and does the same.
- The platform (``engine.platform``: vLLM's CPU build, or its CUDA build on a GPU) is
  ``EngineProcess(platform=...)``, detected once at construction when not given, and
  handed explicitly to the resource check, ``server_args`` and ``engine_env``.
- The environment the engine needs (``engine_env``) is set here, not by hand: on CPU
  LD_PRELOAD of the bundled OpenMP, the KV-cache size and the reserved cores; on CUDA
  none of those (the KV cache is an argument there); on both the offline hub and, while
  our plugin is loaded, Model Runner V1 (the plugin wraps V1's ``drafter``).
- A failed start is explained in words (``start_log.explain_failure``), CUDA's failures
  included, with what to change; start-up progress comes from ``start_log.milestones_seen``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from engine_adapter.engine.platform import Platform, detect_platform
from engine_adapter.engine.resources import NotEnoughResources, check_resources
from engine_adapter.engine.roofline import machine_bandwidth_gbs, worker_cores
from engine_adapter.engine.server_args import server_args
from engine_adapter.engine.start_log import (
    ProgressFn,
    StartProgress,
    explain_failure,
    milestones_seen,
    port_taken_in,
)
from engine_adapter.engine.supervise import children_of, group_members
from engine_adapter.engine_config import FULL_VARIANT, LIBRARY_LIMITS, EngineConfig, isa_limit
from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.vllm_plugin.paths import SERVER_MODULE, STARTUP_DIR
from engine_adapter.vllm_plugin.wire import CATCH_UP_TOKENS_ENV, CONTROL_ADDR_ENV, TAP_ADDR_ENV


class EngineStartError(RuntimeError):
    """The engine did not come up; the message says why, in words."""


class PortTakenDuringStart(EngineStartError):
    """vLLM could not bind its port: another program took it after the launch chose it."""


PORT_ATTEMPTS = 3  # starts of vLLM on ports the launcher chose, before a taken port is an error


LOG_TAIL_LINES = 15  # lines of an engine's log a message quotes when it failed or died


def log_tail(log: str, lines: int) -> str:
    """The last ``lines`` lines of ``log`` (surrounding blank space dropped)."""
    return "\n".join(log.strip().splitlines()[-lines:])


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


# the variables only vLLM's CPU build reads (``envs.py``); never handed to a CUDA engine
CPU_ONLY_ENV_PREFIX = "VLLM_CPU_"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # vLLM 0.32's envs.py; "0" pins Model Runner V1


API_KEY_ENV = "VLLM_API_KEY"  # vLLM's envs.py: the key its server checks on /v1/* (no --api-key given)


def engine_env(
    config: EngineConfig,
    tap_addr: str | None,
    control_addr: str | None,
    platform: Platform,
    api_key: str | None = None,
) -> dict[str, str]:
    """The engine's environment: this process's, with what ``platform`` needs (module docstring)."""
    env = dict(os.environ)
    env.pop(API_KEY_ENV, None)
    if api_key:
        env[API_KEY_ENV] = api_key
    if platform.is_gpu:
        for name in [n for n in env if n.startswith(CPU_ONLY_ENV_PREFIX)]:
            del env[name]  # the KV cache and the cores are the CPU build's: meaningless on a GPU
        # CUDA's device 0 is then the GPU nvidia-smi described (platform.visible_gpu): PCI order
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    else:
        iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
        if iomp.exists():  # vllm-cpu's bundled OpenMP must be preloaded
            env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(config.kv_cache_gib))  # GiB
        if isa_limit() is not None:  # run as the AVX2 kind: the libraries' AVX2 code (sitecustomize: torch's probes)
            env.update(LIBRARY_LIMITS)
        if config.reserved_cpus is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(config.reserved_cpus)
    env["HF_HUB_OFFLINE"] = "1"  # models are local directories by now
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    # the engine core must import engine_adapter.vllm_plugin (its schedulers and worker); every Python
    # process of the engine runs STARTUP_DIR's sitecustomize.py first (torch's mismatched companions
    # hidden before transformers is imported, in the subprocesses vLLM starts by module name too)
    root = str(PROJECT_ROOT)
    env["PYTHONPATH"] = ":".join(p for p in (str(STARTUP_DIR), root, env.get("PYTHONPATH", "")) if p)
    if config.tap:
        # the plugin (tap scheduler, verifier and idle-drafter workers) is written against Model
        # Runner V1, whose runner has the ``drafter``; vLLM 0.32 picks V2 on CUDA for draft_model
        # and ngram (config/vllm.py, use_v2_model_runner)
        env[V2_RUNNER_ENV] = "0"
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


def compute_processes(supervisor_pid: int) -> list[int]:
    """The engine's processes that compute (vLLM's engine core, its worker, the supervisor): every
    member of the supervisor's process group but vLLM's API server, the supervisor's own child.
    The API server stays at the caller's priority: it takes every request in and streams every
    token out, and behind the engine core (which spins while it waits for the worker) at an equal
    nice it started requests 0.1-0.3 s late (docs/benchmarks.md, "the API server's priority")."""
    server = set(children_of(supervisor_pid))
    return [pid for pid in group_members(supervisor_pid) if pid not in server]


class EngineProcess:
    """A vLLM server we started; use as a context manager or call stop()."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        port: int | None = None,
        log_path: Path | None = None,
        resolve: Callable[[str], Path] | None = None,
        platform: Platform | None = None,
        reserve_bytes: int = 0,
    ) -> None:
        config = config.checked()
        self.config = config
        self._platform = platform if platform is not None else detect_platform()
        self.port = port
        self._workdir = Path(tempfile.mkdtemp(prefix="spec-explorer-"))
        self.log_path = log_path or self._workdir / "vllm.log"
        self._exit_file = self._workdir / "vllm.exit"  # the supervisor writes vLLM's exit status here
        self.tap_addr = f"ipc://{self._workdir}/tap.sock" if config.tap else None
        live = config.tap and config.live_policies and config.method != "off"
        self.control_addr = f"ipc://{self._workdir}/control.sock" if live else None
        self._resolve = resolve
        self.reserve_bytes = reserve_bytes
        self._stop_asked = False  # ``stop`` was called: a ``spawn`` under way stops what it started
        self.api_key = secrets.token_urlsafe(24)  # the server's, for this launch only
        self._proc: subprocess.Popen | None = None
        self._keep_log = log_path is not None
        self._log = None
        self.target_dir: Path | None = None
        self.draft_dir: Path | None = None
        self.bandwidth_gbs: float | None = None  # read bandwidth on the worker's cores (CPU; None: not known)

    @property
    def platform(self) -> Platform:
        """The machine this engine runs on (given, or detected once at construction)."""
        return self._platform

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

    def death_note(self, lines: int = LOG_TAIL_LINES) -> str | None:
        """None while the engine runs (or never started); once it died, its exit status (as
        ``returncode``) and the last ``lines`` lines of its log, for a message that says why."""
        if self._proc is None or self._proc.poll() is None:
            return None
        try:
            tail = log_tail(self.log_path.read_text(errors="replace"), lines)
        except OSError as e:
            tail = f"(its log could not be read: {e})"
        return f"exit status {self.returncode}; the last lines of its log ({self.log_path}):\n{tail}"

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
        if self.config.variant != FULL_VARIANT:
            self._quantised_models(report)

    def _measure_bandwidth(self, report: ProgressFn) -> None:
        """The read bandwidth on the worker's cores, for the page's roofline: measured once per machine
        (a few seconds, before vLLM runs), then read from the model cache. A failure leaves it unknown."""
        if self._platform.is_gpu:
            return
        from engine_adapter.engine.models import default_cache_dir

        report(StartProgress("models", 0.28, "the machine's read bandwidth (measured once per machine)"))
        try:
            self.bandwidth_gbs = machine_bandwidth_gbs(worker_cores(self.config.reserved_cpus), default_cache_dir())
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
            report(StartProgress("models", 0.28, f"the read bandwidth is not known: {e}"))

    def _quantised_models(self, report: ProgressFn) -> None:
        """The config's variant in place of the full models: their quantised copies, made on first use."""
        from engine_adapter.engine.models import default_cache_dir
        from engine_adapter.engine.variants import variant_models

        report(StartProgress("models", 0.25, f"the {self.config.variant} variant (a quantised copy is made once)"))
        target, draft = variant_models(
            self.config.variant, self.target_dir, self.draft_dir or self.target_dir, default_cache_dir()
        )
        self.target_dir, self.draft_dir = target, (draft if self.draft_dir is not None else None)

    def start(self, progress: ProgressFn | None = None, timeout_s: float = 900) -> None:
        """``prepare`` then ``spawn``: the models ready on disk, then vLLM serving."""
        self.prepare(progress)
        self.spawn(progress, timeout_s)

    def prepare(self, progress: ProgressFn | None = None) -> None:
        """Check the machine's resources and resolve the models (``target_dir``, ``draft_dir``)."""
        report = progress or (lambda p: None)
        try:
            # before a packaged model is converted onto a full disk, then with the sizes on disk
            check_resources(self.config, platform=self._platform, reserved=self.reserve_bytes)
            self._resolve_models(report)
            self._measure_bandwidth(report)
            check_resources(
                self.config, self.target_dir, self.draft_dir, platform=self._platform, reserved=self.reserve_bytes
            )
        except NotEnoughResources as e:
            self._cleanup_dir()
            raise EngineStartError(str(e)) from e
        except Exception as e:
            self._cleanup_dir()
            raise EngineStartError(f"could not prepare the models: {e}") from e

    def spawn(self, progress: ProgressFn | None = None, timeout_s: float = 900) -> None:
        """Start vLLM on the prepared models and wait until it serves (``EngineStartError`` if not,
        also when ``stop`` was called before or during it)."""
        report = progress or (lambda p: None)
        self._refuse_if_stopped()
        port_chosen_here = self.port is None
        if port_chosen_here:
            self.port = free_port()
        elif not port_is_free(self.port):
            self._cleanup_dir()
            raise EngineStartError(f"port {self.port} on 127.0.0.1 is already taken by another program")
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._serve(report, timeout_s)
                    return
                except PortTakenDuringStart:
                    if not port_chosen_here or attempt == PORT_ATTEMPTS or self._stop_asked:
                        raise
                self._start_again_on_another_port(report)
        except BaseException:
            self._fail_start()
            raise

    def _start_again_on_another_port(self, report: ProgressFn) -> None:
        """End the start whose port was taken (its processes and sockets; the next start clears its
        exit status and writes its log again) and choose another port."""
        self._end_group()
        self._cleanup_dir(keep_log=True)  # the sockets only
        taken, self.port = self.port, free_port()
        report(StartProgress("spawn", 0.3, f"port {taken} was taken meanwhile; starting vLLM on {self.port}"))

    def _fail_start(self) -> None:
        self._keep_log = self._keep_log or self.log_path.exists()  # the error message points at the log
        self.stop()

    def _serve(self, report: ProgressFn, timeout_s: float) -> None:
        """Start vLLM's server on ``self.port`` and wait until it serves. Raises if it does not, what
        it started left for the caller to stop (``stop`` asked meanwhile: stopped here)."""
        self._exit_file.unlink(missing_ok=True)  # an earlier start's exit status is not this one's
        draft_dir = str(self.draft_dir) if self.draft_dir else None
        args = server_args(self.config, str(self.target_dir), draft_dir, self.port, self._platform)
        cmd = [
            sys.executable,
            "-m",
            "engine_adapter.engine.supervise",
            "--exit-file",
            str(self._exit_file),
            "--",
            sys.executable,
            "-m",
            SERVER_MODULE,
            *args,
        ]
        self._log = open(self.log_path, "wb")
        report(StartProgress("spawn", 0.3, "starting vLLM"))
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,  # the supervisor's lifeline: closes when we die
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=engine_env(self.config, self.tap_addr, self.control_addr, self._platform, self.api_key),
            start_new_session=True,
            cwd=str(self._workdir),
        )
        self._refuse_if_stopped()  # ``stop`` may have come from another thread before the process existed
        self._wait_ready(report, timeout_s)
        # lowered once it serves: at start-up vLLM's imports would otherwise wait behind the app's
        lower_priority(compute_processes(self._proc.pid), self.config.nice)

    def _refuse_if_stopped(self) -> None:
        if self._stop_asked:
            self.stop()  # the process started since, if any
            raise EngineStartError("the engine was stopped during its start")

    def _wait_ready(self, report: ProgressFn, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        seen = 0
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                log = self.log_path.read_text(errors="replace")
                for i, milestone in milestones_seen(log, seen):
                    seen = i + 1
                    report(milestone)
                if self._proc.poll() is not None:
                    failure = PortTakenDuringStart if port_taken_in(log) else EngineStartError
                    raise failure(self._explain_failure(log))
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        report(StartProgress("ready", 1.0, f"server answering at {self.url}; checking the tap"))
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise EngineStartError(f"the engine did not become ready within {timeout_s:.0f} s; log: {self.log_path}")

    def _explain_failure(self, log: str) -> str:
        why = explain_failure(log, self.config, self._platform, self.port)
        if why is not None:
            return f"vLLM failed to start: {why}. Log: {self.log_path}"
        tail = log_tail(log, LOG_TAIL_LINES)
        return f"vLLM exited during start-up. Last lines of its log ({self.log_path}):\n{tail}"

    def stop(self, timeout_s: float = 20) -> None:
        """End the engine's whole process group; safe to call twice, and from another thread while
        ``spawn`` runs (a process it starts after this is stopped by ``spawn`` itself)."""
        self._stop_asked = True
        self._end_group(timeout_s)
        self._cleanup_dir(keep_log=self._keep_log)

    def _end_group(self, timeout_s: float = 20) -> None:
        """End the process group started last (SIGTERM, then SIGKILL) and close its log."""
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

    def _cleanup_dir(self, keep_log: bool = False) -> None:
        for name in ("tap.sock", "control.sock"):
            (self._workdir / name).unlink(missing_ok=True)
        if not keep_log:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
