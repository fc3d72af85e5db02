"""Find the processes a test started (by a path in their command line, or as an app's
descendants) and wait for them to end.

``descendants(pid)``: every process under ``pid`` now; ``wait_ended(pids, timeout_s)``: those of
``pids`` still running (not zombies) after waiting up to ``timeout_s`` for them to end; a test that
stops an app checks its own engines so, and is not misled by another app's on the same models.
``vllm_compute(pid)``: vLLM's engine-core and worker processes under ``pid``; ``paused(processes)``
holds them (SIGSTOP) for a ``with`` block and lets them go on (SIGCONT) however it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil


def processes_mentioning(needle: str) -> list[int]:
    """PIDs whose command line contains ``needle`` (this test process excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state != "Z":
            found.append(int(entry))
    return found


def wait_gone(needle: str, timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = processes_mentioning(needle)
        if not left:
            return []
        time.sleep(0.5)
    return processes_mentioning(needle)


def describe(pids: list[int]) -> str:
    """Each PID with its parent and the start of its command line (for a failure's message)."""
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        out.append(f"{pid} (parent {ppid}): {cmd}")
    return "; ".join(out) or "none left by now"


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_ended(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = [pid for pid in pids if _running(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [pid for pid in left if _running(pid)]
    return left


def vllm_compute(pid: int) -> list[psutil.Process]:
    """vLLM's engine-core and worker processes under ``pid`` (named ``VLLM::...``); not its API server."""
    try:
        under = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in under:
        with contextlib.suppress(psutil.Error):
            if "VLLM" in proc.name():
                found.append(proc)
    return found


@contextlib.contextmanager
def paused(processes: list[psutil.Process]) -> Iterator[None]:
    """``processes`` stopped (SIGSTOP) inside the block, continued (SIGCONT) however it ends."""
    try:
        for proc in processes:
            proc.send_signal(signal.SIGSTOP)
        yield
    finally:
        for proc in processes:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
