"""The argument list for vLLM's OpenAI server, from an ``EngineConfig``.

Contract: ``server_args(config, target_dir, draft_dir, port)`` gives the argument
list for ``python -m vllm.entrypoints.openai.api_server``; ``speculative_config``
the ``--speculative-config`` object. The plugin's class paths come from
``vllm_plugin.paths`` (a unit test resolves them to the classes).
"""

from __future__ import annotations

import json
from typing import Any

from engine_adapter.engine_config import EngineConfig, resolve_dtype
from engine_adapter.vllm_plugin.paths import ACCEPTANCE_RULE_WORKER, IDLE_DRAFTER_WORKER, scheduler_class_path


def speculative_config(config: EngineConfig, draft_dir: str | None) -> dict[str, Any] | None:
    if config.method == "off":
        return None
    spec: dict[str, Any] = {"num_speculative_tokens": config.k_max or config.k}
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
    if table is None and config.k_max is not None:
        table = [(1, config.max_num_seqs, config.k)]  # table mode from the start: live-switchable
    if table is not None:
        spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in table]
    return spec


def server_args(config: EngineConfig, target_dir: str, draft_dir: str | None, port: int) -> list[str]:
    """Arguments for ``python -m vllm.entrypoints.openai.api_server``."""
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
        resolve_dtype(config.dtype),
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--stream-interval",
        "1",
        "--seed",
        "0",
    ]
    if config.enforce_eager:
        args.append("--enforce-eager")
    spec = speculative_config(config, draft_dir)
    if spec is not None:
        args += [
            "--speculative-config",
            json.dumps(spec),
            "--per-request-spec-decode-metrics",
            "detailed",
        ]
    args.append("--async-scheduling" if config.async_scheduling else "--no-async-scheduling")
    if config.tap:
        args += ["--scheduler-cls", scheduler_class_path(config.async_scheduling)]
    if config.drafter_idles:
        # no prefix caching: a cached block's draft KV may hold a hole its writer never caught up,
        # which another request would then draft from (docs/catch-up-design.md, section 7)
        args += ["--worker-cls", IDLE_DRAFTER_WORKER, "--no-enable-prefix-caching"]  # acceptance rules too
    elif config.acceptance_rules:
        args += ["--worker-cls", ACCEPTANCE_RULE_WORKER]
    return args + list(config.extra_args)
