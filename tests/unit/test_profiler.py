"""The profiler's grid, its time estimate and the profiling-request marks: pure, no engine."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine_adapter.engine.tap_receiver import summarize
from engine_adapter.policy.cost_model import CostModel, CostPoint
from engine_adapter.policy.profile_grid import ProfileGrid
from engine_adapter.policy.profiler import (
    ACK_STEPS,
    PREFILL_STEPS_PER_REQUEST,
    SETTLE_STEPS,
    ProfileMeter,
    cell_estimates_s,
    cell_max_tokens,
    default_ks,
    estimate_profile_s,
    is_stable,
)
from engine_adapter.records import is_profile_request, profile_request_id, visitor_count
from tests.support.tap_records import tap_row, tap_step


@pytest.mark.parametrize(
    "k_max, ks",
    [
        (5, [3, 1, 0]),  # K 4 and 5 priced by the fit's per-pass cost
        (3, [3, 1, 0]),
        (2, [2, 1, 0]),
        (1, [1, 0]),
    ],
)
def test_ks_are_profiled_highest_first_and_k0_last(k_max, ks):
    # after K=0 an idle drafter's requests have holes (a K>0 cell would time their catch-up): K=0 last
    assert default_ks(k_max) == ks


@pytest.mark.parametrize(
    "batch_sizes, ks, cells",
    [
        ((1, 2), (0, 3), [(1, 3), (1, 0), (2, 3), (2, 0)]),
        ((4, 1, 4), (1, 0, 5), [(1, 5), (1, 1), (1, 0), (4, 5), (4, 1), (4, 0)]),
        ((16,), (0,), [(16, 0)]),
    ],
)
def test_cells_run_batch_sizes_up_and_k_down(batch_sizes, ks, cells):
    assert ProfileGrid(batch_sizes, ks).cells == cells


@pytest.mark.parametrize("steps", [4, 10, 20])
def test_a_profiling_request_outlives_every_cell_of_its_batch(steps):
    ks = default_ks(5)
    # every draft kept: K+1 tokens a step, for the settling steps and twice the samples, in each cell
    needed = sum((2 * steps + SETTLE_STEPS) * (k + 1) for k in ks)
    assert cell_max_tokens(ks, steps) > needed


def test_the_time_estimate_adds_up_the_cells_own_step_times():
    flat = CostModel(base_s=0.1, slope_s=0.0, knee_tokens=1e9)  # every step 100 ms
    grid = ProfileGrid((1, 2), tuple(default_ks(3)))
    cells = len(grid.cells)
    estimate = estimate_profile_s(flat, grid, steps_per_cell=10)
    prefills = (1 + 1 * PREFILL_STEPS_PER_REQUEST) + (1 + 2 * PREFILL_STEPS_PER_REQUEST)  # batches of 1 and 2
    assert estimate == pytest.approx(cells * (10 + SETTLE_STEPS + ACK_STEPS) * 0.1 + prefills * 0.1)
    measured = CostModel(0.1, 0.0, 1e9, points=(CostPoint(2, 3, 8, 1.0, 10),))  # one slow measured cell
    assert estimate_profile_s(measured, grid, steps_per_cell=10) > estimate + 10


def _hinge(b: int, k: int) -> float:
    """A machine's step time: 100 ms flat up to 8 tokens, 20 ms per token beyond, 30 ms a draft pass."""
    return 0.1 + 0.02 * max(0, b * (k + 1) - 8) + 0.03 * k


def test_the_time_left_is_the_cost_models_estimate_scaled_by_the_pace_so_far():
    expect = CostModel(base_s=0.1, slope_s=0.02, knee_tokens=8, draft_s=0.03, first_s=0.03)
    grid = ProfileGrid((1, 4, 16), tuple(default_ks(3)))
    meter = ProfileMeter(grid, 4, expect, None)
    cells = cell_estimates_s(expect, grid, 4)
    assert meter.left_s((), 0.0) == pytest.approx(sum(cells))  # before a cell: the estimate itself
    for b, k in grid.cells[:4]:
        meter.cell_done(b, k)
    # the cells done took 1.5 times the estimate (a slower machine, or the switches' overhead): so will the rest
    assert meter.left_s((), 1.5 * sum(cells[:4])) == pytest.approx(1.5 * sum(cells[4:]))


def test_without_a_cost_model_the_time_left_comes_from_the_cells_measured_so_far():
    grid = ProfileGrid((1, 4, 16), (3, 1, 0))
    meter = ProfileMeter(grid, 4, None, None)
    one_size = [CostPoint(1, k, k + 1, _hinge(1, k), 4) for k in (3, 1, 0)]
    for b, k in grid.cells[:3]:
        meter.cell_done(b, k)
    frac = meter.fraction  # the weights' share of the cells done
    assert 0 < frac < 0.25 and meter.left_s(one_size, 3.0) == pytest.approx(3.0 * (1 - frac) / frac)  # the pace
    two_sizes = [*one_size, *(CostPoint(4, k, 4 * (k + 1), _hinge(4, k), 4) for k in (3, 1, 0))]
    for b, k in grid.cells[3:6]:
        meter.cell_done(b, k)
    elapsed = sum(cell_estimates_s(CostModel(0.1, 0.02, 8, draft_s=0.03, first_s=0.03), grid, 4)[:6])
    # the fits to the six cells price the batch of 16 they have not seen: one too cheap, one too dear
    truth = sum((4 + SETTLE_STEPS + ACK_STEPS) * _hinge(16, k) for k in (3, 1, 0))
    truth += (1 + 16 * PREFILL_STEPS_PER_REQUEST) * _hinge(16, 3)
    assert meter.left_s(two_sizes, elapsed) == pytest.approx(truth, rel=0.1)


