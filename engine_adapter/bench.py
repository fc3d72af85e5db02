"""Benchmark: speculation against concurrency on a live engine, in one run.

    python -m engine_adapter.bench [--methods off,ngram,draft] [--concurrency 1,4,16]
                                   [--k 3] [--max-tokens 64] [--categories code,story,...]
    python -m engine_adapter.bench --tap-overhead [--rounds 3]

Default mode: for each method, start the engine (packaged pair unless
--target/--draft), and for each concurrency C run a closed loop with C
requests in flight over max(C, 4) preset prompts (ordered round-robin by
category). Reports total tokens/s, mean acceptance length and draft
acceptance rate (pooled over requests, vLLM's definitions) and the ratio to
``off`` at the same C. Prints a table, then a JSON last line.

``--tap-overhead``: starts the draft-model engine twice, with and without the
scheduler tap, and alternates identical runs between them (A B A B ...) at
concurrency 1 and 16, so machine noise hits both alike; reports median
tokens/s of each and the tap's own time per step against the step's wall
time (measured inside the engine by the tap itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig
from engine_adapter.service.load import run_prompts
from engine_adapter.engine_config import DEFAULT_DRAFT, DEFAULT_TARGET
from engine_adapter.prompts import load_presets
from engine_adapter.records import RequestResult


def mixed_prompts(categories: list[str] | None) -> list[str]:
    """The preset prompts of these categories (all when None), round-robin by category."""
    by_cat: dict[str, list[str]] = {}
    for preset in load_presets(categories=categories):
        by_cat.setdefault(preset.category, []).append(preset.prompt)
    # round-robin over categories so any prefix mixes the tasks
    out: list[str] = []
    for i in range(max(map(len, by_cat.values()))):
        out += [ps[i] for ps in by_cat.values() if i < len(ps)]
    return out


def prompts_for(presets: list[str], n: int) -> list[str]:
    return [presets[i % len(presets)] for i in range(n)]


async def measure(engine: LiveEngine, prompts: list[str], concurrency: int, max_tokens: int) -> dict[str, Any]:
    return (await measure_results(engine, prompts, concurrency, max_tokens))[0]


async def measure_results(
    engine: LiveEngine, prompts: list[str], concurrency: int, max_tokens: int
) -> tuple[dict[str, Any], list[RequestResult]]:
    """``measure``'s figures and the requests' own results (in prompt order)."""
    t0 = time.monotonic()
    results = await run_prompts(engine.client, prompts, concurrency, max_tokens=max_tokens)
    wall = time.monotonic() - t0
    tokens = sum(len(r.token_ids) for r in results)
    metrics = [r.spec_decode_metrics for r in results if r.spec_decode_metrics]
    drafted = sum(m["num_draft_tokens"] for m in metrics)
    accepted = sum(m["num_accepted_draft_tokens"] for m in metrics)
    steps = sum(m["num_spec_steps"] for m in metrics)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 3),
        "per_request_tokens_per_s": round(statistics.mean(r.tokens_per_second for r in results), 3),
        "mean_acceptance_length": round(1 + accepted / steps, 4) if steps else None,
        "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else None,
    }, results


def _config(args: argparse.Namespace, method: str, tap: bool = True) -> EngineConfig:
    return EngineConfig(method=method, k=args.k, target=args.target, draft=args.draft,
                        kv_cache_gib=args.kv_cache_gib, max_model_len=2048,
                        max_num_seqs=max(args.concurrency), tap=tap)


def _progress(p) -> None:
    print(f"  [{p.fraction:4.0%}] {p.message}", file=sys.stderr)


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    presets = mixed_prompts(args.categories)
    rows: list[dict[str, Any]] = []
    for method in args.methods:
        print(f"== {method}: starting engine", file=sys.stderr)
        engine = await LiveEngine.launch(_config(args, method), progress=_progress)
        try:
            await measure(engine, presets[:1], 1, 8)  # warm-up, not reported
            for c in args.concurrency:
                row = {"method": method, **await measure(
                    engine, prompts_for(presets, max(c, args.min_requests)), c, args.max_tokens)}
                print(f"   c={c}: {row['tokens_per_s']:.1f} tok/s", file=sys.stderr)
                rows.append(row)
        finally:
            await engine.close()
    off = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["method"] == "off"}
    for r in rows:
        base = off.get(r["concurrency"])
        r["ratio_to_off"] = round(r["tokens_per_s"] / base, 3) if base else None
    return rows


async def tap_overhead(args: argparse.Namespace) -> dict[str, Any]:
    presets = mixed_prompts(args.categories)
    engines = {}
    for tap in (True, False):
        print(f"== draft engine, tap={'on' if tap else 'off'}", file=sys.stderr)
        engines[tap] = await LiveEngine.launch(_config(args, "draft", tap=tap), progress=_progress)
    watch = engines[True].client.tap.watch()
    out: dict[str, Any] = {"rounds": args.rounds, "runs": {}}
    try:
        for c in args.concurrency:
            prompts = prompts_for(presets, max(c, args.min_requests))
            speeds: dict[str, list[float]] = {"on": [], "off": []}
            ratios: list[float] = []
            for _ in range(args.rounds):
                for tap in (True, False):  # interleaved: A B A B
                    while not watch.empty():
                        watch.get_nowait()
                    m = await measure(engines[tap], prompts, c, args.max_tokens)
                    speeds["on" if tap else "off"].append(m["tokens_per_s"])
                    if tap:
                        steps = []
                        while not watch.empty():
                            steps.append(watch.get_nowait())
                        # tap_s of a step is reported with the next step
                        ratios += [b.tap_s / a.wall_s for a, b in zip(steps, steps[1:]) if a.wall_s > 0]
            out["runs"][str(c)] = {
                "tokens_per_s_tap_on": statistics.median(speeds["on"]),
                "tokens_per_s_tap_off": statistics.median(speeds["off"]),
                "ratio_on_to_off": round(statistics.median(speeds["on"]) / statistics.median(speeds["off"]), 4),
                "all_on": speeds["on"], "all_off": speeds["off"],
                "tap_time_over_step_time_median": round(statistics.median(ratios), 6) if ratios else None,
                "tap_time_over_step_time_p99": round(sorted(ratios)[int(0.99 * (len(ratios) - 1))], 6) if ratios else None,
                "tap_time_over_step_time_max": round(max(ratios), 6) if ratios else None,
                "steps_measured": len(ratios),
            }
    finally:
        for e in engines.values():
            await e.close()
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    head = f"{'method':8} {'C':>3} {'tok/s':>8} {'x off':>6} {'req tok/s':>9} {'mean AL':>8} {'accept':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        mal = f"{r['mean_acceptance_length']:.3f}" if r["mean_acceptance_length"] else "-"
        dar = f"{r['draft_acceptance_rate']:.3f}" if r["draft_acceptance_rate"] is not None else "-"
        ratio = f"{r['ratio_to_off']:.2f}" if r["ratio_to_off"] else "-"
        print(f"{r['method']:8} {r['concurrency']:>3} {r['tokens_per_s']:>8.2f} {ratio:>6} "
              f"{r['per_request_tokens_per_s']:>9.2f} {mal:>8} {dar:>7}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine_adapter.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="off,ngram,draft")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument("--categories", default="code,math,story,translation")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--kv-cache-gib", type=int, default=2)
    p.add_argument("--tap-overhead", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    args.methods = args.methods.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.categories = args.categories.split(",") if args.categories else None
    if args.tap_overhead:
        out = asyncio.run(tap_overhead(args))
        for c, r in out["runs"].items():
            print(f"c={c}: tap on {r['tokens_per_s_tap_on']:.2f} tok/s, off {r['tokens_per_s_tap_off']:.2f} "
                  f"(ratio {r['ratio_on_to_off']:.3f}); tap time / step time: median "
                  f"{r['tap_time_over_step_time_median']}, p99 {r['tap_time_over_step_time_p99']}")
        print(json.dumps(out))
        return 0
    rows = asyncio.run(bench(args))
    print_table(rows)
    print(json.dumps({"machine": "see README", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
