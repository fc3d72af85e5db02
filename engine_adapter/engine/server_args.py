"""The argument list for vLLM's OpenAI server, from an ``EngineConfig`` and the platform it runs on.

Contract: ``server_args(config, target_dir, draft_dir, port, platform)`` gives the argument
list for vLLM's OpenAI server, run as ``python -m paths.SERVER_MODULE`` (``vllm_plugin.server_main``:
vLLM's server under a main module its spawned processes import for nothing); ``speculative_config`` the
``--speculative-config`` object. The platform is explicit (``engine.platform``), so both
platforms' launches are built, and tested, on either machine. The plugin's class paths come
from ``vllm_plugin.paths`` (a unit test resolves them to the classes).

Both platforms: an explicit chunked-prefill budget (``--max-num-batched-tokens``,
``batched_tokens``), the effective scheduling mode (``Platform.async_scheduling``: vLLM's CPU
platform forces it off, so a CPU engine gets the synchronous tap scheduler) and, for every
speculative engine with the tap, the platform's verifier worker (it reports the exact draft
ids it verified), the idle drafter's where the drafter idles (``plugin_worker``).
CPU: eager mode unless compiling is asked for; the KV cache is sized by the environment
(``launcher.engine_env``) and always held by a plugin worker, which maps it instead of
writing it. CUDA: the KV cache by ``--kv-cache-memory-bytes`` (vLLM would otherwise take 92 %
of the GPU's memory; ``--gpu-memory-utilization`` is what is free, at most 0.92, since vLLM checks
that much is free at start), CUDA graphs unless eager is asked for, captured at
``platform.cuda_graph_capture_sizes`` (every K up to num_speculative_tokens stays on them); with a K
table (live policies) PIECEWISE, said explicitly: vLLM 0.32's V1 runner turns full graphs off under
dynamic speculative decoding anyway.
"""

from __future__ import annotations

import json
from typing import Any

from engine_adapter.engine.platform import Platform, cuda_graph_capture_sizes, memory_utilization
from engine_adapter.engine_config import (
    CPU_MAX_NUM_BATCHED_TOKENS,
    CUDA_MAX_NUM_BATCHED_TOKENS,
    EngineConfig,
    resolve_dtype,
)
from engine_adapter.vllm_plugin.paths import LAZY_KV_WORKER, QUIET_EXECUTOR, scheduler_class_path, worker_class_path

GIB = 1 << 30  # bytes


def speculative_config(config: EngineConfig, draft_dir: str | None) -> dict[str, Any] | None:
    if config.method == "off":
        return None
    spec: dict[str, Any] = {"num_speculative_tokens": config.num_speculative_tokens}
    if config.method == "ngram":
        spec |= {
            "method": "ngram",
            "prompt_lookup_min": config.ngram_min,
            "prompt_lookup_max": config.ngram_max,
        }
    elif config.method == "draft":
        spec |= {"method": "draft_model", "model": draft_dir}
    elif config.method == "suffix":
        spec |= {"method": "suffix"}
    table = config.k_table
    if table is None and config.live_policies:
        table = [(1, config.max_num_seqs, config.k)]  # table mode from the start: live-switchable
    if table is not None:
        spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in table]
    return spec


def batched_tokens(config: EngineConfig, platform: Platform) -> int:
    """The step's token budget (``--max-num-batched-tokens``): the config's, or the platform's
    default, never below max_num_seqs (vLLM's own rule: every running request gets a token)."""
    if config.max_num_batched_tokens is not None:
        return config.max_num_batched_tokens
    default = CUDA_MAX_NUM_BATCHED_TOKENS if platform.is_gpu else CPU_MAX_NUM_BATCHED_TOKENS
    return max(default, config.max_num_seqs)


def eager(config: EngineConfig, platform: Platform) -> bool:
    """Whether the engine runs eager (the config's choice, or the platform's default)."""
    return platform.eager(config.enforce_eager)


def async_scheduling(config: EngineConfig, platform: Platform) -> bool:
    """The scheduling mode the engine really runs in (vLLM's CPU platform forces sync)."""
    return platform.async_scheduling(config.async_scheduling)


def dynamic_k(config: EngineConfig) -> bool:
    """Whether vLLM is given a batch-size -> K table (live policies): its K varies step by step."""
    return speculative_config(config, None) is not None and config.k_by_batch_size


def capture_sizes(config: EngineConfig, platform: Platform) -> list[int]:
    """The CUDA-graph capture sizes (tokens) the engine is started with; [] where it runs eager."""
    if not platform.is_gpu or eager(config, platform):
        return []
    tokens = batched_tokens(config, platform)
    full = config.num_speculative_tokens > 0 and not dynamic_k(config)
    return cuda_graph_capture_sizes(config.max_num_seqs, config.num_speculative_tokens, tokens, full)


