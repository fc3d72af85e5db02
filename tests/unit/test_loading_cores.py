"""Loading on every core, serving on the worker's own (vllm_plugin/cpu_tuning/loading_cores.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine_adapter.vllm_plugin.cpu_tuning.loading_cores import cpu_quota, loading_cores, machine_cores, parse_cpu_list


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


def test_a_worker_loads_on_its_parents_cores() -> None:
    """vLLM's engine core is unbound: its cores are what vLLM divided (here: this test's parent's)."""
    assert loading_cores() == os.sched_getaffinity(os.getppid()) & machine_cores()


@pytest.mark.parametrize(
    ("text", "cores"),
    [("max 100000\n", None), ("200000 100000\n", 2), ("150000 100000", 2), ("50000 100000", 1), ("", None)],
)
def test_the_cgroups_quota_in_whole_cores(tmp_path, text: str, cores: int | None) -> None:
    (tmp_path / "cpu.max").write_text(text)
    assert cpu_quota(str(tmp_path / "cpu.max")) == cores
    assert cpu_quota(str(tmp_path / "absent")) is None


# A fresh interpreter, bound the way vLLM binds a worker (its main thread on one core, one OpenMP
# thread) with a helper thread bound to another core where there is one, runs all_cores(); inside it
# a thread starts (as vLLM's loading starts some). It prints what it saw.
PROBE = r"""
import json, os, threading, torch
from engine_adapter.vllm_plugin.cpu_tuning.loading_cores import all_cores, loading_cores
cores = sorted(loading_cores())
own, other = {cores[0]}, {cores[-1]}
os.sched_setaffinity(0, own)
torch.set_num_threads(1)
seen = {}
ready = threading.Event(); started = threading.Event(); stop = threading.Event()
def bound():
    os.sched_setaffinity(0, other); seen["bound_tid"] = threading.get_native_id(); ready.set(); stop.wait()
def late():
    seen["late_tid"] = threading.get_native_id(); started.set(); stop.wait()
b = threading.Thread(target=bound); b.start(); ready.wait()
try:
    with all_cores() as used:
        seen["cores"] = sorted(used)
        seen["inside"] = sorted(os.sched_getaffinity(0)); seen["inside_threads"] = torch.get_num_threads()
        seen["bound_inside"] = sorted(os.sched_getaffinity(seen["bound_tid"]))
        t = threading.Thread(target=late); t.start(); started.wait()
        if os.environ.get("FAIL") == "1":
            raise RuntimeError("loading failed")
except RuntimeError:
    seen["raised"] = True
seen["after"] = sorted(os.sched_getaffinity(0)); seen["after_threads"] = torch.get_num_threads()
seen["bound_after"] = sorted(os.sched_getaffinity(seen["bound_tid"]))
seen["late_after"] = sorted(os.sched_getaffinity(seen["late_tid"]))
seen["all"] = cores
stop.set(); t.join(); b.join()
print(json.dumps(seen))
"""


@pytest.mark.parametrize("fail", [False, True], ids=["loads", "loading-fails"])
def test_all_cores_widens_then_restores_every_thread(fail: bool) -> None:
    env = os.environ | {"FAIL": "1" if fail else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    cores = seen["all"]  # loading_cores() in the probe
    own, other = [cores[0]], [cores[-1]]
    assert seen["cores"] == cores
    assert seen["inside"] == cores and seen["bound_inside"] == cores
    assert seen["inside_threads"] == min(len(cores), cpu_quota() or len(cores))
    assert seen["after"] == own and seen["after_threads"] == 1
    assert seen["bound_after"] == other  # each thread back on its own cores
    assert seen["late_after"] == sorted(set(own) | set(other))  # a thread started meanwhile: the union
    assert seen.get("raised", False) is fail