def test_before_two_batch_sizes_the_cells_weigh_what_the_kinds_shipped_step_times_say():
    # a matrix unit's machine: a batch costs little more than one request, K's passes most
    machine = CostModel(base_s=0.28, slope_s=0.002, knee_tokens=4, draft_s=0.1, first_s=0.1)
    grid = ProfileGrid((1, 4, 16), (3, 1, 0), one_request_ks=(5,))
    truth = cell_estimates_s(machine, grid, 4)
    other_models = replace(machine, base_s=0.14, draft_s=0.05, first_s=0.05)  # the kind's prior: half the step
    by_shape, by_weight = ProfileMeter(grid, 4, None, None, other_models), ProfileMeter(grid, 4, None, None)
    first = [(b, k) for b, k in grid.cells if b == 1]
    for meter in (by_shape, by_weight):
        for b, k in first:
            meter.cell_done(b, k)
    one_size = [CostPoint(1, k, k + 1, machine.fit_step_s(1, k), 4) for _, k in first]
    left = sum(truth[len(first) :])
    # other models' step times, the batches' slope unhalved: near, not exact
    assert by_shape.left_s(one_size, sum(truth[: len(first)])) == pytest.approx(left, rel=0.1)
    said = by_weight.left_s(one_size, sum(truth[: len(first)]))  # 1 + b(K+1)/8: batches priced too dear
    assert said > 1.5 * left
    for meter in (by_shape, by_weight):
        for b, k in grid.cells[len(first) : len(first) + 3]:
            meter.cell_done(b, k)
    two_sizes = [*one_size, *(CostPoint(4, k, 4 * (k + 1), machine.fit_step_s(4, k), 4) for k in (3, 1, 0))]
    elapsed, frac = sum(truth[: len(first) + 3]), by_shape.fraction
    by_fits = by_weight.left_s(two_sizes, elapsed)  # from two batch sizes: the fits, and with the kind's...
    by_pace = elapsed * (1 - frac) / frac  # ...step times, the mean of the fits and the pace over them
    assert by_shape.left_s(two_sizes, elapsed) == pytest.approx((by_fits + by_pace) / 2)
    assert by_fits != pytest.approx(by_pace, rel=0.01)


@pytest.mark.parametrize(
    "samples_ms, stable",
    [
        ([500, 510, 490, 505], True),
        ([500, 510, 490, 900], True),  # one slow step: the median holds
        ([500, 900, 480, 950], False),  # two: take more samples
        ([400, 500, 600, 700], False),
        ([], False),
    ],
)
def test_a_cell_is_stable_when_its_samples_agree(samples_ms, stable):
    assert is_stable([ms / 1e3 for ms in samples_ms]) is stable


@pytest.mark.parametrize("tag", ["b1r0", "b16r15", ""])
def test_profiling_ids_are_marked_and_have_no_dash(tag):
    rid = profile_request_id(tag)
    assert is_profile_request(rid) and "-" not in rid
    assert rid != profile_request_id(tag)  # unique: a second profile never reuses a live id


@pytest.mark.parametrize(
    "ids, skipped, profiling",
    [
        (["abc", "def"], [], 0),
        ([profile_request_id("b2r0"), profile_request_id("b2r1")], [], 2),
        ([profile_request_id("b2r0"), "visitor"], [], 1),
        # a profiling request aborted at its cell's end while the step ran: scheduled (in batch_size),
        # not processed by vLLM (not in reqs), still the profiler's (once counted as a visitor)
        ([profile_request_id("b2r0")], [profile_request_id("b2r1")], 2),
        ([profile_request_id("b2r0")], ["visitor"], 1),
    ],
)
def test_the_tap_summary_counts_the_profilers_requests(ids, skipped, profiling):
    engine_id = "cmpl-{}-0-1a2b3c4d".format
    reqs = [tap_row(engine_id(rid), drafted=[5, 6], accepted=1, emitted=[5, 7]) for rid in ids]
    n = len(ids) + len(skipped)
    step = tap_step(batch_size=n, k=2, num_tokens=3 * n, reqs=reqs, skipped=[engine_id(s) for s in skipped])
    assert summarize(step).profiling_requests == profiling


@pytest.mark.parametrize(
    "ids, visitors",
    [
        ([], 0),
        (["cmpl-abc-0-1a2b3c4d", "chatcmpl-def-0-9f"], 2),
        ([f"cmpl-{profile_request_id('b16r0')}-0-1a2b3c4d"] * 16, 0),  # the profile's last cell
        ([f"cmpl-{profile_request_id('b1r0')}-0-1a2b3c4d", "cmpl-abc-0-1a2b3c4d"], 1),
    ],
)
def test_the_idle_drafters_recent_load_counts_visitors_only(ids, visitors):
    # policy_hooks prices a new request's drafter at the recent peak of visitors' requests
    assert visitor_count(ids) == visitors


@pytest.mark.parametrize(
    "prompt, short",
    [
        (
            "Write a Python function that checks whether a string is a palindrome, ignoring case.",
            "Write a Python function that checks whether a",
        ),
        ("def add(a, b):", "def add(a, b):"),
        ("  two\n\nwords  ", "two words"),
    ],
)
def test_profiling_prompts_are_short(prompt, short):
    from engine_adapter.policy.profiler import short_prompt

    assert short_prompt(prompt) == short
