"""Reading vLLM's start-up log: the milestones a start reports, and a failed start's cause in words.

Contract: ``milestones_seen(log, seen)`` gives the start-up milestones found in the log after the
``seen`` first (``StartProgress`` records, in vLLM's order; a platform's missing ones skipped);
``explain_failure(log, config, platform, port)`` the cause of a failed start as a sentence that
says what to change, or None; ``port_taken_in(log)`` whether it failed binding its port.
Pure: strings in, records out (``launcher.py`` reads the log file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine_adapter.engine.platform import Platform
from engine_adapter.engine_config import EngineConfig


@dataclass(frozen=True)
class StartProgress:
    stage: str
    fraction: float  # 0..1 of the whole start-up
    message: str


ProgressFn = Callable[[StartProgress], None]

# log line fragment -> (stage, fraction, message); vLLM's own log, in the order it logs them.
# A start reports each one it finds, in this order, and skips those its platform never logs
# (``_wait_ready``): "Warming up model" is the CPU runner's, the CUDA graphs the GPU runner's
# (``v1/worker/gpu_model_runner.py``: a progress bar "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)",
# then "Graph capturing finished in N secs"), both after the KV cache is allocated and before
# the engine core's "init engine (profile, create kv cache, warmup model) took".
_MILESTONES = (
    ("Initializing a V1 LLM engine", "engine", 0.35, "engine core starting"),
    ("Loading weights took", "weights", 0.55, "weights loaded"),
    ("Loading drafter model", "draft", 0.6, "loading the draft model"),
    ("Warming up model", "warmup", 0.7, "warming up"),
    ("Capturing CUDA graphs", "graphs", 0.72, "capturing CUDA graphs"),
    ("Graph capturing finished", "graphs", 0.82, "CUDA graphs captured"),
    ("init engine", "kv", 0.85, "KV cache ready"),
    ("Starting vLLM server", "http", 0.9, "HTTP server starting"),
    ("Application startup complete", "ready", 0.95, "server up"),
)

# the OSError of vLLM's API server binding its port (``entrypoints/launchers/launcher.py``)
_PORT_TAKEN = "Address already in use"

# What a GPU user changes when the GPU's memory runs out (app.py's flags).
_GPU_MEMORY_ADVICE = (
    "lower --kv-cache-gib (now {kv} GiB) or --max-num-seqs (now {seqs}), use smaller models, "
    "or stop the other programs using the GPU (nvidia-smi lists them)"
)
# log fragment -> explanation; checked in order against the log of a failed start: CUDA's own
# failures before the generic "out of memory" (torch's CUDA message contains it too). Fields:
# {port}, {kv} (kv_cache_gib), {seqs} (max_num_seqs), {device} (the platform's device name).
_FAILURES = (
    (_PORT_TAKEN, "port {port} on 127.0.0.1 is already taken by another program"),
    # the tap's own refusal (vllm_plugin/tap.py): vLLM chose Model Runner V2 despite the launch's pin
    (
        "the explorer's plugin needs vLLM's Model Runner V1",
        "vLLM chose its Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1 set by hand, or a feature that needs V2), "
        "which the explorer's plugin does not hook; the explorer needs V1: unset it, or drop that feature",
    ),
    # torch: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..."
    ("CUDA out of memory", "the GPU ({device}) ran out of memory; " + _GPU_MEMORY_ADVICE),
    ("torch.OutOfMemoryError", "the GPU ({device}) ran out of memory; " + _GPU_MEMORY_ADVICE),
    ("CUDA error: out of memory", "the GPU ({device}) ran out of memory; " + _GPU_MEMORY_ADVICE),
    # vLLM's start-up check (v1/worker/utils.py, request_memory): even with a fixed KV cache size it
    # wants gpu_memory_utilization (0.92 by default) of the GPU's memory free when it starts
    (
        "is less than desired GPU memory utilization",
        "other programs took memory on the GPU ({device}) after the launch looked: vLLM wants the "
        "--gpu-memory-utilization fraction (what was free then, at most 0.92) free at start, whatever the "
        "KV cache size; stop the programs nvidia-smi lists, or use a GPU of its own",
    ),
    (
        "no kernel image is available for execution on the device",
        "the installed PyTorch/vLLM has no kernels for this GPU's architecture ({device}); install a "
        "vLLM and PyTorch built for it, or use a GPU they support (the CPU build runs anywhere: .[cpu])",
    ),
    (
        "CUDA driver version is insufficient",
        "the NVIDIA driver is older than the CUDA that vLLM's PyTorch was built for; update the NVIDIA "
        "driver (or install a PyTorch built for the CUDA version nvidia-smi shows)",
    ),
    (
        "Found no NVIDIA driver",
        "no NVIDIA driver was found; install the NVIDIA driver, or use vLLM's CPU build (pip install -e .[cpu])",
    ),
    (
        "No CUDA GPUs are available",
        "vLLM's CUDA build found no GPU; check that nvidia-smi lists one and that CUDA_VISIBLE_DEVICES "
        "names it, or use vLLM's CPU build (pip install -e .[cpu])",
    ),
    (
        "is less than requested memory for kv",
        "not enough free memory for the KV cache it was asked to "
        "reserve (kv_cache_gib={kv} GiB); lower it or free memory",
    ),
    (
        "to serve at least one request",
        "the KV cache (kv_cache_gib={kv} GiB) is too small for max_model_len; "
        "raise kv_cache_gib or lower max_model_len",
    ),
    (
        "out of memory",
        "the machine ran out of memory while loading the models; "
        "lower the KV cache (kv_cache_gib) or use smaller models",
    ),
    ("Cannot allocate memory", "the machine ran out of memory while loading the models"),
    ("MemoryError", "the machine ran out of memory while loading the models"),
    ("Insufficient memory", "not enough memory for the KV cache; lower kv_cache_gib"),
    ("No available memory for the cache blocks", "not enough memory for the KV cache; raise kv_cache_gib"),
    ("is larger than the maximum", "max_model_len is larger than the KV cache or the model allows"),
    ("does not appear to have a file named", "the model directory is missing files vLLM needs"),
    ("Invalid repository ID", "the model path does not exist and is not a hub id"),
    ("No such file or directory", "a model file or directory does not exist"),
)


def explain_failure(log: str, config: EngineConfig, platform: Platform, port: int | None) -> str | None:
    """Why a start failed, in words, from vLLM's log; None where no known cause is in it."""
    for needle, why in _FAILURES:
        if needle in log:
            return why.format(port=port, kv=config.kv_cache_gib, seqs=config.max_num_seqs, device=platform.device_name)
    return None


def port_taken_in(log: str) -> bool:
    """Whether a failed start's log says vLLM could not bind its port."""
    return _PORT_TAKEN in log


def milestones_seen(log: str, seen: int) -> list[tuple[int, StartProgress]]:
    """The milestones after the ``seen`` first (by position in ``_MILESTONES``) that ``log`` holds,
    as (position, progress): a platform's missing ones are skipped, later ones still reported."""
    return [
        (i, StartProgress(stage, frac, msg))
        for i, (needle, stage, frac, msg) in enumerate(_MILESTONES)
        if i >= seen and needle in log
    ]
