"""The machine's memory roofline for decoding: read bandwidth, measured, and bytes read per step.

Contract:
- ``read_bandwidth_gbs(threads)``: GB/s (1e9 bytes) that a streaming read reaches on ``threads``
  cores: a float32 sum over ``size_gb`` (far past the caches), median of ``repeats``. Not a bf16
  matrix-vector product: on the project's AVX-512 BF16 CPU torch's bf16 ``mv`` is compute-bound,
  reading about a quarter of what the sum reads, while vLLM's own plain decode reads at about the
  sum's rate (docs/benchmarks.md, "The physical limit");
- ``weight_bytes(model_dir)`` (from ``resources``): bytes of a model's weight files;
- ``bytes_read_per_step(model_dir, dtype)``: what one decode step reads at least: every weight
  once in ``dtype``, except an input embedding table the output layer does not share (a step
  gathers one row of it per token; tied embeddings are read once, as the output layer);
- ``roofline_tokens_per_s(bandwidth_gbs, bytes_per_step, batch)``: the bound on plain decoding,
  ``batch`` tokens per weight read (KV-cache reads are left out: small at these lengths).

Run it with no engine running (it uses the cores the engine would). Units: GB/s, bytes, tokens/s.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from engine_adapter.engine.resources import BYTES_PER_PARAM, loaded_bytes, model_config, stored_dtype, weight_bytes


def read_bandwidth_gbs(threads: int, size_gb: float = 1.0, repeats: int = 7) -> float:
    import torch  # the app's process never needs it; only this measurement does

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        data = torch.ones(int(size_gb * 1e9 / 4), dtype=torch.float32)  # [n] float32, size_gb GB
        data.sum()  # warm-up: page faults and thread start-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            data.sum()
            times.append(time.perf_counter() - t0)
        return data.numel() * data.element_size() / statistics.median(times) / 1e9
    finally:
        torch.set_num_threads(before)


def untied_embedding_params(config: dict) -> int:
    """Parameters of the input embedding table when the output layer has its own (else 0)."""
    if config.get("tie_word_embeddings", True):  # transformers' default: tied
        return 0
    return int(config.get("vocab_size") or 0) * int(config.get("hidden_size") or 0)


def bytes_read_per_step(model_dir: Path, dtype: str) -> int:
    """Bytes one decode step reads at least: the weights in ``dtype``, less an untied input embedding
    (the packaged 1.5B target: 3.55 GB of weights, 3.09 GB read per step)."""
    total = loaded_bytes(weight_bytes(model_dir), stored_dtype(model_dir), dtype)
    return max(0, total - untied_embedding_params(model_config(model_dir)) * BYTES_PER_PARAM.get(dtype, 2))


def roofline_tokens_per_s(bandwidth_gbs: float, bytes_per_step: int, batch: int = 1) -> float:
    return batch * bandwidth_gbs * 1e9 / bytes_per_step if bytes_per_step > 0 else 0.0


def worker_cores(reserved_cpus: int | None) -> int:
    """Cores vLLM's CPU worker computes on: all but the reserved ones (vLLM reserves 1 by default)."""
    cpus = os.cpu_count() or 1
    return max(1, cpus - (1 if reserved_cpus is None else reserved_cpus))
