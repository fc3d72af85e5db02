"""The plugin's worker classes on vLLM's CUDA platform (the ``vllm`` wheel): ``--worker-cls`` for a GPU launch.

Contract: ``GPUVerifierWorker`` is vLLM's GPU ``Worker`` with the acceptance rules and the
exact-drafts report (``lossy_sampler.AcceptanceRuleMixin``); ``GPUIdleDrafterWorker`` adds the
idle drafter (``idle_drafter.IdleDrafterMixin``). ``paths.worker_class_path("cuda", ...)`` names
them; the CPU's are in ``workers_cpu.py``. Both need vLLM's Model Runner V1 (the launch pins it,
``VLLM_USE_V2_MODEL_RUNNER=0``; the idle drafter refuses a runner without a ``drafter``).

Never run on a GPU by this project's tests (no GPU and no CUDA build of vLLM on its machines);
what is covered on CPU and what is not: README, "On a GPU".

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

from vllm.v1.worker.gpu_worker import Worker

from engine_adapter.vllm_plugin.idle_drafter import IdleDrafterMixin
from engine_adapter.vllm_plugin.lossy_sampler import AcceptanceRuleMixin
from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release


class GPUVerifierWorker(AcceptanceRuleMixin, Worker):
    """vLLM's GPU worker with the acceptance rules and the exact-drafts report."""


class GPUIdleDrafterWorker(IdleDrafterMixin, AcceptanceRuleMixin, Worker):
    """vLLM's GPU worker with the idle drafter, the acceptance rules and the exact-drafts report."""
