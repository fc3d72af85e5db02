"""Where a cost model starts, without an engine: the cache, a prior scaled by cells an earlier launch
timed, a prior that cannot be scaled (synthetic cost models; a profile's own path runs in
tests/engine/test_cold_start.py and test_idle_fill.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from engine_adapter.acceptance import PositionCounts
from engine_adapter.policy.acceptance_memory import known
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.cost_prior import ShippedPrior, save_timing, scale_prior, timing_cache_path, timing_grid
from engine_adapter.policy.cost_start import CostStart, CostStarter
from engine_adapter.policy.profile_grid import default_grid
from engine_adapter.policy.profiler import ProfileProgress, save_cached

MACHINE = CostModel(base_s=0.2, slope_s=0.01, knee_tokens=4, draft_s=0.03, first_s=0.04)
PRIOR = fit_cost_model(
    [CostPoint(b, k, b * (k + 1), MACHINE.fit_step_s(b, k), 6) for b, k in default_grid(5).cells], True
)


class NoEngine:
    """A client a start must not use: the cache and kept timings need no engine."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the engine was used ({name})")


def starter(cache: Path, statuses: list) -> CostStarter:
    return CostStarter(
        NoEngine(), 5, True, ["a prompt"], default_grid(5), cache, lambda t: [], lambda *s: statuses.append(s)
    )


def test_a_cached_model_starts_with_the_acceptance_kept_beside_it(tmp_path):
    statuses: list = []
    start = starter(tmp_path / "cost.json", statuses)
    assert start.cached() == CostStart(None)  # nothing cached: no model, no error
    drafts = PositionCounts(5)
    drafts.accepted, drafts.reached = [9, 7, 5, 0, 0], [10, 9, 7, 5, 0]
    save_cached(tmp_path / "cost.json", PRIOR, drafts)
    cached = start.cached()
    assert cached.source == "cache" and cached.cost.step_s(4, 3) == pytest.approx(PRIOR.step_s(4, 3))
    assert cached.acceptance == known(drafts) and len(cached.acceptance) == 4 and cached.error is None
    assert statuses == []  # nothing measured


async def test_a_prior_is_scaled_by_the_cells_an_earlier_launch_timed_without_timing(tmp_path):
    prior = ShippedPrior(PRIOR, None, "shipped for a kind")
    slower = [CostPoint(p.batch_size, p.k, p.num_tokens, 1.5 * p.step_s, 6) for p in PRIOR.points]
    grid = timing_grid(5, None)
    timed = [p for p in slower if (p.batch_size, p.k) in grid.cells]
    assert len(timed) == len(grid.cells)
    drafts = PositionCounts(5)
    drafts.accepted, drafts.reached = [8, 6, 0, 0, 0], [10, 8, 6, 0, 0]
    save_timing(timing_cache_path(tmp_path / "cost.json"), prior, timed, drafts)
    statuses: list = []
    start = await starter(tmp_path / "cost.json", statuses).from_prior(prior, None)
    assert start.source == "shipped" and start.error is None and statuses == []
    assert "cells an earlier launch timed on this machine" in start.note and "shipped for a kind" in start.note
    assert start.cost.step_s(1, 0) == pytest.approx(scale_prior(PRIOR, timed)[0].step_s(1, 0))
    assert start.acceptance == known(drafts) and start.acceptance  # no acceptance shipped: the timing's drafts


async def test_a_prior_that_cannot_be_scaled_leaves_no_model_and_says_why(tmp_path, monkeypatch):
    def broken(cost, points):
        raise ValueError("no cells")

    monkeypatch.setattr("engine_adapter.policy.cost_start.scale_prior", broken)
    prior = ShippedPrior(PRIOR, None, "a broken prior")
    timed = [p for p in PRIOR.points if (p.batch_size, p.k) in timing_grid(5, None).cells]
    save_timing(timing_cache_path(tmp_path / "cost.json"), prior, timed, None)
    start = await starter(tmp_path / "cost.json", []).from_prior(prior, None)
    assert start.cost is None and "could not be used (no cells): measuring this machine instead" in start.error


async def test_a_profile_is_cached_and_one_that_cannot_be_kept_stays_in_force_and_says_so(tmp_path, monkeypatch):
    async def profile(client, prompts, k_max, drafter_runs_model, **kw):
        kw["progress"](ProfileProgress(0.5, "4 requests x K=3 (cell 5 of 10)", 12.0, tuple(PRIOR.points[:4])))
        return PRIOR

    monkeypatch.setattr("engine_adapter.policy.cost_start.profile_engine", profile)
    statuses: list = []
    start = await starter(tmp_path / "cost.json", statuses).profiled(None, None, None)
    assert start.source == "profiled" and start.cost is PRIOR and start.error is None
    assert statuses[0] == ("starting", None) and statuses[-1] == (None, None)
    text, measured = statuses[1]
    assert text == "4 requests x K=3 (cell 5 of 10) (50%, about 12 s left)" and measured is not None
    assert starter(tmp_path / "cost.json", []).cached().source == "cache"  # the next launch starts from it
    (tmp_path / "blocked").write_text("")
    kept = await starter(tmp_path / "blocked" / "cost.json", []).profiled(None, None, None)
    assert kept.cost is PRIOR and "could not be kept for later launches" in kept.error


async def test_a_profile_that_fails_leaves_no_model_and_says_why(tmp_path, monkeypatch):
    async def profile(*args, **kw):
        raise RuntimeError("the engine stopped")

    monkeypatch.setattr("engine_adapter.policy.cost_start.profile_engine", profile)
    statuses: list = []
    failed = await starter(tmp_path / "cost.json", statuses).profiled(None, None, None)
    assert failed == CostStart(None, error="profiling failed: the engine stopped")
    assert statuses == [("starting", None), (None, None)] and not (tmp_path / "cost.json").exists()


async def test_a_machine_beyond_the_scalings_range_is_said_in_the_note(tmp_path):
    prior = ShippedPrior(PRIOR, None, "shipped for a kind")
    grid = timing_grid(5, None)
    timed = [
        CostPoint(p.batch_size, p.k, p.num_tokens, 10 * p.step_s, 6)
        for p in PRIOR.points
        if (p.batch_size, p.k) in grid.cells
    ]
    save_timing(timing_cache_path(tmp_path / "cost.json"), prior, timed, None)
    start = await starter(tmp_path / "cost.json", []).from_prior(prior, None)
    assert "×4.00 (verification)" in start.note and "the scaling's limit" in start.note
    save_timing(
        timing_cache_path(tmp_path / "cost.json"), prior, [replace(p, step_s=p.step_s / 10) for p in timed], None
    )
    assert "limit" not in (await starter(tmp_path / "cost.json", []).from_prior(prior, None)).note
