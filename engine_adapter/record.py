"""Recorder CLI: run prompts on a live engine and write a provenance trace.

    python -m engine_adapter.record --method {off,ngram,draft} --k K \\
        --prompts FILE --max-tokens N --concurrency C --temperature T \\
        --out TRACE.jsonl [--target SPEC] [--draft SPEC] [--attach URL]

FILE is JSONL, one {"prompt": "..."} per line (other keys are ignored).
TRACE.jsonl (format documented in the README, "Trace format"):
    {"type": "run", ...config, "vllm_version"}
    {"type": "request", "prompt", "text", "token_ids", "kinds", "steps",
     "spec_decode_metrics", "tokens_per_second", ...}       one per prompt
    {"type": "summary", "wall_s", "total_tokens", "tokens_per_second"}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig, validate_k_table
from engine_adapter.engine.launcher import EngineStartError
from engine_adapter.service.load import run_prompts
from engine_adapter.engine_config import DEFAULT_DRAFT, DEFAULT_TARGET
from engine_adapter.prompts import read_prompts
from engine_adapter.trace.format import request_line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine_adapter.record", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=["off", "ngram", "draft", "suffix"], default="draft")
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens (default 3)")
    p.add_argument("--k-table", default=None,
                   help="num_speculative_tokens_per_batch_size as JSON, e.g. '[[1,4,3],[5,64,0]]'")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-gib", type=int, default=2)
    p.add_argument("--attach", default=None, help="record from a running vLLM server at this URL")
    return p


async def record(args: argparse.Namespace) -> dict[str, Any]:
    prompts = read_prompts(args.prompts)
    config = EngineConfig(
        method=args.method, k=args.k,
        k_table=validate_k_table(args.k_table) if args.k_table else None,
        target=args.target, draft=args.draft, dtype=args.dtype,
        max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib,
    )
    if args.attach:
        engine = await LiveEngine.attach(args.attach, k_hint=args.k)
    else:
        engine = await LiveEngine.launch(
            config, progress=lambda p: print(f"[{p.fraction:4.0%}] {p.message}", file=sys.stderr)
        )
    try:
        t0 = time.monotonic()
        results = await run_prompts(
            engine.client, prompts, args.concurrency,
            max_tokens=args.max_tokens, temperature=args.temperature,
            on_result=lambda i, r: print(f"done {i + 1}/{len(prompts)}", file=sys.stderr),
        )
        wall = time.monotonic() - t0
    finally:
        await engine.close()
    total = sum(len(r.token_ids) for r in results)
    run = {
        "type": "run",
        "method": "attach" if args.attach else args.method,
        "k": args.k,
        "k_table": config.k_table,
        "target": args.target,
        "draft": args.draft if args.method == "draft" else None,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "temperature": args.temperature,
        "num_prompts": len(prompts),
        "attach": args.attach,
        "provenance": "counts" if args.attach else "tap",
        "vllm_version": engine.vllm_version,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    summary = {"type": "summary", "wall_s": wall, "total_tokens": total,
               "tokens_per_second": total / wall if wall > 0 else 0.0}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for obj in [run, *(request_line(r) for r in results), summary]:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = asyncio.run(record(args))
    except (ValueError, EngineStartError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
