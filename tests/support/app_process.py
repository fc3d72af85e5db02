"""Launch ``app.py`` as a user would, wait until it serves, stop it: one helper for tests and scripts.

Contract: ``start_app(args, log)`` runs ``python app.py --port <free> ARGS`` on
127.0.0.1 in its own session (so a kill reaches its engine too), output to
``log``; ``wait_ready(app, ready, timeout_s)`` polls until the web server
answers and, with ``ready``, until ``ready(/status text)`` holds, and returns a
``gradio_client.Client``; ``app.stop()`` sends Ctrl-C (SIGINT) and returns
whether the app exited by itself within the timeout (else its whole session
is SIGKILLed). ``running_app(args, log, ready, ...)`` is the three in a ``with``: it
yields ``(app, client)`` once ready, fails the test (``pytest.fail``) when the app never
gets ready or does not exit within ``stop_s`` of Ctrl-C, and stops it either way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from engine_adapter.engine.launcher import free_port
from engine_adapter.package_data import PROJECT_ROOT

ROOT = PROJECT_ROOT
# Debian's chromium, offline and in a container (DESIGN.md section 6), for tests and scripts
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def tiny_engine_args(target: Path, draft: Path) -> list[str]:
    """The engine arguments app.py and the record CLI share, for the tiny test models
    (tests/support/tiny_models.py) with the draft model method."""
    return [
        "--method",
        "draft",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--kv-cache-gib",
        "1",
    ]


def tiny_app_args(target: Path, draft: Path, *more: str) -> list[str]:
    """app.py's arguments for the tiny test models: ``tiny_engine_args`` with the worker on one
    core (vLLM's default), leaving the other to pytest, the app and chromium."""
    return [*tiny_engine_args(target, draft), "--reserved-cpus", "1", *more]


def engine_ready(status: str) -> bool:
    """Ready, and done measuring the cost model (profiling switches K under the requests)."""
    return "● **Engine ready**" in status and "Measuring the cost model" not in status


class AppNotReady(RuntimeError):
    pass


@dataclass
class AppProcess:
    proc: subprocess.Popen
    url: str
    log: Path

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 60.0) -> bool:
        if self.proc.poll() is not None:
            return True
        self.proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            return False


def start_app(args: list[str], log: Path, env: dict[str, str] | None = None) -> AppProcess:
    """``env``: variables set for the app on top of this process's (a cost-model cache, say)."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "app.py", "--port", str(port), *args],
            cwd=ROOT,
            env=os.environ | (env or {}),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return AppProcess(proc, f"http://127.0.0.1:{port}", log)


def wait_ready(
    app: AppProcess, ready: Callable[[str], bool] | None = engine_ready, timeout_s: float = 300.0, poll_s: float = 1.0
) -> Client:
    deadline = time.monotonic() + timeout_s
    client = None
    while time.monotonic() < deadline:
        if app.proc.poll() is not None:
            raise AppNotReady(f"the app exited ({app.proc.returncode}):\n{app.log_tail()}")
        try:
            if client is None and httpx.get(app.url, timeout=2).status_code == 200:
                client = Client(app.url, verbose=False)
            if client is not None and (ready is None or ready(client.predict(api_name="/status"))):
                return client
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(poll_s)
    raise AppNotReady(f"the app was not ready within {timeout_s:.0f} s:\n{app.log_tail()}")


@contextmanager
def running_app(
    args: list[str],
    log: Path,
    ready: Callable[[str], bool] | None = engine_ready,
    *,
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
    stop_s: float = 60.0,
) -> Iterator[tuple[AppProcess, Client]]:
    """``start_app``, ``wait_ready`` and ``stop`` around a test's use of the app."""
    app = start_app(args, log, env)
    try:
        try:
            client = wait_ready(app, ready, timeout_s=timeout_s, poll_s=0.5)
        except AppNotReady as e:
            pytest.fail(f"the app never got ready: {e}")
        yield app, client
    finally:
        if not app.stop(timeout_s=stop_s):
            pytest.fail(f"the app did not exit within {stop_s:.0f} s of Ctrl-C (SIGINT)")
