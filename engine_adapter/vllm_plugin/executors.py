"""vLLM's multiprocess executor whose engine core waits for its worker without spinning (CPU only).

Contract: ``QuietMultiprocExecutor`` is vLLM 0.32's ``MultiprocExecutor`` (the executor vLLM's CPU
platform always runs), loaded with ``--distributed-executor-backend`` (``paths.QUIET_EXECUTOR``,
CPU launches only). The one difference: the engine core's readers of its workers' answers wait on
vLLM's own write notification (a ZMQ ping per message) from the first moment, instead of spinning
with ``sched_yield`` for up to a second after each read (``shm_broadcast.SpinCondition``'s
``busy_loop_s``, 1 s in vLLM 0.32). Everything else, the workers' side included, is vLLM's.

Why: on a CPU engine every step is a wait for the worker of 0.1-2 s, so the engine core spun
through all of it: 58 % of a core at background load 64 on the AVX-512 machine (2 cores, 24 GiB;
packaged pair, worker on one core, 2026-12-03), on the core the page, the app and vLLM's API server
share (docs/benchmarks.md, "UI latency"). A notification costs tens of microseconds a step. The
workers keep vLLM's spin: they wait for the scheduler's short turns, on their own cores.

How: vLLM takes the busy-loop time only as ``SpinCondition.__init__``'s default argument, so the
default is set to 0 while this process builds its readers (``_init_executor``) and restored after;
if vLLM's signature changes, the executor logs it and runs as vLLM's own.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator

from vllm.distributed.device_communicators import shm_broadcast
from vllm.v1.executor.multiproc_executor import MultiprocExecutor

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def readers_wait_on_notify() -> Iterator[bool]:
    """While open, every ``SpinCondition`` this process creates has no busy loop; yields whether
    it could arrange that (False: vLLM's signature is not the one this was written against)."""
    init = shm_broadcast.SpinCondition.__init__
    param = inspect.signature(init).parameters.get("busy_loop_s")
    if param is None or init.__defaults__ != (param.default,):
        logger.warning("vLLM's SpinCondition has no busy_loop_s default: the engine core spins as vLLM's")
        yield False
        return
    saved = init.__defaults__
    init.__defaults__ = (0.0,)
    try:
        yield True
    finally:
        init.__defaults__ = saved


class QuietMultiprocExecutor(MultiprocExecutor):
    def _init_executor(self) -> None:
        with readers_wait_on_notify():
            super()._init_executor()
