"""Run processes under a memory limit and measure their peak: for scripts that start the app as a
host with a fixed amount of memory would (scripts/space_start.py).

Contract: ``memory_guard(limit_bytes)`` gives a ``Memory``: ``wrap(cmd)`` is the command line that
runs ``cmd`` under the limit, ``track(pid)`` follows a started process and its descendants,
``peak()`` is the peak in bytes since ``reset_peak()``, ``peak_rss`` the largest sampled sum of
their RSS (shared pages count once per process), ``alive()`` / ``kill_all()`` what is still
running (orphans included), ``oom_kills()`` the kernel's kills at the limit (None: not known),
``how`` says which way was used, ``close()`` stops sampling and removes what it made.
The ways, first that works: a cgroup v1 memory group made for the run under this process's own
memory group (the kernel holds the limit; ``memory.max_usage_in_bytes`` is the peak of all its
processes together, page cache included); else sampling the summed RSS of the tracked process
trees with psutil every 0.5 s and killing them all above the limit (``exceeded``).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import psutil

GIB = 1 << 30


class Memory:
    """The processes a caller starts: their memory limit, their peak, and killing what is left.

    This base class samples the summed RSS of the tracked process trees (``peak_rss``, bytes) and,
    when ``enforces``, kills them all above the limit (``exceeded``)."""

    how = "psutil: summed RSS of the process tree every 0.5 s; the tree is killed above the limit"
    enforces = True

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.peak_rss = 0  # bytes, the largest sampled sum since reset_peak
        self.exceeded = False
        self._roots: list[int] = []
        self._seen: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def wrap(self, cmd: list[str]) -> list[str]:
        """The command line that runs ``cmd`` under this limit."""
        return cmd

    def track(self, pid: int) -> None:
        self._roots.append(pid)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for root in self._roots:
            try:
                p = psutil.Process(root)
                found |= {p.pid, *(c.pid for c in p.children(recursive=True))}
            except psutil.Error:
                pass
        return found

    def alive(self) -> list[psutil.Process]:
        """Every process of ours still running, those that left the tree (orphans) included."""
        for pid in self.pids():
            try:
                self._seen.setdefault(pid, psutil.Process(pid))
            except psutil.Error:
                pass
        return [p for p in list(self._seen.values()) if _running(p)]

    def peak(self) -> int:
        """Peak bytes since ``reset_peak``."""
        return self.peak_rss

    def reset_peak(self) -> None:
        self.peak_rss = 0

    def oom_kills(self) -> int | None:
        return None

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            total = 0
            for proc in self.alive():
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak_rss = max(self.peak_rss, total)
            if self.enforces and total > self.limit:
                self.exceeded = True
                self.kill_all()

    def kill_all(self) -> int:
        """SIGKILL every process of ours still running; how many there were."""
        alive = self.alive()
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        return len(alive)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _running(p: psutil.Process) -> bool:
    """Running, and not a zombie waiting for its parent (or init) to reap it."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class CgroupV1Memory(Memory):
    """A memory group of its own, under this process's cgroup v1 memory group: the kernel holds the
    limit, and ``memory.max_usage_in_bytes`` is the peak of all its processes together."""

    enforces = False

    def __init__(self, limit_bytes: int) -> None:
        line = next(ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in ln)
        parent = Path("/sys/fs/cgroup/memory") / line.split(":", 2)[2].lstrip("/")
        self.dir = parent / f"space-start-{os.getpid()}"
        self.dir.mkdir()
        try:
            (self.dir / "memory.limit_in_bytes").write_text(str(limit_bytes))
            if int((self.dir / "memory.limit_in_bytes").read_text()) > limit_bytes:
                raise OSError("memory.limit_in_bytes did not take the limit")
        except OSError:
            self.dir.rmdir()
            raise
        self.how = f"cgroup v1 memory group {self.dir} (memory.limit_in_bytes; peak: memory.max_usage_in_bytes)"
        super().__init__(limit_bytes)

    def wrap(self, cmd: list[str]) -> list[str]:
        # the shell joins the group, then becomes the command (same PID): its children inherit the group
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.dir), *cmd]

    def pids(self) -> set[int]:
        try:
            return {int(p) for p in (self.dir / "cgroup.procs").read_text().split()}
        except OSError:
            return set()

    def peak(self) -> int:
        return int((self.dir / "memory.max_usage_in_bytes").read_text())

    def reset_peak(self) -> None:
        (self.dir / "memory.max_usage_in_bytes").write_text("0")
        super().reset_peak()

    def oom_kills(self) -> int | None:
        m = re.search(r"^oom_kill (\d+)", (self.dir / "memory.oom_control").read_text(), re.M)
        return int(m.group(1)) if m else None

    def close(self) -> None:
        super().close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.dir.rmdir()
                return
            except OSError:  # processes still leaving
                self.kill_all()
                time.sleep(0.5)


def memory_guard(limit_bytes: int) -> Memory:
    """A cgroup v1 memory group where one can be made, else psutil sampling (module docstring)."""
    try:
        return CgroupV1Memory(limit_bytes)
    except (OSError, StopIteration, ValueError) as e:
        print(f"memory_limit: no cgroup v1 memory group ({e}); sampling RSS with psutil", file=sys.stderr)
        return Memory(limit_bytes)
