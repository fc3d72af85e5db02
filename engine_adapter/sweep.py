"""Sweep K policies against concurrency on live engines, in one run.

    python -m engine_adapter.sweep --concurrency 1,2,4,8,16 \\
        --policies off,k1,k3,k5,table,auto,auction --prompts FILE --max-tokens N \\
        --out sweep.csv [--method draft] [--table JSON] [--k-max 5] [--by-category]
        [--window-s 20 | --window-s 0] [--repeats N] [--steps-out STEPS.jsonl]

Policies: ``off`` (an engine started with speculation off), ``kN`` (fixed
K=N), ``table`` (vLLM's ``num_speculative_tokens_per_batch_size``, from
--table), ``auto`` (the table derived from the measured cost model and the
acceptance measured so far in this sweep), ``auction`` (the scheduler tap's
slot auction under the cost model). Every policy but ``off`` runs on ONE
engine started for live policies (num_speculative_tokens = --k-max) and is
switched through the control channel, without a restart; the cost model is
profiled once (or read from the per-machine cache).

Policies are interleaved within each concurrency level (c=1: every policy,
then c=2: ...), so the ones compared at a level ran minutes apart at most,
not a whole sweep apart. For each (policy, concurrency[, category]) a closed
loop keeps C requests in flight, cycling through the prompts, and is measured
over --window-s seconds from its first completion: the level's steady state,
as the explorer's own load makes it (``run_policy_window``). With --window-s 0
it runs one wave of max(C, --min-requests) prompts instead and measures it from
the first send to the last token, ramp-up included (``run_policy``): on 2 CPUs
the wave's first request is prefilled alone, so a policy that drafts at batch
size 1 pays the draft model's prefill for it and then loses it as the wave
lands. The tap gives server-wide step counts (inside the window).
With --repeats N every policy runs N times per level, in rounds that each start
one policy later; the CSV gives the median run's tokens/s (and the min and max)
and pools the step counts of all runs.

FILE is JSONL with a "prompt" per line and optionally a "category";
--by-category measures each category on its own and adds a ``category`` column.

CSV columns: policy, concurrency, total_tokens_per_s, per_request_tokens_per_s,
mean_accepted_per_step, effective_k, draft_acceptance_rate (+ category), then
acceptance_per_position (kept/tested per draft position, space-separated,
pooled over the level's steps) and acceptance_per_position_per_text (the same
with each distinct prompt weighted once, so levels that ran the prompts a
different number of times compare the same texts), runs, total_tokens_per_s_min,
total_tokens_per_s_max, measured_s (the median run's measured seconds: the
window, or the wave's wall time), mean_batch_size, mean_step_s and mean_tap_s
(per step, pooled: requests, the step's wall seconds, the tap's own seconds in
it). A table is printed, then a JSON last line. --steps-out writes every measured
step of every run as a JSONL line (the session trace's ``engine_step`` fields,
``t`` from the run's first step, plus policy, concurrency, category and run).
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

import httpx
import pandas as pd

from engine_adapter.bench import measure, measure_results
from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig, KTable, validate_k_table
from engine_adapter.acceptance import PositionCounts
from engine_adapter.service.load import BackgroundLoad
from engine_adapter.engine_config import DEFAULT_DRAFT, DEFAULT_TARGET
from engine_adapter.policy.controller import PolicyController, PolicySpec
from engine_adapter.engine.prometheus import fetch_snapshot
from engine_adapter.policy.profiler import config_cache_path, load_cached, profile_engine, save_cached
from engine_adapter.acceptance import position_counts
from engine_adapter.prompts import read_prompts
from engine_adapter.records import EngineStep, RequestResult
from engine_adapter.trace.format import engine_step_line

COLUMNS = ["policy", "concurrency", "total_tokens_per_s", "per_request_tokens_per_s",
           "mean_accepted_per_step", "effective_k", "draft_acceptance_rate"]
EXTRA_COLUMNS = ["acceptance_per_position", "acceptance_per_position_per_text",
                 "runs", "total_tokens_per_s_min", "total_tokens_per_s_max", "measured_s",
                 "mean_batch_size", "mean_step_s", "mean_tap_s"]


@dataclass(frozen=True)
class Policy:
    name: str  # as given on the command line
    spec: PolicySpec | None  # None = the speculation-off engine


def parse_policy(name: str, table: KTable | None) -> Policy:
    if name == "off":
        return Policy(name, None)
    if m := re.fullmatch(r"k(\d+)", name):
        return Policy(name, PolicySpec("fixed", int(m.group(1))))
    if name == "table":
        if table is None:
            raise ValueError("policy 'table' needs --table '[[start_bs, end_bs, K], ...]'")
        return Policy(name, PolicySpec("table", table=table))
    if name in ("auto", "auction"):
        return Policy(name, PolicySpec(name))
    raise ValueError(f"unknown policy {name!r}: use off, kN (e.g. k3), table, auto, auction")


def k_needed(policies: list[Policy], k_max: int) -> int:
    """num_speculative_tokens for the live engine: the largest K any policy asks for."""
    ks = [k_max if p.spec.kind in ("auto", "auction") else
          p.spec.k if p.spec.kind == "fixed" else max(r[2] for r in p.spec.table)
          for p in policies if p.spec is not None]
    return max(ks, default=k_max) or 1


def acceptance_per_text(results: list[RequestResult]) -> list[float]:
    """Acceptance per draft position with every distinct prompt weighted once.

    A level runs max(C, --min-requests) requests cycling through the prompts, so
    pooled counts weigh the texts differently at each level (c=1: 1/1/1, c=16:
    6/5/5). Each prompt's counts are averaged over its requests, then pooled over
    prompts: the same texts give the same figure at every level unless the load
    changed what the engine accepted. Position i (1-based) is tested when every
    draft before it was kept. Returns kept/tested per position, while tested > 0.
    """
    k = max((s.num_drafted for r in results for s in r.steps), default=0)
    by_prompt: dict[str, list[RequestResult]] = {}
    for r in results:
        by_prompt.setdefault(r.prompt, []).append(r)
    kept, tested = [0.0] * k, [0.0] * k
    for reqs in by_prompt.values():
        steps = [s for r in reqs for s in r.steps]
        acc, reached = position_counts([s.accepted for s in steps], [s.num_drafted for s in steps], k)
        for i in range(k):  # this prompt's counts per request
            kept[i] += acc[i] / len(reqs)
            tested[i] += reached[i] / len(reqs)
    out = []
    for a, t in zip(kept, tested):
        if not t:
            break
        out.append(a / t)
    return out


@dataclass
class Run:
    """One closed-loop run of a policy at a level: what the sweep keeps of it."""

    measured: dict[str, Any]  # bench.measure_results' figures (tokens/s, per-request tokens/s)
    steps: list[EngineStep]  # the tap's server-wide steps during the run
    results: list[RequestResult]  # the requests, for acceptance per text


async def run_policy(engine: LiveEngine, prompts: list[str], concurrency: int, max_tokens: int) -> Run:
    """bench.measure_results' run plus the tap's server-wide steps meanwhile."""
    watch = engine.client.tap.watch()
    try:
        m, results = await measure_results(engine, prompts, concurrency, max_tokens)
        await asyncio.sleep(0.05)  # the tap's last messages
        steps = []
        while not watch.empty():
            steps.append(watch.get_nowait())
    finally:
        engine.client.tap.unwatch(watch)
    return Run(m | {"measured_s": m["wall_s"]}, steps, results)


async def run_policy_window(engine: LiveEngine, prompts: list[str], concurrency: int, max_tokens: int,
                            window_s: float, timeout_s: float = 600.0) -> Run:
    """A steady closed loop: C requests always in flight (cycling through the prompts),
    measured over ``window_s`` seconds that start when the first request completes.

    The first wave reaches the engine staggered (the first request is prefilled
    alone, the others a step or two later) and finishes together, so a one-wave
    run measures a cold start as much as the level. By the first completion the
    ramp is over; the window then sees the level as a person's slider load does.
    Tokens/s is the engine's own count: tokens emitted in the tap's steps that
    overlapped the window, prorated at its edges, over its length
    (``window_rate``). The requests still running when it closes are
    cancelled (vLLM aborts them), and the run ends when vLLM reports the
    engine idle, so none of them run into the next measurement.
    """
    results: list[RequestResult] = []
    watch = engine.client.tap.watch()
    load = BackgroundLoad(engine.client, prompts, max_tokens=max_tokens, max_concurrency=concurrency,
                          max_seconds=timeout_s + window_s, on_result=results.append)
    try:
        load.set_concurrency(concurrency)
        deadline = time.monotonic() + timeout_s
        while load.completed == 0:  # ramp-up: until the first request completes
            if load.failed or time.monotonic() > deadline:
                raise RuntimeError(f"the closed loop did not complete a request: {load.last_error or 'timed out'}")
            await asyncio.sleep(0.05)
        w0 = time.monotonic()
        await asyncio.sleep(window_s)
        w1 = time.monotonic()
        await load.stop()
        if load.failed:
            raise RuntimeError(f"{load.failed} request(s) failed in the window: {load.last_error}")
        await _until_idle(engine, timeout_s)
        await asyncio.sleep(0.05)  # the tap's last messages
        steps = []
        while not watch.empty():
            steps.append(watch.get_nowait())
    finally:
        await load.stop()
        engine.client.tap.unwatch(watch)
    inside = [s for s in steps if w0 < s.t <= w1]  # step end times, the same monotonic clock
    done = [r for r in results if w0 < r.t_end <= w1] or results
    measured = {
        "tokens_per_s": round(window_rate(steps, w0, w1), 3),
        "per_request_tokens_per_s": round(statistics.mean(r.tokens_per_second for r in done), 3),
        "measured_s": round(w1 - w0, 3),
    }
    return Run(measured, inside, results)


def window_rate(steps: list[EngineStep], w0: float, w1: float) -> float:
    """Tokens/s emitted in the window (w0, w1]: each step's tokens, prorated by the
    share of its interval (``interval_s``, idle time before it included) that
    lies inside the window, over the window's length.

    Counting the steps that ended inside whole, as before, moves the figure by
    a whole step at each edge: at c=16 here a step emits 16 tokens in about
    0.6 s, 3 % of a 20 s window, as much as the targets allow. Dividing those
    steps' tokens by the time they span instead would drop a long step in
    progress at the window's end (a burst of prefills at c=16 with K=5 takes
    seconds): measured, it doubled K=5's rate.
    """
    total = 0.0
    for s in steps:
        start = s.t - s.interval_s
        overlap = min(s.t, w1) - max(start, w0)
        if overlap > 0:
            total += s.num_emitted * (overlap / s.interval_s if s.interval_s > 0 else 1.0)
    return total / (w1 - w0) if w1 > w0 else 0.0


async def _until_idle(engine: LiveEngine, timeout_s: float) -> None:
    """Wait until vLLM reports no running or waiting request (its /metrics gauges)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10.0) as http:
        while True:
            snap = await fetch_snapshot(http, engine.client.base_url)
            if snap.running + snap.waiting == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the engine still runs {snap.running:.0f} request(s) {timeout_s:.0f} s "
                                   "after the closed loop stopped")
            await asyncio.sleep(0.2)


