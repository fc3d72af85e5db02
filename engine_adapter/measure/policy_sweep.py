"""A whole sweep: K policies against concurrency on live engines, in one run.

Contract: ``sweep(SweepSettings)`` starts the engines it needs (a speculation-off one for
``off``, one live-policy engine for every other policy, switched through the control
channel; both at once, their vLLM start-ups overlapping, ``live_engine.launch_overlapping``;
nothing is measured until both serve), profiles or reads the cost model (which then learns from
every live run's steps with ``CostLearner``, as the app's does; the cache keeps the profile as measured),
interleaves the policies within each level
(where the two engines do not fit in memory together, ``fits_together``: ``off`` first on its
engine alone, then the live policies on theirs, said on stderr) and returns the table
``python -m engine_adapter.sweep`` writes (one row per policy, concurrency[, category]):
``sweep_levels`` (the runs, by level) then ``sweep_frame`` (their table). ``reference_texts(runs)``
is each prompt's lossless text at a level. Progress goes to stderr.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from engine_adapter.acceptance import PositionCounts
from engine_adapter.acceptance_rule import LOSSLESS, AcceptanceRule
from engine_adapter.engine.live_engine import LiveEngine, launch_overlapping
from engine_adapter.engine.resources import fits_together
from engine_adapter.engine_config import EngineConfig, validate_k_table
from engine_adapter.measure.lossy_quality import LOSSY_COLUMNS, quality_columns
from engine_adapter.measure.sweep_runs import (
    COLUMNS,
    EXTRA_COLUMNS,
    Policy,
    Run,
    k_needed,
    off_rates,
    parse_policy,
    row_from_runs,
    run_policy,
    run_policy_window,
    speedup_columns,
)
from engine_adapter.measure.throughput import measure
from engine_adapter.policy.controller import COST_POLICIES, PolicyController, PolicySpec
from engine_adapter.policy.cost_learning import CostLearner
from engine_adapter.policy.profile_grid import config_profile_grid
from engine_adapter.policy.profiler import config_cache_path, load_cached, profile_engine, save_cached
from engine_adapter.prompts import read_prompts
from engine_adapter.records import EngineStep
from engine_adapter.trace.format import engine_step_line


@dataclass
class SweepSettings:
    """What the command line sets (its flags, parsed)."""

    concurrency: list[int]
    policies: list[str]
    prompts: Path
    max_tokens: int
    out: Path
    method: str
    table: str | None
    k_max: int
    by_category: bool
    reprofile: bool
    standing_drafter: bool
    min_requests: int
    repeats: int
    window_s: float
    steps_out: Path | None
    target: str
    draft: str
    kv_cache_gib: int
    reserved_cpus: int | None = None  # cores vLLM keeps free of its worker (None: vLLM's default, 1)
    dtype: str = "auto"  # the engines' (``engine_config.resolve_dtype``: auto follows the CPU kind)
    # acceptance rules, each run for every live policy (``off`` runs once, lossless); a lossy one
    # adds the LOSSY_COLUMNS, its texts compared with the lossless texts of the same prompts
    acceptance: list[AcceptanceRule] = field(default_factory=lambda: [LOSSLESS])


def read_categories(path: Path) -> dict[str, list[str]]:
    prompts = read_prompts(path)  # validates every line
    cats: dict[str, list[str]] = {}
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for obj, prompt in zip(lines, prompts):
        cats.setdefault(str(obj.get("category", "all")), []).append(prompt)
    return cats


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class _LivePolicies:
    """The live-policy engine of a sweep, its controller, and the acceptance measured so far."""

    engine: LiveEngine
    controller: PolicyController
    counts: PositionCounts
    rule: AcceptanceRule = LOSSLESS
    learner: CostLearner | None = None  # where a cost model is in force: it learns from the runs' steps

    async def set_rule(self, rule: AcceptanceRule) -> None:
        if rule != self.rule:
            await self.engine.client.set_acceptance(rule)
            self.rule = rule

    def learn(self, steps: list[EngineStep]) -> None:
        """The run's acceptance, and its steps into the cost model (a new fit where a cell grew)."""
        self.counts.add(steps)  # lossless verdicts only, whatever the rule (EngineStep)
        if self.learner is not None and (learned := self.learner.learn(steps)) is not None:
            self.controller.cost = learned
            n, cells = self.learner.learned_steps, self.learner.learned_cells
            _say(f"   cost model learned from {n} engine steps in {cells} cells")


