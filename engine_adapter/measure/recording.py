"""Run prompts on a live (or attached) engine and write a provenance trace.

Contract: ``record(RecordSettings)`` writes the trace at ``settings.out`` in the recorder's
format (``docs/trace-format.md``: a run header, one request line per prompt, a summary)
and returns the summary line. Raises ``ValueError`` / ``EngineStartError`` with a message
a person can act on.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_adapter.acceptance_rule import LOSSLESS, AcceptanceRule
from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig, validate_k_table
from engine_adapter.prompts import read_prompts
from engine_adapter.service.load import run_prompts
from engine_adapter.trace.format import TRACE_FORMAT, request_line


@dataclass
class RecordSettings:
    """What the command line sets (its flags, parsed)."""

    method: str
    k: int
    k_table: str | None
    prompts: Path
    max_tokens: int
    concurrency: int
    temperature: float
    out: Path
    target: str
    draft: str
    dtype: str
    max_model_len: int
    kv_cache_gib: int
    attach: str | None
    acceptance: AcceptanceRule = LOSSLESS


async def record(settings: RecordSettings) -> dict[str, Any]:
    prompts = read_prompts(settings.prompts)
    config = EngineConfig(
        method=settings.method,
        k=settings.k,
        k_table=validate_k_table(settings.k_table) if settings.k_table else None,
        target=settings.target,
        draft=settings.draft,
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        kv_cache_gib=settings.kv_cache_gib,
        # a lossy rule travels on the control channel, which an engine started with a table has
        k_max=settings.k if settings.acceptance.lossy and not settings.k_table else None,
    )
    if settings.acceptance.lossy and (settings.attach or not config.acceptance_rules):
        raise ValueError(
            f"--acceptance {settings.acceptance.name} needs an engine this recorder starts, with speculation on"
        )
    if settings.attach:
        engine = await LiveEngine.attach(settings.attach, k_hint=settings.k)
    else:
        engine = await LiveEngine.launch(
            config, progress=lambda p: print(f"[{p.fraction:4.0%}] {p.message}", file=sys.stderr)
        )
    try:
        if settings.acceptance.lossy:  # from the engine's next step on: each step's "rule" says which verified it
            await engine.client.set_acceptance(settings.acceptance)
        t0 = time.monotonic()
        results = await run_prompts(
            engine.client,
            prompts,
            settings.concurrency,
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            on_result=lambda i, r: print(f"done {i + 1}/{len(prompts)}", file=sys.stderr),
        )
        wall = time.monotonic() - t0
    finally:
        await engine.close()
    total = sum(len(r.token_ids) for r in results)
    run = {
        "type": "run",
        "format": TRACE_FORMAT,
        "method": "attach" if settings.attach else settings.method,
        "k": settings.k,
        "k_table": config.k_table,
        "target": settings.target,
        "draft": settings.draft if settings.method == "draft" else None,
        "dtype": settings.dtype,
        "max_tokens": settings.max_tokens,
        "concurrency": settings.concurrency,
        "temperature": settings.temperature,
        "num_prompts": len(prompts),
        "attach": settings.attach,
        "provenance": "counts" if settings.attach else "tap",
        "acceptance": settings.acceptance.to_dict(),
        "vllm_version": engine.vllm_version,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    summary = {
        "type": "summary",
        "wall_s": wall,
        "total_tokens": total,
        "tokens_per_second": total / wall if wall > 0 else 0.0,
    }
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    with settings.out.open("w", encoding="utf-8") as f:
        for obj in [run, *(request_line(r) for r in results), summary]:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return summary