def row_from_runs(runs: list[Run]) -> dict[str, Any]:
    """A CSV row's figures from a policy's runs at one level: the median run's tokens/s
    (single runs on a small machine vary by several per cent), step counts pooled."""
    steps = [s for r in runs for s in r.steps]
    here = PositionCounts(max((len(s.reached_per_pos) for s in steps), default=0))
    here.add(steps)
    drafted = sum(s.num_drafted for s in steps)
    accepted = sum(s.num_accepted for s in steps)
    drafting = sum(s.num_drafting for s in steps)
    request_steps = sum(s.batch_size for s in steps)
    tps = [r.measured["tokens_per_s"] for r in runs]
    return {
        "total_tokens_per_s": round(statistics.median(tps), 3),
        "per_request_tokens_per_s": round(statistics.median(r.measured["per_request_tokens_per_s"] for r in runs), 3),
        "mean_accepted_per_step": round(accepted / request_steps, 4) if request_steps else 0.0,
        "effective_k": round(drafted / drafting, 4) if drafting else 0.0,
        "draft_acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        # raw measured acceptance per draft position (kept / tested), no prior
        "acceptance_per_position": " ".join(f"{a / r:.4f}" for a, r in zip(here.accepted, here.reached) if r),
        # the same, each distinct prompt weighted once: comparable across levels
        "acceptance_per_position_per_text": " ".join(
            f"{a:.4f}" for a in acceptance_per_text([x for r in runs for x in r.results])),
        "runs": len(runs),
        "total_tokens_per_s_min": round(min(tps), 3),
        "total_tokens_per_s_max": round(max(tps), 3),
        "measured_s": round(statistics.median(r.measured["measured_s"] for r in runs), 3),
        # where a level's time goes, pooled over the steps: the engine's step (wall_s)
        # and the tap's own share of it (records, policy and auction included)
        "mean_batch_size": round(request_steps / len(steps), 3) if steps else 0.0,
        "mean_step_s": round(statistics.mean(s.wall_s for s in steps), 5) if steps else 0.0,
        "mean_tap_s": round(statistics.mean(s.tap_s for s in steps), 6) if steps else 0.0,
    }


