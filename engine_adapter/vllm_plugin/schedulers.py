"""vLLM v1 schedulers with the explorer's plugin: the classes vLLM is told to load.

Contract: ``TapScheduler`` (vLLM's synchronous scheduler) and ``TapAsyncScheduler``
(its async one) are loaded inside vLLM's engine-core process by
``--scheduler-cls`` (the paths are ``paths.TAP_SCHEDULER`` and
``paths.TAP_ASYNC_SCHEDULER``). Each is vLLM's class with two mixins, in this order:

- ``policy_hooks.PolicyHooksMixin``: live K policies over the control channel, the
  slot auction's trimming, the idle drafter's rules (acts only where asked to);
- ``tap.TapMixin``: observes every step and publishes it (changes nothing).

With neither environment address set, both behave exactly as vLLM's scheduler.
This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from engine_adapter.vllm_plugin.policy_hooks import PolicyHooksMixin
from engine_adapter.vllm_plugin.tap import TapMixin
from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release


class TapScheduler(PolicyHooksMixin, TapMixin, Scheduler):
    """vLLM's synchronous scheduler with the plugin."""


class TapAsyncScheduler(PolicyHooksMixin, TapMixin, AsyncScheduler):
    """vLLM's async scheduler with the plugin."""
