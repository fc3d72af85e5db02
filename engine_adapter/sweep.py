"""Sweep K policies against concurrency on a live engine, in one run.

    python -m engine_adapter.sweep --concurrency 1,2,4,8,16 --policies off,k1,k3,k5,table \\
        --prompts FILE --max-tokens N --out sweep.csv [--method draft] [--table JSON]

Policies: ``off`` (no speculation), ``kN`` (fixed K=N), ``table`` (vLLM's
``num_speculative_tokens_per_batch_size``, from --table). Each policy runs on
its own engine start (the policies that switch live, ``auto`` and
``auction``, need the scheduler's control channel: not built yet, refused with
a clear message). For each (policy, concurrency) a closed loop runs
max(C, --min-requests) prompts; the tap gives server-wide step counts.

CSV columns: policy, concurrency, total_tokens_per_s, per_request_tokens_per_s,
mean_accepted_per_step, effective_k, draft_acceptance_rate. A table is printed,
then a JSON last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engine_adapter.engine import LiveEngine
from engine_adapter.engine_config import EngineConfig, KTable, validate_k_table
from engine_adapter.load import run_prompts
from engine_adapter.models import DEFAULT_DRAFT, DEFAULT_TARGET
from engine_adapter.record import read_prompts

COLUMNS = ["policy", "concurrency", "total_tokens_per_s", "per_request_tokens_per_s",
           "mean_accepted_per_step", "effective_k", "draft_acceptance_rate"]


@dataclass(frozen=True)
class Policy:
    name: str
    method: str
    k: int
    k_table: KTable | None = None


def parse_policy(name: str, method: str, table: KTable | None) -> Policy:
    if name == "off":
        return Policy(name, "off", 1)
    if m := re.fullmatch(r"k(\d+)", name):
        return Policy(name, method, int(m.group(1)))
    if name == "table":
        if table is None:
            raise ValueError("policy 'table' needs --table '[[start_bs, end_bs, K], ...]'")
        return Policy(name, method, max(k for _, _, k in table) or 1, table)
    if name in ("auto", "auction"):
        raise ValueError(f"policy {name!r} needs the live control channel of the scheduler tap "
                         "(issue 'K under load'), which is not built yet")
    raise ValueError(f"unknown policy {name!r}: use off, kN (e.g. k3), table")


async def measure_policy(engine: LiveEngine, prompts: list[str], concurrency: int,
                         max_tokens: int) -> dict[str, Any]:
    watch = engine.client.tap.watch()
    try:
        t0 = time.monotonic()
        results = await run_prompts(engine.client, prompts, concurrency, max_tokens=max_tokens)
        wall = time.monotonic() - t0
        steps = []
        while not watch.empty():
            steps.append(watch.get_nowait())
    finally:
        engine.client.tap.unwatch(watch)
    drafted = sum(s.num_drafted for s in steps)
    accepted = sum(s.num_accepted for s in steps)
    drafting = sum(s.num_drafting for s in steps)
    request_steps = sum(s.batch_size for s in steps)
    tokens = sum(len(r.token_ids) for r in results)
    return {
        "concurrency": concurrency,
        "total_tokens_per_s": round(tokens / wall, 3),
        "per_request_tokens_per_s": round(statistics.mean(r.tokens_per_second for r in results), 3),
        "mean_accepted_per_step": round(accepted / request_steps, 4) if request_steps else 0.0,
        "effective_k": round(drafted / drafting, 4) if drafting else 0.0,
        "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else None,
    }


async def sweep(args: argparse.Namespace) -> pd.DataFrame:
    prompts = read_prompts(args.prompts)
    table = validate_k_table(args.table) if args.table else None
    policies = [parse_policy(p, args.method, table) for p in args.policies]
    rows = []
    for pol in policies:
        print(f"== {pol.name}: starting engine", file=sys.stderr)
        cfg = EngineConfig(method=pol.method, k=pol.k, k_table=pol.k_table, target=args.target,
                           draft=args.draft, max_model_len=2048, max_num_seqs=max(args.concurrency),
                           kv_cache_gib=args.kv_cache_gib)
        engine = await LiveEngine.launch(cfg)
        try:
            await run_prompts(engine.client, prompts[:1], 1, max_tokens=8)  # warm-up
            for c in args.concurrency:
                n = max(c, args.min_requests)
                batch = [prompts[i % len(prompts)] for i in range(n)]
                row = {"policy": pol.name, **await measure_policy(engine, batch, c, args.max_tokens)}
                print(f"   c={c}: {row['total_tokens_per_s']:.2f} tok/s", file=sys.stderr)
                rows.append(row)
        finally:
            await engine.close()
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine_adapter.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--policies", default="off,k1,k3,k5")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--method", choices=["ngram", "draft", "suffix"], default="draft")
    p.add_argument("--table", default=None, help="K table for the 'table' policy (JSON)")
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--kv-cache-gib", type=int, default=2)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.policies = args.policies.split(",")
    try:
        df = asyncio.run(sweep(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(df.to_string(index=False))
    print(json.dumps({"rows": df.to_dict(orient="records")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
