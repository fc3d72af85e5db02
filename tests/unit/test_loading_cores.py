"""Loading on every core, serving on the worker's own (vllm_plugin/loading_cores.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine_adapter.vllm_plugin.loading_cores import machine_cores, parse_cpu_list


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("0", {0}),
        ("0-1\n", {0, 1}),
        ("0-2,5", {0, 1, 2, 5}),
        ("3,7-8", {3, 7, 8}),
        ("0,", {0}),
    ],
)
def test_the_kernels_cpu_lists_parse(text: str, cores: set[int]) -> None:
    assert parse_cpu_list(text) == cores


@pytest.mark.parametrize("text", ["", "\n", "a-b", "1-"])
def test_a_cpu_list_with_no_cores_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpu_list(text)


def test_the_machines_cores_include_this_process() -> None:
    assert os.sched_getaffinity(0) <= machine_cores()


# A fresh interpreter, bound the way vLLM binds its worker (one core, one OpenMP thread), runs
# all_cores(); inside it a thread starts (as vLLM's loading starts some). It prints what it saw.
PROBE = r"""
import json, os, threading, torch
from engine_adapter.vllm_plugin.loading_cores import all_cores, machine_cores
own = {min(machine_cores())}
os.sched_setaffinity(0, own)
torch.set_num_threads(1)
seen = {}
started = threading.Event(); stop = threading.Event()
def late():
    seen["late_tid"] = threading.get_native_id(); started.set(); stop.wait()
try:
    with all_cores() as cores:
        seen["inside"] = sorted(os.sched_getaffinity(0)); seen["inside_threads"] = torch.get_num_threads()
        seen["cores"] = sorted(cores)
        t = threading.Thread(target=late); t.start(); started.wait()
        if os.environ.get("FAIL") == "1":
            raise RuntimeError("loading failed")
except RuntimeError:
    seen["raised"] = True
seen["after"] = sorted(os.sched_getaffinity(0)); seen["after_threads"] = torch.get_num_threads()
seen["late_after"] = sorted(os.sched_getaffinity(seen["late_tid"]))
stop.set(); t.join()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("fail", [False, True], ids=["loads", "loading-fails"])
def test_all_cores_widens_then_restores_every_thread(fail: bool) -> None:
    env = os.environ | {"FAIL": "1" if fail else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    cores = sorted(machine_cores())
    own = [min(cores)]
    assert seen["cores"] == cores
    assert seen["inside"] == cores and seen["inside_threads"] == len(cores)
    assert seen["after"] == own and seen["after_threads"] == 1
    assert seen["late_after"] == own  # a thread started while loading serves on the worker's cores
    assert seen.get("raised", False) is fail
