"""Throughput of speculation methods against concurrency, and the tap's own overhead.

Contract: ``measure(engine, prompts, concurrency, max_tokens)`` runs a closed loop and
returns total and per-request tokens/s with vLLM's pooled acceptance figures;
``bench(BenchSettings)`` does it per method and concurrency (ratio to ``off`` at the same
C); ``tap_overhead`` alternates identical runs with and without the scheduler tap
(A B A B ...) and reports medians and the tap's time over the step's wall time.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine.models import resolve_model
from engine_adapter.engine.platform import machine_facts
from engine_adapter.engine.resources import loaded_bytes, stored_dtype
from engine_adapter.engine.roofline import (
    bytes_read_per_step,
    read_bandwidth_gbs,
    roofline_tokens_per_s,
    weight_bytes,
    worker_cores,
)
from engine_adapter.engine_config import EngineConfig, resolve_dtype
from engine_adapter.prompts import load_presets
from engine_adapter.records import RequestResult
from engine_adapter.service.load import run_prompts


@dataclass
class BenchSettings:
    """What the command line sets (its flags, parsed)."""

    methods: list[str]
    concurrency: list[int]
    k: int
    max_tokens: int
    min_requests: int
    categories: list[str] | None
    target: str
    draft: str
    kv_cache_gib: int
    tap_overhead: bool
    rounds: int
    reserved_cpus: list[int | None] = field(default_factory=lambda: [None])  # None: vLLM's default (1)
    eager: list[bool] = field(default_factory=lambda: [True])  # False: vLLM compiles the model


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


def _config(
    settings: BenchSettings, method: str, tap: bool = True, reserved: int | None = None, eager: bool | None = None
) -> EngineConfig:
    """``eager``: True eager, False compiled, None the platform's default (eager on CPU, CUDA graphs on a GPU)."""
    return EngineConfig(
        reserved_cpus=reserved,
        enforce_eager=eager,
        method=method,
        k=settings.k,
        target=settings.target,
        draft=settings.draft,
        kv_cache_gib=settings.kv_cache_gib,
        max_model_len=2048,
        max_num_seqs=max(settings.concurrency),
        tap=tap,
    )


def _progress(p) -> None:
    print(f"  [{p.fraction:4.0%}] {p.message}", file=sys.stderr)


def machine_roofline(settings: BenchSettings) -> dict[str, Any]:
    """The machine (``platform.machine_facts``: CPU, cores, kind, dtype), the read bandwidth on each
    worker-core count the run uses, and the target's bytes per step."""
    cores = sorted({worker_cores(r) for r in settings.reserved_cpus} | {os.cpu_count() or 1})
    print(f"== measuring read bandwidth on {cores} core(s)", file=sys.stderr)
    target_dir = resolve_model(settings.target)
    dtype = resolve_dtype("auto")  # the engines' dtype (EngineConfig's default)
    return machine_facts(dtype) | {
        "cpus": os.cpu_count(),
        "bandwidth_gbs": {str(n): round(read_bandwidth_gbs(n), 2) for n in cores},
        "target_weight_bytes": loaded_bytes(weight_bytes(target_dir), stored_dtype(target_dir), dtype),
        "target_bytes_per_step": bytes_read_per_step(target_dir, dtype),
    }


def add_roofline(row: dict[str, Any], machine: dict[str, Any]) -> None:
    """Plain decoding's bound for the row's worker cores and concurrency, and the row's fraction of it."""
    if row["method"] != "off":
        return
    bw = machine["bandwidth_gbs"][str(row["worker_cores"])]
    bound = roofline_tokens_per_s(bw, machine["target_bytes_per_step"], row["concurrency"])
    row["roofline_tokens_per_s"] = round(bound, 3)
    row["roofline_fraction"] = round(row["tokens_per_s"] / bound, 3) if bound else None


async def bench(settings: BenchSettings) -> dict[str, Any]:
    """Every (method, reserved cores, eager/compiled) engine in turn, each over the concurrencies;
    ``ratio_to_off`` compares rows of the same engine settings."""
    machine = machine_roofline(settings)
    presets = mixed_prompts(settings.categories)
    rows: list[dict[str, Any]] = []
    for reserved in settings.reserved_cpus:
        for eager in settings.eager:
            for method in settings.methods:
                rows += await _bench_engine(settings, method, reserved, eager, presets)
    for r in rows:
        add_roofline(r, machine)
        off = next(
            (
                o["tokens_per_s"]
                for o in rows
                if o["method"] == "off" and all(o[f] == r[f] for f in ("concurrency", "reserved_cpus", "eager"))
            ),
            None,
        )
        r["ratio_to_off"] = round(r["tokens_per_s"] / off, 3) if off else None
    return {"machine": machine, "rows": rows}


async def _bench_engine(
    settings: BenchSettings, method: str, reserved: int | None, eager: bool, presets: list[str]
) -> list[dict[str, Any]]:
    label = (
        f"{method}, reserved cores {'default' if reserved is None else reserved}, {'eager' if eager else 'compiled'}"
    )
    print(f"== {label}: starting engine", file=sys.stderr)
    t0 = time.monotonic()
    engine = await LiveEngine.launch(_config(settings, method, reserved=reserved, eager=eager), progress=_progress)
    start_s = time.monotonic() - t0
    rows = []
    try:
        await measure(engine, presets[:1], 1, 8)  # warm-up, not reported
        for c in settings.concurrency:
            m = await measure(engine, prompts_for(presets, max(c, settings.min_requests)), c, settings.max_tokens)
            print(f"   c={c}: {m['tokens_per_s']:.1f} tok/s", file=sys.stderr)
            rows.append(
                {
                    "method": method,
                    "reserved_cpus": reserved,
                    "worker_cores": worker_cores(reserved),
                    "eager": eager,
                    "start_s": round(start_s, 1),
                    **m,
                }
            )
    finally:
        await engine.close()
    return rows


async def tap_overhead(settings: BenchSettings) -> dict[str, Any]:
    presets = mixed_prompts(settings.categories)
    engines = {}
    for tap in (True, False):
        print(f"== draft engine, tap={'on' if tap else 'off'}", file=sys.stderr)
        engines[tap] = await LiveEngine.launch(_config(settings, "draft", tap=tap), progress=_progress)
    watch = engines[True].client.tap.watch()
    out: dict[str, Any] = {"rounds": settings.rounds, "runs": {}}
    try:
        for c in settings.concurrency:
            prompts = prompts_for(presets, max(c, settings.min_requests))
            speeds: dict[str, list[float]] = {"on": [], "off": []}
            ratios: list[float] = []
            for _ in range(settings.rounds):
                for tap in (True, False):  # interleaved: A B A B
                    while not watch.empty():
                        watch.get_nowait()
                    m = await measure(engines[tap], prompts, c, settings.max_tokens)
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
                "all_on": speeds["on"],
                "all_off": speeds["off"],
                "tap_time_over_step_time_median": round(statistics.median(ratios), 6) if ratios else None,
                "tap_time_over_step_time_p99": round(sorted(ratios)[int(0.99 * (len(ratios) - 1))], 6)
                if ratios
                else None,
                "tap_time_over_step_time_max": round(max(ratios), 6) if ratios else None,
                "steps_measured": len(ratios),
            }
    finally:
        for e in engines.values():
            await e.close()
    return out
