"""A CPU worker loads its models on every core of the machine, then goes back to its own.

Contract: ``AllCoresLoadingMixin`` goes before vLLM's ``CPUWorker`` in every CPU worker class of
the plugin (``workers_cpu.py``). Around vLLM's ``load_model()`` (the target's weights, their oneDNN
packing, the draft model's), ``all_cores()`` lets every thread of the worker run on every core the
machine has and gives the OpenMP team one thread per core (``LOADING_CORES_ENV=0`` turns it off);
after it, or if loading fails, each thread gets its own cores back and the team its thread count
(a thread started during the load gets the main thread's cores). Serving is exactly as vLLM bound
it: the worker on its cores (``VLLM_CPU_OMP_THREADS_BIND``), the reserved ones
(``VLLM_CPU_NUM_OF_RESERVED_CPU``) left to the API server, the engine core and the app.

Why: loading is not the work the reservation is for (nothing else runs while vLLM starts; the page
waits for it), and most of it is the kernel handing out fresh pages: on the AVX-512 machine of this
project (2 CPU cores, 24 GiB, a virtual machine whose balloon returns freed memory to its host)
the worker spent 33-45 s of system time against 11-15 s of its own in a launch, 83 % of its
samples in ``clear_page_erms`` (docs/benchmarks.md, "2026-12-04"). Page faults are served on the
core that takes them, so a second thread taking half of them halves that time. ``torch``'s copy of
a checkpoint tensor into its parameter and oneDNN's weight packing are both OpenMP-parallel.

vLLM replaces ``torch.set_num_threads`` in its CPU worker with a no-op that warns (``init_device``)
because changing the team after its binding would lose the binding; this module sets the count
through ``torch._C.set_num_threads`` (what ``torch.set_num_threads`` calls) and does the binding
itself, on the way in and on the way out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator

import torch

logger = logging.getLogger("vllm").getChild("loading_cores")

LOADING_CORES_ENV = "SPEC_EXPLORER_LOADING_CORES"  # "0": load on the worker's own cores only


def machine_cores() -> set[int]:
    """Every core this process may be given: the cgroup's set where there is one, else all online."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/devices/system/cpu/online"):
        with contextlib.suppress(OSError, ValueError):
            return parse_cpu_list(open(path).read())
    return set(range(os.cpu_count() or 1))


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


def thread_ids() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def set_affinity(tid: int, cores: set[int]) -> None:
    with contextlib.suppress(OSError):  # a thread that ended meanwhile
        os.sched_setaffinity(tid, cores)


@contextlib.contextmanager
def all_cores(cores: set[int] | None = None) -> Iterator[set[int]]:
    """Every thread of this process on ``cores`` (the machine's) and one OpenMP thread per core, then back."""
    cores = cores or machine_cores()
    main = os.getpid()
    own = os.sched_getaffinity(main)
    saved: dict[int, set[int]] = {}
    for tid in thread_ids():
        with contextlib.suppress(OSError):
            saved[tid] = os.sched_getaffinity(tid)
    threads = torch.get_num_threads()
    for tid in saved:
        set_affinity(tid, cores)
    torch._C.set_num_threads(len(cores))
    try:
        yield cores
    finally:
        torch._C.set_num_threads(threads)
        for tid in thread_ids():
            set_affinity(tid, saved.get(tid, own))


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
            sorted(os.sched_getaffinity(0)),
        )
        return result