def _live_config(settings: SweepSettings, base: dict[str, Any], live_pols: list[Policy]) -> EngineConfig:
    """The live-policy engine's config: num_speculative_tokens = the largest K asked."""
    k_max = k_needed(live_pols, settings.k_max)
    return EngineConfig(
        method=settings.method, k=min(3, k_max), k_max=k_max, idle_drafter=not settings.standing_drafter, **base
    )


async def _prepare_live(
    settings: SweepSettings, cfg: EngineConfig, engine: LiveEngine, live_pols: list[Policy], prompts: list[str]
) -> _LivePolicies:
    """The live policies on ``engine`` (started from ``cfg``: num_speculative_tokens = the largest K
    asked), with the cost model read from the cache or profiled, and acceptance for ``auto`` from one
    short pass at k_max."""
    k_max = cfg.k_max
    live = _LivePolicies(engine, PolicyController(engine.client, k_max, cfg.max_num_seqs), PositionCounts(k_max))
    if not any(p.spec.kind in COST_POLICIES for p in live_pols):
        return live
    ctl = live.controller
    path = config_cache_path(cfg, engine.process.platform)
    ctl.cost = None if settings.reprofile else load_cached(path, cfg.method == "draft")
    profiled = ctl.cost is None
    if profiled:
        _say("== profiling the cost model")
        ctl.cost = await profile_engine(
            engine.client,
            prompts,
            k_max,
            cfg.method == "draft",
            grid=config_profile_grid(cfg, engine.process.platform),
            progress=lambda p: _say(f"   {p.message} ({p.fraction:.0%})"),
        )
        save_cached(path, ctl.cost)  # kept even if the pass below fails
    _say(
        f"   cost model: knee {ctl.cost.knee_tokens:.0f} tokens, base {ctl.cost.base_s * 1e3:.1f} ms, "
        f"+{ctl.cost.slope_s * 1e3:.2f} ms/token"
    )
    profile = ctl.cost
    live.learner = CostLearner(profile, cfg.method == "draft", learns_profiling=False)
    # acceptance for "auto" before anything else ran: one short pass at K = k_max
    await ctl.apply(PolicySpec("fixed", k_max))
    live.learn((await run_policy(engine, prompts[:4], 4, settings.max_tokens)).steps)
    if profiled:  # again, with the acceptance that pass measured: an app with these settings starts from it
        save_cached(path, profile, live.counts)  # the profile's cells as measured, not the learned fit
    return live


def _write_steps(out: TextIO, run: Run, labels: dict[str, Any]) -> None:
    """Every measured step of one run as a JSONL line (``--steps-out``), ``t`` from the run's first step."""
    t0 = run.steps[0].t if run.steps else 0.0
    for s in run.steps:
        out.write(json.dumps({**labels, **engine_step_line(s, t0)}) + "\n")


async def _measure_level(
    settings: SweepSettings,
    policies: list[Policy],
    engines: dict[str, LiveEngine],
    live: _LivePolicies | None,
    c: int,
    cat: str,
    prompts: list[str],
    steps_out: TextIO | None,
) -> dict[str, list[Run]]:
    """Every (policy, acceptance rule)'s runs at concurrency ``c`` on one prompt category, interleaved
    in rounds; keyed by (policy name, rule name)."""
    # --window-s 0: one wave of C (more would leave a tail at a lower batch size);
    # with few requests the prompt mix differs by level, which moves pooled acceptance
    batch = [prompts[i % len(prompts)] for i in range(max(c, settings.min_requests))]
    variants = [(p, r) for p in policies for r in settings.acceptance if p.spec is not None or not r.lossy]
    runs: dict[tuple[str, str], list[Run]] = {(p.name, r.name): [] for p, r in variants}
    for rnd in range(settings.repeats):
        # each round starts one variant later, so none always runs first
        for pol, rule in variants[rnd % len(variants) :] + variants[: rnd % len(variants)]:
            if pol.spec is None:
                engine = engines["off"]
            else:
                engine = live.engine
                await live.controller.apply(pol.spec, live.counts.alphas())
                await live.set_rule(rule)
            if settings.window_s:
                run = await run_policy_window(engine, prompts, c, settings.max_tokens, settings.window_s)
            else:
                run = await run_policy(engine, batch, c, settings.max_tokens)
            if pol.spec is not None:
                live.learn(run.steps)
            if wrong := {s.rule for s in run.steps if s.num_drafted} - {rule.name}:
                _say(f"   warning: steps verified under {sorted(wrong)} in a {rule.name} run")
            runs[(pol.name, rule.name)].append(run)
            if steps_out is not None:
                labels = {"policy": pol.name, "acceptance": rule.name, "concurrency": c, "category": cat}
                _write_steps(steps_out, run, {**labels, "run": rnd + 1})
            rate = run.measured["tokens_per_s"]
            _say(f"   c={c} {cat} {pol.name} {rule.name} run {rnd + 1}/{settings.repeats}: {rate:.2f} tok/s")
    return runs


