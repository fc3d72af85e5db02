"""The machine's memory roofline for decoding: read bandwidth, measured, and bytes read per step.

Contract:
- ``read_bandwidth_gbs(threads)``: GB/s (1e9 bytes) that a bf16 matrix-vector product reads on
  ``threads`` cores, median of ``repeats`` products over a ``size_gb`` matrix (far past the
  caches), the same access pattern as a decode step reading its weights;
- ``weight_bytes(model_dir)`` (from ``resources``): bytes of a model's weight files: what one
  decode step reads at least when loaded in the stored dtype (every weight once; tied
  embeddings are stored, and read, once; ``resources.loaded_bytes`` for another dtype);
- ``roofline_tokens_per_s(bandwidth_gbs, bytes_per_step, batch)``: the bound on plain decoding,
  ``batch`` tokens per weight read (KV-cache reads are left out: small at these lengths).

Run it with no engine running (it uses the cores the engine would). Units: GB/s, bytes, tokens/s.
"""

from __future__ import annotations

import os
import statistics
import time

from engine_adapter.engine.resources import weight_bytes  # noqa: F401 (re-exported: bytes read per step)


def read_bandwidth_gbs(threads: int, size_gb: float = 1.0, repeats: int = 7) -> float:
    import torch  # the app's process never needs it; only this measurement does

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        cols = 4096
        rows = int(size_gb * 1e9 / (2 * cols))
        w = torch.randn(rows, cols, dtype=torch.bfloat16)  # [rows, cols] bf16
        x = torch.randn(cols, dtype=torch.bfloat16)  # [cols]
        torch.mv(w, x)  # warm-up: page faults and thread start-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mv(w, x)
            times.append(time.perf_counter() - t0)
        return w.numel() * w.element_size() / statistics.median(times) / 1e9
    finally:
        torch.set_num_threads(before)


def roofline_tokens_per_s(bandwidth_gbs: float, bytes_per_step: int, batch: int = 1) -> float:
    return batch * bandwidth_gbs * 1e9 / bytes_per_step if bytes_per_step > 0 else 0.0


def worker_cores(reserved_cpus: int | None) -> int:
    """Cores vLLM's CPU worker computes on: all but the reserved ones (vLLM reserves 1 by default)."""
    cpus = os.cpu_count() or 1
    return max(1, cpus - (1 if reserved_cpus is None else reserved_cpus))
