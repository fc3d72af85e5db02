"""The dotted class paths vLLM is handed to load the plugin, without importing vLLM.

Contract: ``scheduler_class_path(async_scheduling)`` is the ``--scheduler-cls`` of
the scheduler tap, ``IDLE_DRAFTER_WORKER`` the ``--worker-cls`` of the idle
drafter (acceptance rules included) and ``ACCEPTANCE_RULE_WORKER`` that of an engine
with the acceptance rules alone. The app's process never imports vLLM (it would cost seconds and memory
at every start), so the paths are written here once; ``tests/unit`` resolves each
with vLLM's own resolver and checks it names the class it is meant to
(``class_path(cls)`` of the class itself).
"""

from __future__ import annotations

_PACKAGE = __name__.rsplit(".", 1)[0]  # engine_adapter.vllm_plugin

TAP_SCHEDULER = f"{_PACKAGE}.schedulers.TapScheduler"
TAP_ASYNC_SCHEDULER = f"{_PACKAGE}.schedulers.TapAsyncScheduler"
IDLE_DRAFTER_WORKER = f"{_PACKAGE}.idle_drafter.IdleDrafterWorker"  # with the acceptance rules too
ACCEPTANCE_RULE_WORKER = f"{_PACKAGE}.lossy_sampler.AcceptanceRuleWorker"


def class_path(cls: type) -> str:
    """``module.QualName`` of a class: what vLLM's ``resolve_obj_by_qualname`` loads."""
    return f"{cls.__module__}.{cls.__qualname__}"


def scheduler_class_path(async_scheduling: bool) -> str:
    return TAP_ASYNC_SCHEDULER if async_scheduling else TAP_SCHEDULER