def _frame(rows: list[dict[str, Any]], policies: list[Policy], by_category: bool, lossy: bool) -> pd.DataFrame:
    """The CSV's table: policies in the order asked, then by concurrency (per category)."""
    cols = COLUMNS + (["category"] if by_category else []) + EXTRA_COLUMNS + (LOSSY_COLUMNS if lossy else [])
    order = {p.name: i for i, p in enumerate(policies)}
    df = pd.DataFrame(rows, columns=cols)
    keys = ["category"] if by_category else []
    df["_p"] = df["policy"].map(order)
    return df.sort_values(keys + ["_p", "concurrency"], kind="stable").drop(columns="_p").reset_index(drop=True)


def reference_texts(runs: dict[tuple[str, str], list[Run]]) -> dict[str, tuple[list[int], str]]:
    """Each prompt's lossless text at the level: the speculation-off engine's (the target's own
    text) when the sweep runs ``off``, else the first lossless run's (greedy: lossless runs write
    the same text, but for ties the batch shapes of a verify step can break otherwise)."""
    ref: dict[str, tuple[list[int], str]] = {}
    lossless = sorted((key for key in runs if key[1] == LOSSLESS.name), key=lambda key: key[0] != "off")
    for key in lossless:
        for r in (x for run in runs[key] for x in run.results):
            ref.setdefault(r.prompt, (r.token_ids, r.text))
    return ref


def _engine_base(settings: SweepSettings) -> dict[str, Any]:
    return dict(
        target=settings.target,
        draft=settings.draft,
        max_model_len=2048,
        max_num_seqs=max(max(settings.concurrency), 16),
        kv_cache_gib=settings.kv_cache_gib,
        reserved_cpus=settings.reserved_cpus,
        dtype=settings.dtype,
    )


def _phases(settings: SweepSettings, policies: list[Policy], base: dict[str, Any]) -> list[list[Policy]]:
    """The policies in one phase (both engines at once: the rounds interleave ``off`` with the live
    policies, so a drift of the machine cancels), or two, one engine each, when the two engines
    do not fit in memory together (said on stderr)."""
    off = [p for p in policies if p.spec is None]
    live = [p for p in policies if p.spec is not None]
    if not off or not live:
        return [policies]
    why = fits_together([EngineConfig(method="off", **base), _live_config(settings, base, live)])
    if why is None:
        return [policies]
    _say(
        f"== {why}: the speculation-off engine runs first, alone, then the {settings.method} engine "
        "(one after the other: a drift of the machine between the two is not cancelled)"
    )
    return [off, live]


