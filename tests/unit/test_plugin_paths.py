"""The class paths handed to vLLM name the plugin's classes, and vLLM's own resolver loads them."""

from __future__ import annotations

import pytest

from engine_adapter.engine.server_args import server_args
from engine_adapter.engine_config import EngineConfig
from engine_adapter.vllm_plugin import paths


def _classes():
    from engine_adapter.vllm_plugin.idle_drafter import IdleDrafterWorker
    from engine_adapter.vllm_plugin.lossy_sampler import AcceptanceRuleWorker
    from engine_adapter.vllm_plugin.schedulers import TapAsyncScheduler, TapScheduler

    return {
        paths.TAP_SCHEDULER: TapScheduler,
        paths.TAP_ASYNC_SCHEDULER: TapAsyncScheduler,
        paths.IDLE_DRAFTER_WORKER: IdleDrafterWorker,
        paths.ACCEPTANCE_RULE_WORKER: AcceptanceRuleWorker,
    }


@pytest.mark.parametrize(
    "name", ["TAP_SCHEDULER", "TAP_ASYNC_SCHEDULER", "IDLE_DRAFTER_WORKER", "ACCEPTANCE_RULE_WORKER"]
)
def test_each_path_is_its_class_and_vllm_resolves_it(name):
    from vllm.utils.import_utils import resolve_obj_by_qualname

    path = getattr(paths, name)
    cls = _classes()[path]
    assert paths.class_path(cls) == path
    assert resolve_obj_by_qualname(path) is cls


def test_the_schedulers_are_vllms_with_both_halves_of_the_plugin():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from engine_adapter.vllm_plugin.policy_hooks import PolicyHooksMixin
    from engine_adapter.vllm_plugin.tap import TapMixin

    for path, base in [(paths.TAP_SCHEDULER, Scheduler), (paths.TAP_ASYNC_SCHEDULER, AsyncScheduler)]:
        mro = _classes()[path].__mro__
        # the policy half acts before the tap observes, and both before vLLM's own class
        assert mro.index(PolicyHooksMixin) < mro.index(TapMixin) < mro.index(base)


@pytest.mark.parametrize(
    "config, scheduler, worker",
    [
        (EngineConfig(method="draft", k=3), paths.TAP_ASYNC_SCHEDULER, None),
        (EngineConfig(method="ngram", k=3), paths.TAP_SCHEDULER, None),
        (EngineConfig(method="draft", k=3, k_max=5), paths.TAP_ASYNC_SCHEDULER, paths.IDLE_DRAFTER_WORKER),
        (EngineConfig(method="draft", k=3, tap=False), None, None),
        # the acceptance rules ride on the control channel, which an engine with a table has
        (EngineConfig(method="ngram", k=3, k_max=5), paths.TAP_SCHEDULER, paths.ACCEPTANCE_RULE_WORKER),
        (
            EngineConfig(method="draft", k=3, k_max=5, idle_drafter=False),
            paths.TAP_ASYNC_SCHEDULER,
            paths.ACCEPTANCE_RULE_WORKER,
        ),
    ],
)
def test_server_args_hand_vllm_the_paths(config, scheduler, worker):
    args = server_args(config, "/t", "/d" if config.method == "draft" else None, 8000)

    def value(flag):
        return args[args.index(flag) + 1] if flag in args else None

    assert value("--scheduler-cls") == scheduler
    assert value("--worker-cls") == worker


def test_both_workers_carry_the_acceptance_rules():
    from engine_adapter.vllm_plugin.idle_drafter import IdleDrafterWorker
    from engine_adapter.vllm_plugin.lossy_sampler import AcceptanceRuleMixin, AcceptanceRuleWorker

    assert issubclass(IdleDrafterWorker, AcceptanceRuleMixin) and issubclass(AcceptanceRuleWorker, AcceptanceRuleMixin)
