"""One policy at one concurrency level, measured: the runs a sweep is made of.

Contract: ``parse_policy`` names a policy (``off``, ``kN``, ``table``, ``auto``, ``auction``,
``equal``);
``run_policy`` measures one wave of requests and ``run_policy_window`` a steady closed loop
over a window from its first completion (``window_rate`` prorates the edge steps);
``row_from_runs`` makes one CSV row (``COLUMNS`` + ``EXTRA_COLUMNS``) from repeated runs,
the median run's tokens/s with pooled step counts; ``speedup_columns(results, off_rates)`` who
got the discount: each request's tokens/s over the speculation-off engine's on the same prompt at
the same level (measured, not estimated), their spread and Jain's fairness index. Units:
seconds, tokens per second.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

from engine_adapter.acceptance import PositionCounts, position_counts
from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine.prometheus import fetch_snapshot
from engine_adapter.engine_config import KTable
from engine_adapter.ledger import jain_index
from engine_adapter.measure.throughput import measure_results
from engine_adapter.policy.controller import COST_POLICIES, PolicySpec
from engine_adapter.records import SWEEP_COLUMNS, EngineStep, RequestResult
from engine_adapter.service.load import BackgroundLoad

COLUMNS = list(SWEEP_COLUMNS)
# each request's tokens/s over the off engine's on its prompt at the level (needs ``off`` in the sweep)
SPEEDUP_COLUMNS = [
    "speedup_min",
    "speedup_p10",
    "speedup_median",
    "speedup_max",
    "below_plain_share",
    "speedup_jain_index",
]


EXTRA_COLUMNS = [
    "acceptance_per_position",
    "acceptance_per_position_per_text",
    "runs",
    "total_tokens_per_s_min",
    "total_tokens_per_s_max",
    "measured_s",
    "mean_batch_size",
    "mean_step_s",
    "mean_tap_s",
    *SPEEDUP_COLUMNS,
]


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
    if name in COST_POLICIES:
        return Policy(name, PolicySpec(name))
    raise ValueError(f"unknown policy {name!r}: use off, kN (e.g. k3), table, auto, auction, equal")


def k_needed(policies: list[Policy], k_max: int) -> int:
    """num_speculative_tokens for the live engine: the largest K any policy asks for."""
    ks = [
        k_max
        if p.spec.kind in COST_POLICIES
        else p.spec.k
        if p.spec.kind == "fixed"
        else max(r[2] for r in p.spec.table)
        for p in policies
        if p.spec is not None
    ]
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


async def run_policy_window(
    engine: LiveEngine, prompts: list[str], concurrency: int, max_tokens: int, window_s: float, timeout_s: float = 600.0
) -> Run:
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
    load = BackgroundLoad(
        engine.client,
        prompts,
        max_tokens=max_tokens,
        max_concurrency=concurrency,
        max_seconds=timeout_s + window_s,
        on_result=results.append,
    )
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
                raise RuntimeError(
                    f"the engine still runs {snap.running:.0f} request(s) {timeout_s:.0f} s "
                    "after the closed loop stopped"
                )
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
            f"{a:.4f}" for a in acceptance_per_text([x for r in runs for x in r.results])
        ),
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


def off_rates(results: list[RequestResult]) -> dict[str, float]:
    """Per prompt: the median tokens/s the speculation-off engine gave its requests."""
    by_prompt: dict[str, list[float]] = {}
    for r in results:
        by_prompt.setdefault(r.prompt, []).append(r.tokens_per_second)
    return {p: statistics.median(v) for p, v in by_prompt.items()}


def speedup_columns(results: list[RequestResult], off: dict[str, float]) -> dict[str, Any]:
    """The spread of per-request speedups over plain decoding at the same level: each request's
    tokens/s over the off engine's on the same prompt; empty where off was not measured."""
    ratios = sorted(r.tokens_per_second / off[r.prompt] for r in results if off.get(r.prompt))
    if not ratios:
        return {}
    p10 = ratios[min(len(ratios) - 1, int(0.1 * len(ratios)))]
    return {
        "speedup_min": round(ratios[0], 4),
        "speedup_p10": round(p10, 4),
        "speedup_median": round(statistics.median(ratios), 4),
        "speedup_max": round(ratios[-1], 4),
        "below_plain_share": round(sum(1 for x in ratios if x < 1.0) / len(ratios), 4),
        "speedup_jain_index": round(jain_index(ratios) or 0.0, 4),
    }
