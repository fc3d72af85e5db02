"""Run by Python at the start of every process vLLM's engine starts (``site`` imports
``sitecustomize`` from the path): the launcher puts this folder first on the engine's
``PYTHONPATH`` (``engine.launcher.engine_env``, ``paths.STARTUP_DIR``).

It hides torch's companion packages whose build does not match torch
(``engine_adapter.torch_extras``) before anything in the process imports transformers: vLLM's API
server, its engine core and worker, and the subprocesses vLLM starts by module name (its model
registry inspects each architecture in ``python -m vllm.model_executor.models.registry``, which
imports transformers at once). Standard library only; a few milliseconds.

Where torch's kernels are limited to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, which the launcher sets
for ``SPEC_EXPLORER_CPU_AS=AVX2``) it also makes torch's CPU probes answer as on an AVX2 CPU
(``cpu_tuning/isa_limit.py``), before vLLM reads them: that imports torch here.
"""

import os

from engine_adapter.torch_extras import hide_mismatched_torch_extras

hide_mismatched_torch_extras()
if os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() == "avx2":
    from engine_adapter.vllm_plugin.cpu_tuning.isa_limit import limit_torch_to_avx2

    limit_torch_to_avx2()
