"""A CPU worker on a CPU with AMX: the tile state asked for, and int8 kernels its dtype can run.

Contract: ``AmxMixin`` goes before vLLM's ``CPUWorker`` in every CPU worker class of the plugin
(``workers_cpu.py``). Its ``load_model`` first asks Linux for the AMX tile state where the CPU has
AMX (``request_amx_state``: PyTorch's ``torch.cpu._init_amx``, ``arch_prctl(ARCH_REQ_XCOMP_PERM)``),
then runs vLLM's ``load_model`` with the int8 kernel choice bounded by the model's dtype
(``int8_kernels_for_dtype``). On a CPU without AMX both are no-ops.

Why, as seen on an Intel Xeon with AMX (docs/benchmarks.md, "a machine with AMX"):

- the tile state: vLLM's CPU attention runs its "amx" kernels for a bfloat16 engine, and Linux
  kills a process that runs a tile instruction before it asked for the state (SIGILL). oneDNN
  asks for it when it runs an AMX matmul of its own; the tiny test models in bfloat16 under the
  plugin's worker reached the attention kernel first and the worker died at the first request
  (``Fatal Python error: Illegal instruction`` in ``cpu_attention_with_kv_cache``);
- the int8 kernels: vLLM's W8A8 int8 layers choose the AMX ("sgl") kernel from the weight's dtype
  alone (``check_cpu_sgl_kernel``), and that kernel takes bfloat16 or half activations only, so a
  float32 engine (the tests, the AVX2 kind's code on an AVX-512 machine) failed its first step
  with "int8_scaled_mm_with_quant: expect A to be bfloat16 or half". Under this mixin a float32
  engine's int8 layers take vLLM's oneDNN kernel, as on a CPU without AMX.

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from vllm.model_executor.kernels.linear.scaled_mm import cpu as scaled_mm_cpu

from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

require_tested_vllm()

logger = logging.getLogger("vllm").getChild("amx")

AMX_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)  # what vLLM's AMX int8 kernel takes


def request_amx_state() -> bool:
    """Ask Linux for the AMX tile state where the CPU has AMX; whether it is granted (False
    without AMX)."""
    if not torch.cpu._is_amx_tile_supported():
        return False
    granted = bool(torch.cpu._init_amx())
    if not granted:
        logger.warning("the CPU has AMX but Linux did not grant its tile state: AMX kernels may fail")
    return granted


@contextlib.contextmanager
def int8_kernels_for_dtype() -> Iterator[None]:
    """While it is open, vLLM's CPU int8 layers take the AMX kernel only where the default dtype
    (the model's, while vLLM loads it) is one the kernel takes; every other choice is vLLM's own."""
    vllms = scaled_mm_cpu.check_cpu_sgl_kernel

    def check(n: int, k: int, dtype: torch.dtype) -> bool:
        if dtype == torch.int8 and torch.get_default_dtype() not in AMX_ACTIVATION_DTYPES:
            return False
        return vllms(n, k, dtype)

    scaled_mm_cpu.check_cpu_sgl_kernel = check
    try:
        yield
    finally:
        scaled_mm_cpu.check_cpu_sgl_kernel = vllms


class AmxMixin:
    """Runs vLLM's ``load_model`` with the AMX tile state asked for and the int8 kernels bounded
    by the model's dtype; see the module docstring."""

    def load_model(self, *args, **kwargs):
        if request_amx_state():
            logger.info("AMX tile state granted")
        with int8_kernels_for_dtype():
            return super().load_model(*args, **kwargs)