def compilation_config(config: EngineConfig, platform: Platform) -> dict[str, Any]:
    """``--compilation-config`` on a GPU with CUDA graphs: the capture sizes, and PIECEWISE graphs
    where K varies (vLLM 0.32's V1 runner would override FULL to it, with a warning)."""
    out: dict[str, Any] = {"cudagraph_capture_sizes": capture_sizes(config, platform)}
    if dynamic_k(config):
        out["cudagraph_mode"] = "PIECEWISE"
    return out


def _platform_args(config: EngineConfig, platform: Platform) -> list[str]:
    """What differs by platform: the KV cache's size (CUDA; CPU: the environment), eager mode,
    the CUDA-graph capture sizes."""
    args: list[str] = []
    if platform.is_gpu:
        args += ["--kv-cache-memory-bytes", str(int(config.kv_cache_gib) * GIB)]
        if (fraction := memory_utilization(platform)) is not None:
            args += ["--gpu-memory-utilization", str(fraction)]
    if eager(config, platform):
        args.append("--enforce-eager")
    elif platform.is_gpu:
        args += ["--compilation-config", json.dumps(compilation_config(config, platform))]
    return args


def plugin_worker(config: EngineConfig, platform: Platform) -> str | None:
    """The plugin's ``--worker-cls``, or None for vLLM's own. A speculative engine with the tap gets
    the platform's verifier (it reports the draft ids it verified), the idle drafter's where the
    drafter idles; any other CPU launch the worker whose KV cache is committed at first use, as
    every CPU worker of the plugin's is (vllm_plugin/cpu_tuning/lazy_kv_cache.py: writing it cost 20 s of a
    launch on the AVX-512 machine)."""
    if config.tap and config.method != "off":
        return worker_class_path(platform.kind, idle_drafter=config.drafter_idles)
    return None if platform.is_gpu else LAZY_KV_WORKER


def _plugin_args(config: EngineConfig, platform: Platform) -> list[str]:
    """Scheduling mode, the tap's scheduler and the plugin's worker."""
    mode = async_scheduling(config, platform)
    # On CPU vLLM's platform runs every scheduler synchronously; there the tap keeps vLLM's async
    # scheduler class wherever vLLM allows it, which the project's earliest CPU figures ran on
    # (docs/gpu.md, "What has not been run": a profile on tiny models admitting its batch one request
    # at a time, cause not found).
    scheduler_async = mode or (not platform.is_gpu and config.vllm_allows_async)
    args = ["--async-scheduling" if scheduler_async else "--no-async-scheduling"]
    if config.tap:
        args += ["--scheduler-cls", scheduler_class_path(scheduler_async)]
    if (worker := plugin_worker(config, platform)) is not None:
        args += ["--worker-cls", worker]
    if not platform.is_gpu:
        # vLLM's own executor on a CPU (its platform runs no other), whose engine core spins only 5 ms
        # after each answer of its worker and then polls in 2 ms waits, instead of spinning while it
        # computes: over half a core, shared with the page (vllm_plugin/cpu_tuning/quiet_executor.py)
        args += ["--distributed-executor-backend", QUIET_EXECUTOR]
    if config.drafter_idles:
        # no prefix caching: a cached block's draft KV may hold a hole its writer never caught up,
        # which another request would then draft from (docs/catch-up-design.md, section 7)
        args.append("--no-enable-prefix-caching")
    return args


def server_args(
    config: EngineConfig, target_dir: str, draft_dir: str | None, port: int, platform: Platform
) -> list[str]:
    """Arguments for vLLM's OpenAI server (``python -m paths.SERVER_MODULE``) on ``platform``."""
    args = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        target_dir,
        "--served-model-name",
        "target",
        "--dtype",
        resolve_dtype(config.dtype, on_cpu=not platform.is_gpu),
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--max-num-batched-tokens",
        str(batched_tokens(config, platform)),
        "--enable-chunked-prefill",
        "--stream-interval",
        "1",
        "--seed",
        "0",
        # no cross-origin access: a web page a visitor opens cannot call the engine (vLLM allows every origin)
        "--allowed-origins",
        "[]",
    ]
    args += _platform_args(config, platform)
    spec = speculative_config(config, draft_dir)
    if spec is not None:
        args += [
            "--speculative-config",
            json.dumps(spec),
            "--per-request-spec-decode-metrics",
            "detailed",
        ]
    args += _plugin_args(config, platform)
    return args + list(config.extra_args)