async def _run_phase(
    settings: SweepSettings, phase: list[Policy], base: dict[str, Any], by_cat: dict[str, list[str]], steps_out
) -> dict[tuple[int, str], dict[tuple[str, str], list[Run]]]:
    """Start the engines ``phase`` needs, measure every level with them, close them."""
    engines: dict[str, LiveEngine] = {}
    live: _LivePolicies | None = None
    measured: dict[tuple[int, str], dict[tuple[str, str], list[Run]]] = {}
    try:
        live_pols = [p for p in phase if p.spec is not None]
        configs = {"off": EngineConfig(method="off", **base)} if any(p.spec is None for p in phase) else {}
        if live_pols:
            configs["live"] = _live_config(settings, base, live_pols)
        said = {"off": "== starting the speculation-off engine"}
        if live_pols:
            k_max, together = configs["live"].k_max, "off" in configs
            said["live"] = (
                f"== starting the {settings.method} engine for live policies (num_speculative_tokens={k_max})"
            )
            said["live"] += " at once: the two vLLM start-ups overlap" if together else ""
        await launch_overlapping(configs, engines, lambda name: _say(said[name]))
        if live_pols:
            all_prompts = [p for ps in by_cat.values() for p in ps]
            live = await _prepare_live(settings, configs["live"], engines["live"], live_pols, all_prompts)
        for e in engines.values():
            await measure(e, next(iter(by_cat.values()))[:1], 1, 8)  # warm-up, not reported
        for c in settings.concurrency:
            for cat, prompts in by_cat.items():
                measured[(c, cat)] = await _measure_level(settings, phase, engines, live, c, cat, prompts, steps_out)
    finally:
        for name, e in engines.items():
            label = "speculation-off" if name == "off" else settings.method
            if e.process is not None and (note := e.process.death_note()):
                _say(f"== the {label} engine died: {note}")
            await e.close()
            _say(f"== closed the {label} engine")
    return measured


def _level_rows(
    settings: SweepSettings, runs: dict[tuple[str, str], list[Run]], c: int, cat: str, lossy: bool
) -> list[dict[str, Any]]:
    """The CSV's rows of one level (concurrency ``c``, category ``cat``): one per (policy, rule)."""
    reference = reference_texts(runs)
    rules = {r.name: r for r in settings.acceptance}
    categories = {p: cat for cat, ps in read_categories(settings.prompts).items() for p in ps}
    off = off_rates([x for run in runs.get(("off", LOSSLESS.name), []) for x in run.results])
    rows = []
    for (name, rule), rs in runs.items():
        row = {"policy": name, "concurrency": c, **row_from_runs(rs)}
        row |= speedup_columns([x for run in rs for x in run.results], off)
        if settings.by_category:
            row["category"] = cat
        if lossy:
            quality = quality_columns([x for run in rs for x in run.results], reference, categories)
            row |= {"acceptance": rule, "acceptance_rule": rules[rule].describe(), **quality}
        median, k_eff = row["total_tokens_per_s"], row["effective_k"]
        _say(f"   c={c} {cat} {name} {rule}: median {median:.2f} tok/s, effective K {k_eff}")
        rows.append(row)
    return rows


Levels = dict[tuple[int, str], dict[tuple[str, str], list[Run]]]


async def sweep_levels(settings: SweepSettings) -> tuple[list[Policy], Levels]:
    """Every run of the sweep, by level (concurrency, category) and (policy, acceptance rule)."""
    table = validate_k_table(settings.table) if settings.table else None
    policies = [parse_policy(p, table) for p in settings.policies]
    if any(r.lossy for r in settings.acceptance) and LOSSLESS not in settings.acceptance:
        settings.acceptance = [LOSSLESS, *settings.acceptance]  # the texts a lossy rule is compared with
    by_cat = read_categories(settings.prompts) if settings.by_category else {"all": read_prompts(settings.prompts)}
    base = _engine_base(settings)
    levels: Levels = {}
    steps_out = settings.steps_out.open("w", encoding="utf-8") if settings.steps_out else None
    try:
        for phase in _phases(settings, policies, base):
            for level, runs in (await _run_phase(settings, phase, base, by_cat, steps_out)).items():
                levels.setdefault(level, {}).update(runs)
    finally:
        if steps_out is not None:
            steps_out.close()
    return policies, levels


def sweep_frame(settings: SweepSettings, policies: list[Policy], levels: Levels) -> pd.DataFrame:
    """The CSV's table of ``sweep_levels``' runs."""
    lossy = any(r.lossy for r in settings.acceptance)
    rows = [row for (c, cat), runs in levels.items() for row in _level_rows(settings, runs, c, cat, lossy)]
    return _frame(rows, policies, settings.by_category, lossy)


async def sweep(settings: SweepSettings) -> pd.DataFrame:
    policies, levels = await sweep_levels(settings)
    return sweep_frame(settings, policies, levels)