def read_categories(path: Path) -> dict[str, list[str]]:
    prompts = read_prompts(path)  # validates every line
    cats: dict[str, list[str]] = {}
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for obj, prompt in zip(lines, prompts):
        cats.setdefault(str(obj.get("category", "all")), []).append(prompt)
    return cats


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def sweep(args: argparse.Namespace) -> pd.DataFrame:
    table = validate_k_table(args.table) if args.table else None
    policies = [parse_policy(p, table) for p in args.policies]
    by_cat = read_categories(args.prompts) if args.by_category else {"all": read_prompts(args.prompts)}
    all_prompts = [p for ps in by_cat.values() for p in ps]
    max_seqs = max(max(args.concurrency), 16)
    base = dict(target=args.target, draft=args.draft, max_model_len=2048, max_num_seqs=max_seqs,
                kv_cache_gib=args.kv_cache_gib)
    engines: dict[str, LiveEngine] = {}
    steps_out = args.steps_out.open("w", encoding="utf-8") if args.steps_out else None
    try:
        if any(p.spec is None for p in policies):
            _say("== starting the speculation-off engine")
            engines["off"] = await LiveEngine.launch(EngineConfig(method="off", **base))
        live_pols = [p for p in policies if p.spec is not None]
        ctl = counts = None
        if live_pols:
            k_max = k_needed(live_pols, args.k_max)
            cfg = EngineConfig(method=args.method, k=min(3, k_max), k_max=k_max,
                               idle_drafter=not args.standing_drafter, **base)
            _say(f"== starting the {args.method} engine for live policies (num_speculative_tokens={k_max})")
            engines["live"] = live = await LiveEngine.launch(cfg)
            ctl = PolicyController(live.client, k_max, max_seqs)
            counts = PositionCounts(k_max)
            if any(p.spec.kind in ("auto", "auction") for p in live_pols):
                path = config_cache_path(cfg)
                ctl.cost = None if args.reprofile else load_cached(path, cfg.method == "draft")
                if ctl.cost is None:
                    _say("== profiling the cost model")
                    ctl.cost = await profile_engine(live.client, all_prompts, k_max, cfg.method == "draft",
                                                    progress=lambda f, m: _say(f"   {m} ({f:.0%})"))
                    save_cached(path, ctl.cost)
                _say(f"   cost model: knee {ctl.cost.knee_tokens:.0f} tokens, base {ctl.cost.base_s * 1e3:.1f} ms, "
                     f"+{ctl.cost.slope_s * 1e3:.2f} ms/token")
                # acceptance for "auto" before anything else ran: one short pass at K = k_max
                await ctl.apply(PolicySpec("fixed", k_max))
                counts.add((await run_policy(live, all_prompts[:4], 4, args.max_tokens)).steps)
        for e in engines.values():
            await measure(e, all_prompts[:1], 1, 8)  # warm-up, not reported
        rows = []
        for c in args.concurrency:
            for cat, prompts in by_cat.items():
                # --window-s 0: one wave of C (more would leave a tail at a lower batch size);
                # with few requests the prompt mix differs by level, which moves pooled acceptance
                n = max(c, args.min_requests)
                batch = [prompts[i % len(prompts)] for i in range(n)]
                runs: dict[str, list[Run]] = {p.name: [] for p in policies}
                for rnd in range(args.repeats):
                    # each round starts one policy later, so none always runs first
                    for pol in policies[rnd % len(policies):] + policies[:rnd % len(policies)]:
                        if pol.spec is None:
                            engine = engines["off"]
                        else:
                            engine = engines["live"]
                            await ctl.apply(pol.spec, counts.alphas())
                        run = (await run_policy_window(engine, prompts, c, args.max_tokens, args.window_s)
                               if args.window_s else await run_policy(engine, batch, c, args.max_tokens))
                        if pol.spec is not None:
                            counts.add(run.steps)
                        runs[pol.name].append(run)
                        if steps_out is not None:
                            t0 = run.steps[0].t if run.steps else 0.0
                            for s in run.steps:
                                steps_out.write(json.dumps({"policy": pol.name, "concurrency": c, "category": cat,
                                                            "run": rnd + 1, **engine_step_line(s, t0)}) + "\n")
                        _say(f"   c={c} {cat} {pol.name} run {rnd + 1}/{args.repeats}: "
                             f"{run.measured['tokens_per_s']:.2f} tok/s")
                for pol in policies:
                    row = {"policy": pol.name, "concurrency": c, **row_from_runs(runs[pol.name])}
                    if args.by_category:
                        row["category"] = cat
                    _say(f"   c={c} {cat} {pol.name}: median {row['total_tokens_per_s']:.2f} tok/s, "
                         f"effective K {row['effective_k']}")
                    rows.append(row)
    finally:
        for e in engines.values():
            await e.close()
        if steps_out is not None:
            steps_out.close()
    cols = COLUMNS + (["category"] if args.by_category else []) + EXTRA_COLUMNS
    order = {p.name: i for i, p in enumerate(policies)}
    df = pd.DataFrame(rows, columns=cols)
    keys = ["category"] if args.by_category else []
    df["_p"] = df["policy"].map(order)
    return df.sort_values(keys + ["_p", "concurrency"], kind="stable").drop(columns="_p").reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine_adapter.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--policies", default="off,k1,k3,k5,auto,auction")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--method", choices=["ngram", "draft", "suffix"], default="draft")
    p.add_argument("--table", default=None, help="K table for the 'table' policy (JSON)")
    p.add_argument("--k-max", type=int, default=5, help="K range for auto and auction (default 5)")
    p.add_argument("--by-category", action="store_true", help="measure each prompt category on its own")
    p.add_argument("--reprofile", action="store_true", help="profile the cost model even if cached")
    p.add_argument("--standing-drafter", action="store_true",
                   help="vLLM's own behaviour: the draft model runs its pass even at K=0 (default: it idles)")
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per policy and level, interleaved; the CSV gives the median run's tokens/s")
    p.add_argument("--window-s", type=float, default=20.0,
                   help="seconds of a steady closed loop measured per run, from its first completion "
                        "(default 20); 0 = one wave of max(C, --min-requests) requests, ramp-up and all")
    p.add_argument("--steps-out", type=Path, default=None,
                   help="write every measured step of every run here (JSONL), to see where time went")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--kv-cache-gib", type=int, default=2)
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.policies = args.policies.split(",")
    if args.repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return 2
    if args.window_s < 0:
        print("error: --window-s must be 0 (one wave) or a number of seconds", file=sys.stderr)
        return 2
    try:
        df = asyncio.run(sweep(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(df.to_string(index=False))
    print(json.dumps({"rows": df.astype(object).where(df.notna(), None).to_dict(orient="records")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
