"""The engine's CPU priority (``EngineConfig.nice``): a lower priority for vLLM's processes, checked."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from engine_adapter.engine.launcher import compute_processes, lower_priority
from engine_adapter.engine_config import EngineConfig


@pytest.mark.parametrize("nice, ok", [(0, True), (10, True), (19, True), (-1, False), (20, False)])
def test_nice_is_a_lower_priority_or_none(nice, ok):
    config = EngineConfig(method="off", nice=nice)
    if ok:
        config.checked()
    else:
        with pytest.raises(ValueError, match="nice must be between 0"):
            config.checked()


def test_every_thread_of_the_processes_is_lowered():
    """On Linux the nice value is per thread: a process's threads that exist are each lowered."""
    code = "import threading, time; [threading.Thread(target=time.sleep, args=(30,)).start() for _ in range(3)]"
    proc = subprocess.Popen([sys.executable, "-c", code + "; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lower_priority([proc.pid, 999_999_999], 7) == 4  # a process that is gone is skipped
        tids = os.listdir(f"/proc/{proc.pid}/task")
        assert [os.getpriority(os.PRIO_PROCESS, int(t)) for t in tids] == [7] * 4
        assert lower_priority([proc.pid], 0) == 0
    finally:
        proc.kill()
        proc.wait()


def test_the_compute_processes_are_the_group_but_the_supervisors_child():
    """A supervisor (a process group of its own) whose child (vLLM's API server) starts a grandchild
    (vLLM's engine core): the supervisor and the grandchild are lowered, the API server is not."""
    grandchild = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])"
    child = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r} + '; time.sleep(30)'])"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", child + "; time.sleep(30)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(supervisor.pid).children(recursive=True)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        (server,) = psutil.Process(supervisor.pid).children()
        (engine_core,) = server.children()
        assert sorted(compute_processes(supervisor.pid)) == sorted([supervisor.pid, engine_core.pid])
    finally:
        os.killpg(supervisor.pid, 9)
        supervisor.wait()
