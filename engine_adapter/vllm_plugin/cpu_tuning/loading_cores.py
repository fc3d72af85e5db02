"""A CPU worker loads its models on all the cores vLLM divides, then serves on its own.

Contract: ``AllCoresLoadingMixin`` goes before vLLM's ``CPUWorker`` in every CPU worker class of
the plugin (``workers_cpu.py``). Around vLLM's ``load_model()`` (the target's weights, their oneDNN
packing, the draft model's), ``all_cores()`` lets every thread of the worker run on every core vLLM
had to divide (``loading_cores()``: its engine core's, which vLLM leaves unbound) and gives the
OpenMP team one thread per core (``LOADING_CORES_ENV=0`` turns it off); after it, or if loading
fails, each thread gets its own cores back and the team its thread count (a thread started during
the load gets the union of the worker's cores). Serving is exactly as vLLM bound
it: the worker on its cores (``VLLM_CPU_OMP_THREADS_BIND``), the reserved ones
(``VLLM_CPU_NUM_OF_RESERVED_CPU``) left to the API server, the engine core and the app.

Why: loading is not the work the reservation is for (nothing else runs while vLLM starts; the page
waits for it), and most of it is the kernel handing out fresh pages: on the AVX-512 machine of this
project (2 CPU cores, 24 GiB, a virtual machine whose balloon returns freed memory to its host)
the worker spent 33-45 s of system time against 11-15 s of its own in a launch, 83 % of its
samples in ``clear_page_erms`` (docs/benchmarks.md, "the worker loads on both cores"). Page faults are served on the
core that takes them, and ``torch``'s copy of a checkpoint tensor into its parameter is
OpenMP-parallel: with both cores the target's weights and the draft model loaded in about half the
time (vLLM alone 69.7-69.8 s -> 55.7-60.1 s to ready); oneDNN's packing gives most of its pages to
one thread and took as long as before.

vLLM replaces ``torch.set_num_threads`` in its CPU worker with a no-op that warns (``init_device``)
because changing the team after its binding would lose the binding; this module sets the count
through ``torch._C.set_num_threads`` (what ``torch.set_num_threads`` calls) and does the binding
itself, on the way in and on the way out.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator

import torch

logger = logging.getLogger("vllm").getChild("loading_cores")

LOADING_CORES_ENV = "SPEC_EXPLORER_LOADING_CORES"  # "0": load on the worker's own cores only


def machine_cores() -> set[int]:
    """Every core of the machine: the cgroup's set where there is one, else all online."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/devices/system/cpu/online"):
        with contextlib.suppress(OSError, ValueError):
            return parse_cpu_list(open(path).read())
    return set(range(os.cpu_count() or 1))


def loading_cores() -> set[int]:
    """The cores to load on: the parent's (vLLM leaves its engine core unbound, so these are the cores
    it divided between the worker and the reserved ones; a ``taskset`` on the launch narrows them),
    within the machine's. The machine's if the parent cannot be read."""
    machine = machine_cores()
    with contextlib.suppress(OSError):
        parent = os.sched_getaffinity(os.getppid()) & machine
        if parent:
            return parent
    return machine


def cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """Whole cores' worth of CPU time the cgroup allows (``cpu.max``: ``"200000 100000"`` -> 2), or None."""
    with contextlib.suppress(OSError, ValueError):
        quota, period = open(path).read().split()[:2]
        if quota != "max":
            return max(1, math.ceil(int(quota) / int(period)))
    return None


def parse_cpu_list(text: str) -> set[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}`` (the kernel's cpu-list format)."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        cores.update(range(int(lo), int(hi if dash else lo) + 1))
    if not cores:
        raise ValueError(f"no cores in {text!r}")
    return cores


def thread_ids(pid: int | str = "self") -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def thread_affinities(pid: int | str = "self") -> dict[int, set[int]]:
    """Each thread of process ``pid`` (this one by default): the cores it may run on (threads that
    end meanwhile are left out)."""
    found = {}
    for tid in thread_ids(pid):
        with contextlib.suppress(OSError):
            found[tid] = os.sched_getaffinity(tid)
    return found


def set_affinity(tid: int, cores: set[int]) -> None:
    with contextlib.suppress(OSError):  # a thread that ended meanwhile
        os.sched_setaffinity(tid, cores)


def start_team() -> None:
    """Runs one parallel region, so the OpenMP team of the current size exists and is bound."""
    torch.ones(1 << 20).add_(1)  # 1 Mi elements: above ATen's grain size (32 Ki), so it runs in parallel


@contextlib.contextmanager
def all_cores(cores: set[int] | None = None) -> Iterator[set[int]]:
    """Every thread of this process on ``cores`` (``loading_cores()``) and an OpenMP team of one
    thread per core (at most the cgroup's quota), then each thread back on its cores and the team
    at its size. A thread started meanwhile gets the union of the threads' cores from before."""
    cores = cores or loading_cores()
    start_team()  # the serving team exists and OpenMP has bound it before its binding is saved
    saved = thread_affinities()
    serving = set().union(*saved.values())
    threads = torch.get_num_threads()
    # vLLM's CPUWorker replaced torch.set_num_threads with a no-op (init_device); this is what it wrapped
    torch._C.set_num_threads(min(len(cores), cpu_quota() or len(cores)))
    try:
        start_team()  # new OpenMP threads, bound by OpenMP to the worker's cores: unbound below
        for tid in thread_ids():
            set_affinity(tid, cores)
        yield cores
    finally:
        torch._C.set_num_threads(threads)
        for tid in thread_ids():
            set_affinity(tid, saved.get(tid, serving))


class AllCoresLoadingMixin:
    """Runs vLLM's ``load_model`` under ``all_cores()``; see the module docstring."""

    def load_model(self, *args, **kwargs):
        if os.environ.get(LOADING_CORES_ENV, "1") == "0":
            return super().load_model(*args, **kwargs)
        t0 = time.monotonic()
        with all_cores() as cores:
            result = super().load_model(*args, **kwargs)
        logger.info(
            "loaded on cores %s in %.1f s; serving on %s",
            sorted(cores),
            time.monotonic() - t0,
            sorted(set().union(*thread_affinities().values())),
        )
        return result
