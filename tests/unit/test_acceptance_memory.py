"""The K policies' acceptance memory: what a launch starts from, and what a window without drafts keeps.

No engine: real ``EngineStep`` records through ``LivePolicy``'s own window, and the cost-model cache
on a temporary disk. Why it matters: under the 0.5 guess the auto table chose K=0 at every batch
size on the packaged pair, so a launch with a cached cost model (or a minute at K=0) never drafted
again and never measured anything to correct it. Also the auto-table preview the page draws from
that memory: the table ``auto`` would apply, not one derived for fewer batch sizes.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from engine_adapter.acceptance import PositionCounts
from engine_adapter.policy.acceptance_memory import MIN_REACHED
from engine_adapter.policy.controller import PolicyController
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.k_policy import derive_auto_table
from engine_adapter.policy.live_state import MAX_PREVIEW_BATCH, LivePolicy
from engine_adapter.policy.profiler import load_cached, load_cached_acceptance, save_cached
from engine_adapter.records import EngineStep

# the packaged pair's cells on 2 CPU cores with AVX-512: K=1 costs 55 % more than K=0
PACKAGED_CELLS = [
    CostPoint(1, 0, 1, 0.111, 4),
    CostPoint(1, 1, 2, 0.171, 7),
    CostPoint(1, 3, 4, 0.229, 4),
    CostPoint(4, 0, 4, 0.107, 4),
    CostPoint(4, 1, 8, 0.182, 4),
    CostPoint(4, 3, 16, 0.319, 4),
    CostPoint(16, 0, 16, 0.207, 4),
    CostPoint(16, 1, 32, 0.403, 4),
    CostPoint(16, 3, 64, 0.798, 4),
]


def _step(seq: int, t: float, accepted: tuple[int, ...], reached: tuple[int, ...]) -> EngineStep:
    return EngineStep(
        seq=seq,
        t=t,
        wall_s=0.1,
        interval_s=0.1,
        batch_size=1,
        k=len(reached),
        num_tokens=1 + len(reached),
        num_drafted=len(reached),
        num_accepted=accepted[0],
        num_emitted=1 + accepted[0],
        accepted_per_pos=accepted,
        reached_per_pos=reached,
        num_drafting=1,
        tap_s=0.0,
    )


class _Steps:
    """An engine's step history as the service keeps it (``steps_since``)."""

    def __init__(self) -> None:
        self.steps: list[EngineStep] = []

    def since(self, t: float) -> list[EngineStep]:
        return [s for s in self.steps if s.t >= t]


def _policy(history: _Steps, k_max: int = 3) -> LivePolicy:
    live = LivePolicy(history.since, ["a prompt"], window_s=60.0)
    live.controller = PolicyController(client=None, k_max=k_max, max_batch=16)
    return live


def test_a_window_without_drafts_keeps_the_last_measurement():
    history = _Steps()
    live = _policy(history)
    now = time.monotonic()
    # 40 verify steps that drafted 3 and kept 2 at positions 1-2, 1 at position 3 (of 2 tested)
    history.steps = [_step(i, now - 5, (1, 1, 0), (1, 1, 1)) for i in range(40)]
    live.remember_window()
    measured = live.alphas()
    assert measured[0] > 0.9 and measured[2] < 0.1
    history.steps = [_step(i, now - 600, (1, 1, 0), (1, 1, 1)) for i in range(40)]  # all out of the window
    assert live.alphas() == pytest.approx(measured)
    live.remember_window()  # a round of the auto loop with nothing new: the memory stays
    assert live.alphas() == pytest.approx(measured)


def test_a_short_requests_drafts_move_the_memory_once_each():
    """A 64-token request at K=3 runs about 13 steps: too few for the window to read on its own,
    enough to say its text accepts more than the launch's acceptance; the next request drafts by
    what it measured. Each step counts once however many rounds it stays in the window."""
    history = _Steps()
    live = _policy(history)
    now = time.monotonic()
    # an earlier text, measured and gone from the window: 12 of 20 drafts kept at each position
    history.steps = [_step(i, now - 5, (int(i < 12),) * 3, (1, 1, 1)) for i in range(20)]
    live.remember_window()
    history.steps = [replace(s, t=now - 600) for s in history.steps]
    live.remember_window()
    before = live.alphas()
    assert all(0.55 < b < 0.65 for b in before), before
    history.steps += [_step(20 + i, now - 5, (1, 1, 1), (1, 1, 1)) for i in range(13)]  # every draft kept
    live.remember_window()
    moved = live.alphas()
    assert moved == pytest.approx([(13 + MIN_REACHED * b) / (13 + MIN_REACHED) for b in before])
    for _ in range(12):  # the auto loop's rounds while the same steps stay in the window
        live.remember_window()
    assert live.alphas() == pytest.approx(moved)
    history.steps += [_step(33 + i, now - 1, (0, 0, 0), (1, 0, 0)) for i in range(13)]  # a hard text next
    live.remember_window()
    after = live.alphas()
    assert after[0] < moved[0] - 0.1 and after[1:] == pytest.approx(moved[1:])  # untested positions keep


