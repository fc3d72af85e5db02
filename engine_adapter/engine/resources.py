"""Will the engine fit? Memory and disk checked before anything is started.

Contract:
- ``check_resources(config, target_dir=None, draft_dir=None, platform=...)`` raises
  ``NotEnoughResources`` with a message naming what is missing, how much is
  needed and how much there is, and what to do; it returns the ``Need`` it
  checked otherwise. The launcher calls it before resolving the models (so a
  packaged model is not converted onto a full disk, and the sizes known then
  are checked) and again with the resolved directories before starting vLLM.
  ``platform`` is the engine's (``engine.platform``; None = ``detect_platform()``).
- Memory on CPU: weight files on disk (target, plus the draft model for the draft
  method) as loaded in the engine's dtype + the KV cache (``kv_cache_gib``) +
  ``OVERHEAD_GIB`` for the Python processes, against ``MemAvailable`` in /proc/meminfo.
- Memory on CUDA: the weights + the KV cache + ``CUDA_OVERHEAD_GIB`` against the GPU's
  free memory (``Platform.free_memory_bytes``, when known); host memory only for what
  stays on the host (``OVERHEAD_GIB``: vLLM streams the weights to the GPU).
- Disk: when a packaged model (``packaged:...``, or a default hub id while the
  hub is off) still has to be assembled and converted, the cache directory
  (``engine_adapter.engine.models.default_cache_dir``) needs room for the bf16
  weights plus the largest GGUF, which lives there while it is converted.
- A size that cannot be known without the network (a hub model not yet
  downloaded) is left out of the estimate, never guessed.

- ``fits_together(configs)``: None when the engines' host memory (``estimate``), plus
  ``FIT_MARGIN`` of it, fits in what is available now, else a sentence with the sums (a tool that
  would run two engines at once runs them one after the other instead). The margin: a running
  engine can take more than its estimate (docs/benchmarks.md has a float32 engine's figure), and
  the second engine's own check counts what the first has taken.

Overrides (tests, unusual machines): ``SPEC_EXPLORER_MEM_AVAILABLE_GIB`` and
``SPEC_EXPLORER_DISK_FREE_GIB`` replace what the machine reports;
``SPEC_EXPLORER_SKIP_RESOURCE_CHECK=1`` skips the check.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from engine_adapter.engine.platform import Platform, detect_platform
from engine_adapter.engine_config import EngineConfig, resolve_dtype

GIB = 1 << 30
OVERHEAD_GIB = 1.5  # host memory of the API server, engine core and worker: Python, torch, vLLM
# GPU memory beside the weights and the KV cache (GiB): the worker's CUDA context, cuBLAS and
# NCCL workspaces (~0.5), the activations of a full step (max_num_batched_tokens = 8192 tokens
# through the 1.5B target's 8960-wide MLP in bf16, with the attention buffers, ~0.5), the
# sampler's fp32 logits for every verified position (64 requests x 6 x 152k vocabulary x 4
# bytes, ~0.25, plus their sorted copies for top-k/top-p) and the CUDA graphs' memory pool
# (vLLM logs a few hundred MiB for ~50 capture sizes of a model this size). vLLM's
# --kv-cache-memory-bytes skips its own profiling, so nothing else leaves this headroom.
CUDA_OVERHEAD_GIB = 2.0
FIT_MARGIN = 0.10  # engines run side by side: the share of their summed estimate kept free (``fits_together``)
MEM_ENV = "SPEC_EXPLORER_MEM_AVAILABLE_GIB"
DISK_ENV = "SPEC_EXPLORER_DISK_FREE_GIB"
SKIP_ENV = "SPEC_EXPLORER_SKIP_RESOURCE_CHECK"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# bf16 safetensors written from the packaged GGUFs on this project's reference machine
PACKAGED_BF16_BYTES = {"1.5b": 3_554_214_752, "0.5b": 1_260_367_448}


class NotEnoughResources(RuntimeError):
    """The machine lacks memory or disk for this engine; the message says how much."""


@dataclass
class Need:
    models: list[tuple[str, str, int]] = field(default_factory=list)  # (role, spec, weight bytes) known
    unknown: list[str] = field(default_factory=list)  # specs whose size is not known yet
    kv_gib: float = 0.0
    overhead_gib: float = OVERHEAD_GIB  # host memory of the processes
    build: list[str] = field(default_factory=list)  # packaged models still to convert
    disk_bytes: int = 0  # for the conversions
    cache_dir: Path | None = None
    on_gpu: bool = False  # weights and KV cache on the GPU (CUDA), else in host memory
    gpu_overhead_gib: float = 0.0  # CUDA_OVERHEAD_GIB on CUDA

    @property
    def weights_bytes(self) -> int:
        return sum(b for _, _, b in self.models)

    @property
    def memory_bytes(self) -> int:
        """Host memory: everything on CPU, the processes alone on CUDA."""
        host = int(self.overhead_gib * GIB)
        return host if self.on_gpu else host + self.weights_bytes + int(self.kv_gib * GIB)

    @property
    def gpu_bytes(self) -> int:
        """GPU memory (0 on CPU): the weights, the KV cache and CUDA's own overhead."""
        return self.weights_bytes + int((self.kv_gib + self.gpu_overhead_gib) * GIB) if self.on_gpu else 0


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _env_gib(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(float(value) * GIB) if value else None


def mem_available() -> int | None:
    """Bytes the kernel says can be used without swapping (None where /proc/meminfo is missing)."""
    override = _env_gib(MEM_ENV)
    if override is not None:
        return override
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def disk_free(path: Path) -> int:
    override = _env_gib(DISK_ENV)
    if override is not None:
        return override
    p = Path(path).expanduser()
    while not p.exists() and p != p.parent:  # the cache dir may not exist yet
        p = p.parent
    return shutil.disk_usage(p).free


def weight_bytes(model_dir: Path) -> int:
    """Bytes of the weight files in a model directory (links followed, as HF snapshots use)."""
    total = 0
    for f in Path(model_dir).iterdir():
        if f.name.endswith(WEIGHT_SUFFIXES):
            try:
                total += f.stat().st_size
            except OSError:
                pass
    return total


BYTES_PER_PARAM = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_config(model_dir: Path | None) -> dict:
    """A model directory's config.json, or {} where there is none or it does not parse."""
    try:
        return json.loads((Path(model_dir) / "config.json").read_text()) if model_dir else {}
    except (OSError, ValueError):
        return {}


def stored_dtype(model_dir: Path | None) -> str:
    """The dtype a model's weights are stored in (its config.json; the packaged pair: bfloat16)."""
    cfg = model_config(model_dir)
    return str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")


def loaded_bytes(stored_bytes: int, stored: str, dtype: str) -> int:
    """Memory the weights take once loaded in ``dtype`` (bfloat16 files loaded as float32: twice)."""
    have, want = BYTES_PER_PARAM.get(stored), BYTES_PER_PARAM.get(dtype)
    return stored_bytes * want // have if have and want else stored_bytes


def _spec_size(spec: str, cache_dir: Path) -> tuple[int | None, object | None]:
    """(weight bytes or None if unknown, the PackagedModel still to build or None)."""
    from engine_adapter.engine import models

    path = Path(spec).expanduser()
    if path.is_dir():
        return weight_bytes(path), None
    packaged = models.packaged_for(spec)
    if packaged is None:
        return None, None
    final = cache_dir / packaged.final_name
    if models.is_complete(final, packaged):
        return weight_bytes(final), None
    # explicit packaged:..., or a default hub id offline: converted here (online it may come from the hub)
    will_build = spec.lower().startswith("packaged:") or models.hub_offline_env()
    return PACKAGED_BF16_BYTES.get(packaged.key), packaged if will_build else None


def estimate(
    config: EngineConfig,
    target_dir: Path | None = None,
    draft_dir: Path | None = None,
    cache_dir: Path | None = None,
    platform: Platform | None = None,
) -> Need:
    """What the engine needs on ``platform`` (None = ``detect_platform()``)."""
    from engine_adapter.engine.models import default_cache_dir

    platform = platform if platform is not None else detect_platform()
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    need = Need(kv_gib=float(config.kv_cache_gib), cache_dir=cache, on_gpu=platform.is_gpu)
    need.gpu_overhead_gib = CUDA_OVERHEAD_GIB if platform.is_gpu else 0.0
    wanted = [("target", config.target, target_dir)]
    if config.method == "draft":
        wanted.append(("draft", config.draft, draft_dir))
    builds = []
    dtype = resolve_dtype(config.dtype, on_cpu=not platform.is_gpu)
    for role, spec, resolved in wanted:
        if resolved is not None:
            size, build = weight_bytes(Path(resolved)), None
        else:
            size, build = _spec_size(spec, cache)
        if size is None:
            need.unknown.append(spec)
        else:
            local = Path(resolved) if resolved is not None else Path(spec).expanduser()
            stored = stored_dtype(local if local.is_dir() else None)
            need.models.append((role, spec, loaded_bytes(size, stored, dtype)))
        if build is not None and build not in builds:
            builds.append(build)
    if builds:
        need.build = [f"packaged:{m.key}" for m in builds]
        need.disk_bytes = (
            sum(PACKAGED_BF16_BYTES.get(m.key, 2 * m.size) for m in builds) + max(m.size for m in builds) + GIB // 4
        )
    return need


def check_resources(
    config: EngineConfig,
    target_dir: Path | None = None,
    draft_dir: Path | None = None,
    *,
    cache_dir: Path | None = None,
    available: int | None = None,
    free: int | None = None,
    platform: Platform | None = None,
    reserved: int = 0,
) -> Need:
    """Raise NotEnoughResources when disk, host memory or (CUDA) GPU memory clearly cannot hold this
    engine. ``available`` (host bytes) and ``free`` (disk bytes) replace what the machine reports;
    ``reserved`` (host bytes) is kept free for others: what a running engine will still commit."""
    platform = platform if platform is not None else detect_platform()
    need = estimate(config, target_dir, draft_dir, cache_dir, platform)
    if os.environ.get(SKIP_ENV, "").strip() in {"1", "true", "yes"}:
        return need
    if need.build:
        have = free if free is not None else disk_free(need.cache_dir)
        if have < need.disk_bytes:
            raise NotEnoughResources(
                f"not enough free disk space to prepare {' and '.join(need.build)}: converting needs about "
                f"{gib(need.disk_bytes)} in {need.cache_dir}, {gib(have)} is free there; free some space or "
                f"point SPEC_EXPLORER_CACHE at a disk with room"
            )
    if platform.is_gpu:
        _check_gpu(need, platform, config)
    have = available if available is not None else mem_available()
    if have is not None and have - reserved < need.memory_bytes:
        message = _host_message(need, have - reserved)
        if reserved:
            message += f" (of the {gib(have)} free now, {gib(reserved)} is kept for the running engine's KV cache)"
        raise NotEnoughResources(message)
    return need


def fits_together(configs: list[EngineConfig], available: int | None = None) -> str | None:
    """None when every engine in ``configs`` fits in host memory at once with ``FIT_MARGIN`` of their
    summed estimate to spare (or the check is skipped or the machine does not say), else why not,
    in a sentence."""
    if os.environ.get(SKIP_ENV, "").strip() in {"1", "true", "yes"}:
        return None
    have = available if available is not None else mem_available()
    needs = [estimate(c).memory_bytes for c in configs]
    margin = int(FIT_MARGIN * sum(needs))
    if have is None or sum(needs) + margin <= have:
        return None
    each = " + ".join(f"{c.method} {gib(n)}" for c, n in zip(configs, needs))
    return (
        f"the engines need about {gib(sum(needs) + margin)} at once ({each}, and {gib(margin)} for what "
        f"the estimate leaves out), {gib(have)} is available"
    )


def _parts(need: Need, overhead: str) -> str:
    return " + ".join(
        [f"{role} model {gib(b)}" for role, _, b in need.models] + [f"KV cache {need.kv_gib:g} GiB", overhead]
    )


def _host_message(need: Need, have: int) -> str:
    if need.on_gpu:  # the models and the KV cache are on the GPU: the host holds the processes
        return (
            f"not enough free host memory for the engine's processes: they need about {gib(need.memory_bytes)} "
            f"(API server, engine core and GPU worker), {gib(have)} is available; close other programs"
        )
    parts = _parts(need, f"about {need.overhead_gib:g} GiB for the processes")
    return (
        f"not enough free memory for the engine: it needs about {gib(need.memory_bytes)} ({parts}), "
        f"{gib(have)} is available; lower --kv-cache-gib, choose smaller models, or close other programs"
    )


def _check_gpu(need: Need, platform: Platform, config: EngineConfig) -> None:
    """The GPU's free memory (when nvidia-smi told it) against the weights, KV cache and overhead."""
    have = platform.free_memory_bytes
    if have is None or have >= need.gpu_bytes:
        return
    parts = _parts(need, f"about {need.gpu_overhead_gib:g} GiB for CUDA graphs, activations and the CUDA context")
    total = f" of {gib(platform.memory_bytes)}" if platform.memory_bytes else ""
    raise NotEnoughResources(
        f"not enough free GPU memory on {platform.device_name} for the engine: it needs about "
        f"{gib(need.gpu_bytes)} ({parts}), {gib(have)}{total} is free; lower --kv-cache-gib "
        f"(now {config.kv_cache_gib}) or --max-num-seqs (now {config.max_num_seqs}), choose smaller models, "
        f"or stop the other programs using the GPU (nvidia-smi lists them)"
    )
