"""vLLM's multiprocess executor whose engine core waits for its worker in short polls, not a spin (CPU only).

Contract: ``QuietMultiprocExecutor`` is vLLM 0.32's ``MultiprocExecutor`` (the executor vLLM's CPU
platform always runs), loaded with ``--distributed-executor-backend`` (``paths.QUIET_EXECUTOR``, CPU
launches only). The one difference: the readers this process builds for its workers' answers are
``PollingCondition``s (so is the writer side of its broadcast queue, which never waits). A
``PollingCondition`` spins (``sched_yield``) only for ``SPIN_S`` (5 ms) after each read, then waits on
vLLM's write notification (a ZMQ ping per message), but never longer than ``RECHECK_MS`` (2 ms) before it
looks at the shared buffer again; vLLM 0.32's ``SpinCondition`` spins for up to a second after each read
and then waits up to 5 s (``busy_loop_s`` 1 s, ``SHM_READER_RECHECK_INTERVAL_MS`` 5000). Steps that come
within 5 ms of each other (tiny test models) are read as vLLM reads them. Everything else is
vLLM's, the workers' side included (they are spawned, and keep vLLM's spin: they wait for the
scheduler's short turns, on their own cores).

Why: on a CPU engine every step is a wait for the worker of 0.1-2 s, so the engine core spun
through all of it: more than half a core at background load 64 on a 2-core CPU, on the core the
page, the app and vLLM's API server share (docs/benchmarks.md, "UI latency"). Waiting on the
notification alone is not safe: some notifications never arrive (why was not pinned down; vLLM's
PUB socket has a send high-water mark of 1), and with no spin each lost one cost the 5 s recheck;
tiny-model engines, whose steps are milliseconds apart, stalled for minutes. The 2 ms bound caps a
lost one's cost at 2 ms, for a few per cent of a core at load 64 (docs/benchmarks.md, "the engine
core polls"). The short spin keeps that 2 ms off steps of a few ms, where it would be a large share
of the step times the cost model measures; on the packaged pair (steps of 0.1-2 s) it is 5 ms a step.

How: vLLM builds each reader as ``shm_broadcast.SpinCondition(...)``, a module-level name it looks up
when it builds one, so the name is pointed at ``PollingCondition`` while this process builds its
readers (``_init_executor``) and restored after. If vLLM's signature is not the one this was
written against, the executor logs it and runs as vLLM's own.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator

import zmq
from vllm.distributed.device_communicators import shm_broadcast
from vllm.v1.executor.multiproc_executor import MultiprocExecutor

from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release

logger = logging.getLogger(__name__)

RECHECK_MS = 2  # ms: the longest a reader waits for a notification before it looks at the buffer again
SPIN_S = 0.005  # s: how long after each read a reader spins before it waits on the notification
_VLLM_WAIT_PARAMS = ("self", "timeout_ms")
_VLLM_INIT_PARAMS = ("self", "is_reader", "context", "notify_address", "busy_loop_s")


class PollingCondition(shm_broadcast.SpinCondition):
    """vLLM's ``SpinCondition`` with a busy loop of ``SPIN_S``, whose waits last at most ``RECHECK_MS``."""

    def __init__(self, is_reader: bool, context: zmq.Context, notify_address: str, busy_loop_s: float = SPIN_S):
        super().__init__(is_reader, context, notify_address, busy_loop_s=SPIN_S)

    def wait(self, timeout_ms: int | None = None) -> None:
        super().wait(timeout_ms=RECHECK_MS if timeout_ms is None else min(timeout_ms, RECHECK_MS))


def _matches_vllm() -> bool:
    cls = shm_broadcast.SpinCondition
    return (
        tuple(inspect.signature(cls.__init__).parameters) == _VLLM_INIT_PARAMS
        and tuple(inspect.signature(cls.wait).parameters) == _VLLM_WAIT_PARAMS
    )


@contextlib.contextmanager
def readers_poll() -> Iterator[bool]:
    """While open, every reader condition this process builds is a ``PollingCondition``; yields
    whether it could arrange that (False: vLLM's ``SpinCondition`` is not the one this was written against)."""
    vllm_condition = shm_broadcast.SpinCondition
    if vllm_condition is PollingCondition:  # already open (nested): its readers poll already
        yield True
        return
    if not _matches_vllm():
        logger.warning("vLLM's SpinCondition is not the one expected: the engine core spins as vLLM's")
        yield False
        return
    shm_broadcast.SpinCondition = PollingCondition
    try:
        yield True
    finally:
        shm_broadcast.SpinCondition = vllm_condition


class QuietMultiprocExecutor(MultiprocExecutor):
    def _init_executor(self) -> None:
        with readers_poll():
            super()._init_executor()
