"""The dotted class paths vLLM is handed to load the plugin, without importing vLLM.

Contract: ``scheduler_class_path(async_scheduling)`` is the ``--scheduler-cls`` of the
scheduler tap; ``QUIET_EXECUTOR`` the ``--distributed-executor-backend`` of a CPU launch
(``cpu_tuning/quiet_executor.py``); ``worker_class_path(platform_kind, idle_drafter)`` the ``--worker-cls``:
the platform's worker with the acceptance rules and the exact-drafts report
(``lossy_sampler.py``), and with the idle drafter too (``idle_drafter.py``) when asked;
``LAZY_KV_WORKER`` the ``--worker-cls`` of any other CPU launch (every CPU worker of the plugin
maps its KV cache instead of writing it, ``lazy_kv_cache.py``, and loads its models on every core,
``loading_cores.py``). ``SERVER_MODULE`` is the module vLLM's OpenAI server runs as
(``python -m SERVER_MODULE ARGS``, ``server_main.py``). ``STARTUP_DIR`` is the folder put first on
the engine's ``PYTHONPATH``, whose ``sitecustomize.py`` every Python process of the engine runs at
start (``startup/sitecustomize.py``).
There is one worker class per platform (``workers_cpu.py``, ``workers_gpu.py``), chosen
here by the platform the launch names, never at import time. The app's process never
imports vLLM (it would cost seconds and memory at every start), so the paths are written
here once; ``tests/unit`` resolves each with vLLM's own resolver and checks it names the
class it is meant to (``class_path(cls)`` of the class itself).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = __name__.rsplit(".", 1)[0]  # engine_adapter.vllm_plugin

# python -m SERVER_MODULE <server_args>: vLLM's OpenAI server under a main module that imports nothing
SERVER_MODULE = f"{_PACKAGE}.server_main"
# every Python process of the engine imports startup/sitecustomize.py first (vLLM's subprocesses included)
STARTUP_DIR = Path(__file__).resolve().with_name("startup")
TAP_SCHEDULER = f"{_PACKAGE}.schedulers.TapScheduler"
TAP_ASYNC_SCHEDULER = f"{_PACKAGE}.schedulers.TapAsyncScheduler"
# vLLM's multiprocess executor whose engine core polls (after a 5 ms spin) while its worker runs (CPU launches)
QUIET_EXECUTOR = f"{_PACKAGE}.cpu_tuning.quiet_executor.QuietMultiprocExecutor"
# vLLM's CPU worker with only the KV cache committed at first use (CPU launches with no other plugin worker)
LAZY_KV_WORKER = f"{_PACKAGE}.workers_cpu.CPULazyKVWorker"
# platform kind ("cpu", "cuda") -> worker class path
VERIFIER_WORKERS = {
    "cpu": f"{_PACKAGE}.workers_cpu.CPUVerifierWorker",
    "cuda": f"{_PACKAGE}.workers_gpu.GPUVerifierWorker",
}
IDLE_DRAFTER_WORKERS = {
    "cpu": f"{_PACKAGE}.workers_cpu.CPUIdleDrafterWorker",
    "cuda": f"{_PACKAGE}.workers_gpu.GPUIdleDrafterWorker",
}


def class_path(cls: type) -> str:
    """``module.QualName`` of a class: what vLLM's ``resolve_obj_by_qualname`` loads."""
    return f"{cls.__module__}.{cls.__qualname__}"


def scheduler_class_path(async_scheduling: bool) -> str:
    return TAP_ASYNC_SCHEDULER if async_scheduling else TAP_SCHEDULER


def worker_class_path(platform_kind: str, idle_drafter: bool) -> str:
    """The ``--worker-cls`` for a platform ("cpu" or "cuda"); KeyError for any other."""
    return (IDLE_DRAFTER_WORKERS if idle_drafter else VERIFIER_WORKERS)[platform_kind]


def is_idle_drafter_worker(worker_cls: object) -> bool:
    """Whether vLLM's ``parallel_config.worker_cls`` names one of the idle-drafter workers."""
    return worker_cls in IDLE_DRAFTER_WORKERS.values()
