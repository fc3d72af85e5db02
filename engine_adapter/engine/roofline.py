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
  gathers one row of it per token; tied embeddings are read once, as the output layer). A
  quantised checkpoint (a ``quantization_config``) is counted tensor by tensor from its
  safetensors headers: int8 tensors one byte a value, floating point ones in ``dtype``;
- ``machine_bandwidth_gbs(threads, cache_dir)``: ``read_bandwidth_gbs`` measured once per machine
  in a child process and kept in ``cache_dir`` (the launcher's, for the page's roofline);
- ``roofline_tokens_per_s(bandwidth_gbs, bytes_per_step, batch)``: the bound on plain decoding,
  ``batch`` tokens per weight read (KV-cache reads are left out: small at these lengths).

Run it with no engine running (it uses the cores the engine would). Units: GB/s, bytes, tokens/s.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from engine_adapter.engine.resources import BYTES_PER_PARAM, loaded_bytes, model_config, stored_dtype, weight_bytes
from engine_adapter.package_data import PROJECT_ROOT


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
    (the packaged 1.5B target: 3.55 GB of weights, 3.09 GB read per step; its int8 copy 1.78 GB)."""
    config = model_config(model_dir)
    if "quantization_config" in config:
        total = _quantised_bytes(model_dir, dtype)
    else:
        total = loaded_bytes(weight_bytes(model_dir), stored_dtype(model_dir), dtype)
    return max(0, total - untied_embedding_params(config) * BYTES_PER_PARAM.get(dtype, 2))


FLOAT_TENSORS = ("F32", "BF16", "F16")
BYTES_PER_STORED = {"I8": 1, "U8": 1, "I32": 4, "I64": 8, "F64": 8}


def _quantised_bytes(model_dir: Path, dtype: str) -> int:
    """A quantised checkpoint's tensors as loaded: floating point ones in ``dtype``, the rest as stored."""
    float_bytes, total = BYTES_PER_PARAM.get(dtype, 2), 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            per_value = float_bytes if entry["dtype"] in FLOAT_TENSORS else BYTES_PER_STORED.get(entry["dtype"], 1)
            total += math.prod(entry["shape"]) * per_value
    return total


def roofline_tokens_per_s(bandwidth_gbs: float, bytes_per_step: int, batch: int = 1) -> float:
    return batch * bandwidth_gbs * 1e9 / bytes_per_step if bytes_per_step > 0 else 0.0


def worker_cores(reserved_cpus: int | None) -> int:
    """Cores vLLM's CPU worker computes on: all but the reserved ones (vLLM reserves 1 by default)."""
    cpus = os.cpu_count() or 1
    return max(1, cpus - (1 if reserved_cpus is None else reserved_cpus))


BANDWIDTH_FILE = "read_bandwidth.json"


def machine_bandwidth_gbs(threads: int, cache_dir: Path) -> float:
    """``read_bandwidth_gbs(threads)`` of this machine, measured once in a child process (the
    caller never imports torch; a few seconds, before an engine runs) and kept in ``cache_dir``
    by CPU model, core count and threads. ``RuntimeError`` if the measurement fails."""
    from engine_adapter.engine.models import write_cache_file
    from engine_adapter.engine.platform import machine_facts

    facts = machine_facts()
    key = f"{facts['cpu']}|{facts['cores']}|{threads}"
    path = Path(cache_dir) / BANDWIDTH_FILE
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return float(known[key])
    cmd = [sys.executable, "-m", "engine_adapter.engine.roofline", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"measuring the read bandwidth failed: {done.stderr.strip()[-300:]}")
    gbs = float(done.stdout.strip().splitlines()[-1])
    write_cache_file(path, json.dumps(known | {key: round(gbs, 3)}) + "\n")
    return gbs


if __name__ == "__main__":  # python -m engine_adapter.engine.roofline THREADS: prints GB/s
    print(read_bandwidth_gbs(int(sys.argv[1])))
