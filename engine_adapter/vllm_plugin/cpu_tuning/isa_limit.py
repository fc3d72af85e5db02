"""An AVX-512 CPU run as the AVX2 kind, in the engine's processes: for measuring the AVX2 kind's
code paths where no machine of that kind is at hand.

Contract: with ``SPEC_EXPLORER_CPU_AS=AVX2`` (``engine_config.isa_limit``) the app's
``engine_config.cpu_flags`` lose the AVX-512 and AMX flags (so the kind is "AVX2", the dtype
float32, the cost model's cache and prior keys AVX2's, and ``platform.cpu_name`` says "running
AVX2 code only"); the launcher sets ``engine_config.LIBRARY_LIMITS`` for the engine (torch's own
kernels, oneDNN and MKL run their AVX2 code); and every engine process's ``sitecustomize``,
seeing torch's kernels limited to AVX2 (``ATEN_CPU_CAPABILITY=avx2``), calls
``limit_torch_to_avx2()``, which makes the probes of torch that vLLM reads (``PROBES``) answer as
on an AVX2 CPU: vLLM then loads its AVX2 kernel library (``vllm._C_AVX2``) and picks its AVX2
attention. Raises RuntimeError if torch lacks a probe (a torch this was not written for).
What it cannot change: this machine's memory bandwidth, clock and caches. Its figures are this
CPU running AVX2 code, never an AVX2 machine's; docs/benchmarks.md names them so.
"""

from __future__ import annotations

PROBES = (
    "_is_avx512_supported",
    "_is_avx512_bf16_supported",
    "_is_vnni_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _absent() -> bool:
    return False


def limit_torch_to_avx2() -> None:
    import torch.cpu  # the engine's processes import torch anyway; the app's never call this

    missing = [name for name in PROBES if not callable(getattr(torch.cpu, name, None))]
    if missing:
        raise RuntimeError(f"torch {torch.__version__} has no CPU probe {', '.join(missing)}: cannot run as AVX2")
    for name in PROBES:
        setattr(torch.cpu, name, _absent)