def test_the_profilers_drafts_are_not_the_visitors_acceptance():
    history = _Steps()
    live = _policy(history)
    now = time.monotonic()
    history.steps = [_step(i, now - 5, (1, 1, 0), (1, 1, 1)) for i in range(40)]  # a visitor's text
    live.remember_window()
    # then an idle-time cell on the profiler's prompts: it drafts, and keeps nothing
    history.steps += [replace(_step(40 + i, now - 1, (0, 0, 0), (1, 0, 0)), profiling_requests=1) for i in range(40)]
    assert live.alphas()[0] > 0.9


def test_before_any_measurement_the_estimate_is_the_guess():
    live = _policy(_Steps())
    live.remember_window()
    assert live.alphas() == pytest.approx([0.5, 0.5, 0.5])


def test_a_measured_code_acceptance_drafts_at_batch_1_and_not_at_16():
    """What a launch with the cache starts from, on the packaged pair's measured cells (the 0.5
    guess sits within a hair of K=0 against K=1 at batch size 1 there: the real cells chose 0)."""
    cost = fit_cost_model(PACKAGED_CELLS, drafter_runs_model=True)
    ks = derive_auto_table(cost, [0.9, 0.88, 0.85, 0.8, 0.75], 5, 16).k_by_batch
    assert ks[0] > 0 and ks[15] == 0


def test_the_cache_keeps_the_profiles_acceptance(tmp_path):
    cost = fit_cost_model(PACKAGED_CELLS, drafter_runs_model=True)
    counts = PositionCounts(3)
    counts.accepted, counts.reached = [90, 70, 40], [100, 90, 70]
    path = tmp_path / "cost" / "x.json"
    save_cached(path, cost, counts)
    assert load_cached(path, drafter_runs_model=True).points == cost.points
    loaded = load_cached_acceptance(path)
    assert (loaded.accepted, loaded.reached) == (counts.accepted, counts.reached)


@pytest.mark.parametrize(
    "saved",
    [
        {},  # a cost model saved before the acceptance was (profile version 3)
        {"acceptance": {"accepted": [1, 2], "reached": [3]}},  # lengths differ
        {"acceptance": {"accepted": "x"}},
    ],
)
def test_a_cache_without_a_usable_acceptance_gives_none(tmp_path, saved):
    cost = fit_cost_model(PACKAGED_CELLS, drafter_runs_model=True)
    path = tmp_path / "x.json"
    path.write_text(json.dumps(cost.to_dict() | saved))
    assert load_cached_acceptance(path) is None
    assert load_cached(path, drafter_runs_model=True) is not None


def test_the_preview_is_the_table_auto_applies_cut_to_the_charts_batch_sizes():
    """A draft model whose fixed cost spreads over the batch: past 64 requests K=2 pays again, and
    keeping K from rising holds K=2 at 45-64 requests too. A table derived for 64 batch sizes
    only would show K=1 there, which ``auto`` never applies on this engine (max_num_seqs 256)."""
    history = _Steps()
    now = time.monotonic()
    history.steps = [_step(i, now - 5, (1, 1, 1), (1, 1, 1)) for i in range(19)] + [
        _step(19, now - 5, (0, 0, 0), (1, 0, 0))
    ]
    live = LivePolicy(history.since, ["a prompt"], window_s=60.0)
    live.controller = PolicyController(client=None, k_max=3, max_batch=256)
    live.controller.cost = CostModel(0.05, 0.005 / 75, 100, first_s=0.02, first_s_per_req=0.005 / 75, draft_s=0.03)
    live.remember_window()
    alphas = live.alphas()
    applied = derive_auto_table(live.controller.cost, alphas, 3, 256)
    assert (
        derive_auto_table(live.controller.cost, alphas, 3, MAX_PREVIEW_BATCH).rows
        != applied.up_to(MAX_PREVIEW_BATCH).rows
    )
    preview = live.view().auto_preview
    assert preview.rows == applied.up_to(MAX_PREVIEW_BATCH).rows == [(1, 64, 2)]
    assert preview.k_by_batch == applied.k_by_batch[:MAX_PREVIEW_BATCH]
    assert preview.rate == applied.rate[:MAX_PREVIEW_BATCH]
