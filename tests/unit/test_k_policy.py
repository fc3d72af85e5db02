"""K policies on hand-made numbers: E(K), the auto table, the slot auction, the cost fit."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from engine_adapter.acceptance import SlotEstimator, alphas_from_counts, fade_toward, remembered_alphas, survival
from engine_adapter.engine_config import validate_k_table
from engine_adapter.policy.cost_model import K_SHRINK_STEPS, CostModel, CostPoint, fit_cost_model, points_from_steps
from engine_adapter.policy.k_policy import (
    DRAFT_RISK,
    auction,
    best_ceiling,
    derive_auto_table,
    equal_slots,
    expected_tokens,
    idle_drafter_k,
    non_increasing_ks,
    one_request_outlook,
    risk_weighed,
    rows_from_ks,
)

# A CPU-like machine: flat until 4 tokens, then compute-bound (25 ms per extra
# token, i.e. proportional to tokens); no drafter cost.
CPU = CostModel(base_s=0.100, slope_s=0.025, knee_tokens=4)
# A GPU-like machine: flat until 256 tokens.
GPU = CostModel(base_s=0.010, slope_s=0.0001, knee_tokens=256)


@pytest.mark.parametrize(
    "alphas, k, expected",
    [
        ([0.8, 0.8, 0.8], 0, 1.0),
        ([0.8, 0.8, 0.8], 1, 1.8),
        ([0.8, 0.8, 0.8], 3, 1 + 0.8 + 0.64 + 0.512),
        ([1.0, 1.0], 2, 3.0),
        ([0.0, 1.0], 2, 1.0),  # nothing survives a certain rejection at position 1
        ([0.5, 0.9, 0.2], 3, 1 + 0.5 + 0.45 + 0.09),
    ],
)
def test_expected_tokens(alphas, k, expected):
    assert expected_tokens(alphas, k) == pytest.approx(expected)


def test_survival_is_a_running_product_clamped():
    assert survival([0.9, 0.5, 1.5, -1]) == pytest.approx([0.9, 0.45, 0.45, 0.0])


@pytest.mark.parametrize(
    "ks, rows",
    [
        ([3, 3, 1, 1, 0], [(1, 2, 3), (3, 4, 1), (5, 5, 0)]),
        ([2], [(1, 1, 2)]),
        ([0, 0, 0], [(1, 3, 0)]),
        ([1, 2, 1], [(1, 1, 1), (2, 2, 2), (3, 3, 1)]),
    ],
)
def test_rows_from_ks(ks, rows):
    assert rows_from_ks(ks) == rows
    assert validate_k_table([list(r) for r in rows]) == rows  # always valid for vLLM


def brute_force_best_k(cost, alphas, b, k_max):
    """Every K's rate, each draft position weighed down by DRAFT_RISK; ties to the smaller K."""
    weighed = [expected_tokens(alphas, k) / cost.step_s(b, k) * (1 - DRAFT_RISK) ** k for k in range(k_max + 1)]
    return max(range(k_max + 1), key=lambda k: (weighed[k], -k))


@pytest.mark.parametrize(
    "cost, alphas, k_max, max_batch, expect",
    [
        # CPU knee at 4 tokens, alpha 0.8: b=1 can verify 4 tokens flat -> K=3;
        # b=2 -> 2 tokens each -> K=1; b>=4 at the knee -> K=0.
        (CPU, [0.8] * 5, 5, 8, {1: 3, 2: 1, 4: 0, 8: 0}),
        # GPU: flat to 256 tokens; every batch here drafts the most it may.
        (GPU, [0.8] * 5, 5, 32, {1: 5, 16: 5, 32: 5}),
        # worthless drafts never pay, even when free
        (GPU, [0.0] * 5, 5, 4, {1: 0, 4: 0}),
        # a drafter that costs 60 ms per position beyond its standing first one: K=1 at b=1, not 3
        (CostModel(0.1, 0.025, 4, draft_s=0.06), [0.8] * 5, 5, 1, {1: 1}),
    ],
)
def test_auto_table_finds_the_known_optimum(cost, alphas, k_max, max_batch, expect):
    auto = derive_auto_table(cost, alphas, k_max, max_batch)
    for b, k in expect.items():
        assert auto.k_by_batch[b - 1] == k, (b, auto.k_by_batch)
    for b in range(1, max_batch + 1):
        assert auto.k_by_batch[b - 1] == brute_force_best_k(cost, auto.alphas, b, k_max)
        assert max(auto.rate[b - 1]) == pytest.approx(auto.rate[b - 1][auto.k_by_batch[b - 1]])
    assert validate_k_table([list(r) for r in auto.rows]) == auto.rows


def test_auto_table_hand_computed_cpu_case():
    # b=1, alpha 0.8, CPU: K=3 -> 4 tokens (flat): 2.952/0.100 = 29.5 tok/s;
    # K=4 -> 5 tokens: 3.3616/0.125 = 26.9: K=3 wins at b=1.
    # b=2: K=1 -> 4 tokens: 1.8/0.1 = 18 beats K=0 (10) and K=2 (2.44/0.15 = 16.3).
    auto = derive_auto_table(CPU, [0.8] * 5, 5, 2)
    assert auto.rate[0][3] == pytest.approx(2.952 / 0.100)
    assert auto.rate[0][4] == pytest.approx(3.3616 / 0.125)
    assert auto.rate[1][2] == pytest.approx(2.44 / 0.15)
    assert auto.k_by_batch == [3, 1]
    assert auto.rows == [(1, 1, 3), (2, 2, 1)]


@pytest.mark.parametrize(
    "case, scores, cost, batch, admitted",
    [
        # a confident request's deep position outranks a doubtful request's first
        (
            "deep beats doubtful",
            {"sure": [0.95, 0.92, 0.90, 0.88], "doubt": [0.20, 0.05, 0.01, 0.0]},
            CostModel(0.1, 0.1, 6),
            None,
            {"sure": 4, "doubt": 0},
        ),
        # free verification (GPU-like): everything positive is admitted
        ("free slots", {"a": [0.9, 0.5], "b": [0.1, 0.01]}, GPU, None, {"a": 2, "b": 2}),
        # expensive slots: nothing is worth verifying
        ("no budget", {"a": [0.5, 0.25], "b": [0.4]}, CostModel(0.1, 1.0, 0), None, {"a": 0, "b": 0}),
        # non-monotone scores are treated as their running minimum: prefix only
        ("prefix only", {"a": [0.3, 0.99]}, CostModel(0.1, 0.1, 2), None, {"a": 1}),
        # more requests in the step than scored (prefills): the knee is used up by them
        ("others fill the knee", {"a": [0.9, 0.8]}, CostModel(0.1, 0.1, 4), 4, {"a": 0}),
    ],
)
def test_auction_admission(case, scores, cost, batch, admitted):
    res = auction(scores, cost, batch_size=batch)
    assert res.admitted == admitted, case
    assert res.slots == sum(admitted.values())
    assert res.rate_by_slots[res.slots] == pytest.approx(max(res.rate_by_slots))


def test_auction_objective_is_expected_tokens_per_second():
    cost = CostModel(0.1, 0.05, 3)
    scores = {"x": [0.9, 0.8, 0.7], "y": [0.6, 0.3, 0.1]}
    res = auction(scores, cost)
    flat = sorted((s for ss in scores.values() for s in ss), reverse=True)
    for n, rate in enumerate(res.rate_by_slots):
        assert rate == pytest.approx((2 + sum(flat[:n])) / cost.verify_s(2 + n))


def test_slot_estimator_shrinks_toward_pooled():
    est = SlotEstimator(k_max=3, prior=0.5, strength=2.0)
    for _ in range(8):
        est.observe("good", num_drafted=3, accepted=3)
        est.observe("bad", num_drafted=3, accepted=0)
    # pooled position 1: reached 16, accepted 8 (+2 pseudo at 0.5) -> 9/18
    assert est.pooled_alphas()[0] == pytest.approx(9 / 18)
    good, bad = est.alphas("good"), est.alphas("bad")
    assert good[0] == pytest.approx((8 + 2 * 0.5) / 10)
    assert bad[0] == pytest.approx((0 + 2 * 0.5) / 10)
    # "bad" never reached position 2: its estimate is the pooled one
    assert bad[1] == pytest.approx(est.pooled_alphas()[1])
    assert est.scores("good", 3)[2] <= est.scores("good", 3)[1] <= est.scores("good", 3)[0]
    est.forget("good")
    assert est.alphas("good") == est.pooled_alphas()


def test_drafts_across_a_hole_teach_their_own_request_only():
    """An idle draft model drafting across a hole (the load's doing) prices that request alone."""
    est = SlotEstimator(k_max=3, prior=0.9, strength=2.0)
    for _ in range(8):
        est.observe("holed", num_drafted=3, accepted=0, pooled=False)
    assert est.pooled_alphas() == pytest.approx([0.9, 0.9, 0.9])  # the pool and ...
    assert est.calibration() == [1.0, 1.0, 1.0]  # ... the calibration saw nothing
    assert est.alphas("holed")[0] == pytest.approx((0 + 2 * 0.9) / 10)
    assert est.alphas("whole") == pytest.approx([0.9, 0.9, 0.9])


def test_slot_scores_are_calibrated_against_what_was_kept():
    est = SlotEstimator(k_max=3, prior=0.5, strength=2.0, calibration_strength=5.0)
    assert est.calibration() == [1.0, 1.0, 1.0]
    assert est.scores("r", 3) == pytest.approx(survival(est.alphas("r")))  # no evidence: raw survival
    # a streak makes "r" look sure at every depth; then 10 steps keep only position 1
    for _ in range(10):
        est.observe("r", num_drafted=3, accepted=3)
    promised = survival(est.alphas("r"))
    before = list(est.predicted)
    for _ in range(10):
        est.observe("r", num_drafted=3, accepted=1)
    cal = est.calibration()
    # position 3 was promised more than it kept; every promise is counted before its outcome
    assert est.kept == [20, 10, 10]
    assert est.predicted[2] > before[2] + 10 * 0.5 * promised[2]
    assert cal[2] == pytest.approx((10 + 5) / (est.predicted[2] + 5)) and cal[2] < 0.8 < cal[0]
    raw, got = survival(est.alphas("r")), est.scores("r", 3)
    assert got[2] == pytest.approx(min(raw[2] * cal[2], got[1])) and got[2] < raw[2]
    assert got[0] >= got[1] >= got[2] and got[0] <= 1.0
    # a new request starts from the pooled estimate, calibrated alike
    assert est.scores("new", 3)[2] == pytest.approx(
        min(survival(est.pooled_alphas())[2] * cal[2], est.scores("new", 3)[1])
    )


def make_points(model: CostModel, grid) -> list[CostPoint]:
    return [CostPoint(b, k, b * (k + 1), model.fit_step_s(b, k), 5) for b, k in grid]


GRID = [(b, k) for b in (1, 2, 4, 8, 16) for k in (0, 1, 3, 5)]


@pytest.mark.parametrize(
    "truth, drafter",
    [
        (CostModel(0.08, 0.004, 4), False),  # CPU-like knee
        (CostModel(0.012, 0.0002, 48), False),  # knee inside the grid, high
        (CostModel(0.08, 0.004, 8, draft_s=0.02, draft_s_per_req=0.001), True),
    ],
)
def test_fit_recovers_a_known_hinge(truth, drafter):
    fit = fit_cost_model(make_points(truth, GRID), drafter_runs_model=drafter)
    assert fit.rmse_s < 1e-6
    for b, k in GRID:
        assert fit.fit_step_s(b, k) == pytest.approx(truth.fit_step_s(b, k), rel=1e-4)
    assert math.isclose(fit.knee_tokens, truth.knee_tokens)


def test_points_from_steps_medians_and_skips_prefill():
    obs = [(2, 1, 4, 0.10), (2, 1, 4, 0.12), (2, 1, 4, 0.50), (2, 1, 40, 0.9), (1, 0, 1, 0.05)]
    pts = points_from_steps(obs, min_samples=1)
    assert pts == [CostPoint(1, 0, 1, 0.05, 1), CostPoint(2, 1, 4, 0.12, 3)]


def test_cost_model_round_trips():
    fit = fit_cost_model(make_points(CPU, GRID))
    assert CostModel.from_dict(fit.to_dict()) == fit


@pytest.mark.parametrize(
    "accepted, reached, expected",
    [
        ([], [], []),
        ([8, 6], [10, 8], [(8 + 1) / 12, (6 + 2 * 0.75) / 10]),
        # positions 2 and 3 never tested: they inherit position 1's estimate
        ([90, 0, 0], [100, 0, 0], [91 / 102] * 3),
    ],
)
def test_alphas_from_counts(accepted, reached, expected):
    assert alphas_from_counts(accepted, reached) == pytest.approx(expected)


@pytest.mark.parametrize(
    "accepted, reached, memory, expected",
    [
        # nothing in the window: the memory as it is, not the 0.5 guess
        ([0, 0], [0, 0], [0.9, 0.8], [0.9, 0.8]),
        # a short memory: position 2 inherits the estimate of position 1
        ([0, 0], [0, 0], [0.9], [0.9, 0.9]),
        # counts shrink toward the memory's value at their own position
        ([5, 0], [10, 0], [0.9, 0.8], [(5 + 2 * 0.9) / 12, 0.8]),
    ],
)
def test_alphas_from_counts_shrink_toward_memory(accepted, reached, memory, expected):
    assert alphas_from_counts(accepted, reached, memory=memory) == pytest.approx(expected)


@pytest.mark.parametrize(
    "memory, accepted, reached, expected",
    [
        # an empty window changes nothing; an unmeasured memory stays unmeasured
        ([0.9, 0.8], [0, 0], [0, 0], [0.9, 0.8]),
        ([], [0, 0], [0, 0], []),
        # tested often enough (min_reached 16): the window's estimate replaces the memory's
        ([0.9, 0.8], [10, 0], [20, 0], [(10 + 2 * 0.5) / 22, 0.8]),
        # tested too rarely: the memory stays
        ([0.9, 0.8], [1, 0], [5, 0], [0.9, 0.8]),
        # past the memory: remembered once tested at all, and no further than that
        ([], [3, 1, 0], [4, 3, 0], [(3 + 1) / 6, (1 + 2 * 4 / 6) / 5]),
    ],
)
def test_remembered_alphas(memory, accepted, reached, expected):
    assert remembered_alphas(memory, accepted, reached, min_reached=16) == pytest.approx(expected)


@pytest.mark.parametrize(
    "cost, expected",
    [
        (CostModel(0.1, 0.0, 0), 4),  # free drafting and verification: propose everything
        # a drafter dearer than the step: only the position its standing pass gives for free
        (CostModel(0.1, 0.0, 0, draft_s=0.2), 1),
        # 20 ms per position beyond the first, free verification: K=3 gives (2 + 3.19) / 0.14 = 37.1
        # tokens/s against 36.75 for K=2 and 36.6 for K=4 (0.66 + 0.0 more for 20 ms): 1 % more
        # than K=2, less than a draft position's risk (DRAFT_RISK), so K=2
        (CostModel(0.1, 0.0, 0, draft_s=0.02), 2),
        # ... at 10 ms per position K=4 gives 45.0 against 43.25 for K=3: 4 % more, worth its risk
        (CostModel(0.1, 0.0, 0, draft_s=0.01), 4),
    ],
)
def test_best_ceiling_counts_the_drafters_cost(cost, expected):
    scores = {"a": [0.9, 0.81, 0.73, 0.66], "b": [0.5, 0.2, 0.05, 0.0]}
    k, rates = best_ceiling(scores, cost)
    assert k == expected, rates
    assert risk_weighed(rates)[k] == max(risk_weighed(rates))


def test_a_ks_cells_move_its_whole_curve_shrunk_by_their_steps():
    # the fit: 0.1 s flat to 4 tokens, 10 ms a token past it; K=3's cells read 1.5x it over 400
    # steps, K=0's 2x over 4 steps (a profile's cell: a third of the way), K=1 none
    fit = CostModel(0.1, 0.01, 4)
    pts = (CostPoint(2, 3, 8, 1.5 * fit.fit_step_s(2, 3), 200), CostPoint(8, 3, 32, 1.5 * fit.fit_step_s(8, 3), 200))
    model = replace(fit, points=(*pts, CostPoint(1, 0, 1, 0.2, 4)))
    k3 = 1 + 0.5 * 400 / (400 + K_SHRINK_STEPS)
    k0 = 1 + 1.0 * 4 / (4 + K_SHRINK_STEPS)
    assert model.k_factor(3) == pytest.approx(k3) and model.k_factor(0) == pytest.approx(k0)
    for b in (1, 2, 5, 16):  # every batch size alike: the curve keeps its shape
        assert model.step_s(b, 3) == pytest.approx(k3 * fit.fit_step_s(b, 3))
        assert model.fit_step_s(b, 3) == fit.fit_step_s(b, 3)  # the fit itself is untouched
    assert model.k_factor(2) == pytest.approx(k0 + (k3 - k0) * 2 / 3)  # between measured Ks: interpolated
    assert model.k_factor(5) == pytest.approx(k3)  # past the highest: held
    assert fit.step_s(2, 3) == fit.fit_step_s(2, 3)  # no cells: the fit
    noisy = CostModel(0.1, 0.01, 4, points=(CostPoint(2, 3, 8, 0.5, 5),))  # one 5-step cell: moved 5/13 of the way
    assert noisy.step_s(2, 3) == pytest.approx(0.14 * (1 + (0.5 / 0.14 - 1) * 5 / 13))


def test_step_time_never_falls_as_k_rises():
    fit = CostModel(0.1, 0.0, 4, draft_s=0.01, first_s=0.01)
    model = replace(fit, points=(CostPoint(1, 1, 2, 0.3, 400), CostPoint(1, 3, 4, 0.13, 400)))
    steps = [model.step_s(1, k) for k in range(6)]
    assert steps == sorted(steps) and steps[3] == steps[1]  # K=3's cheap cells do not undercut K=1's


@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_each_ks_step_time_is_the_dearest_scaled_fit_at_or_below_it(batch_size):
    # K=2's cells read 40 % over the fit, K=4's 20 % under it, K=5's 10 % over: one pass per batch size
    fit = CostModel(0.1, 0.005, 4, draft_s=0.02, first_s=0.03, draft_s_per_req=0.001)
    cells = [(1, 2, 1.4), (4, 2, 1.4), (1, 4, 0.8), (1, 5, 1.1)]
    model = replace(fit, points=tuple(CostPoint(b, k, b * (k + 1), r * fit.fit_step_s(b, k), 40) for b, k, r in cells))
    scaled = [model.fit_step_s(batch_size, k) * model.k_factor(k) for k in range(6)]
    expected = [max(scaled[: k + 1]) for k in range(6)]
    assert model.step_s_by_k(batch_size, 5) == expected
    assert [model.step_s(batch_size, k) for k in range(6)] == expected
    assert expected[4] == max(scaled[:4]) > scaled[4]  # K=4's cheap cells do not undercut a smaller K


@pytest.mark.parametrize("acceptance", [0.9, 0.7, 0.5])
def test_the_auto_table_never_zig_zags_on_a_noisy_grid(acceptance):
    # cells as measured on 2 CPU cores (packaged pair, float32): K=3 at b=1 read 11 % slow
    cells = [(1, 0, 0.481), (1, 1, 0.642), (1, 3, 1.233), (4, 0, 0.563), (4, 1, 0.966), (4, 3, 1.435)]
    cells += [(16, 0, 0.830), (16, 1, 1.835), (16, 3, 3.464)]
    pts = [CostPoint(b, k, b * (k + 1), s, 4) for b, k, s in cells]
    cost = fit_cost_model(pts, drafter_runs_model=True)
    ks = derive_auto_table(cost, [acceptance ** (i + 1) for i in range(5)], 5, 64).k_by_batch
    assert ks == sorted(ks, reverse=True), ks  # K never rises with the batch size


def best_non_increasing_by_brute_force(rate):
    """Every non-increasing K sequence, scored as non_increasing_ks scores it; ties to the smaller Ks."""
    n_k = len(rate[0])
    seqs = [[k] for k in range(n_k)]
    for _ in rate[1:]:
        seqs = [s + [k] for s in seqs for k in range(s[-1] + 1)]
    share = [[x / max(r) if max(r) > 0 else 0.0 for x in r] for r in rate]
    return max(seqs, key=lambda s: (round(sum(r[k] for r, k in zip(share, s)), 12), [-k for k in s]))


@pytest.mark.parametrize(
    "rate, expected",
    [
        # per-batch-size optima that never rise are kept as they are
        ([[1, 3, 2], [1, 2, 1.5], [2, 1, 0.5]], [1, 1, 0]),
        # one CI machine's shape (tiny pair): K 1, then 2, then 0; lowering the
        # one rising batch size to K=1 loses 1 %, raising the first to K=2 would lose 10 %
        ([[1, 2, 1.8], [1, 1.98, 2.0], [2, 1, 0.5]], [1, 1, 0]),
        # ... and where raising the first costs less than lowering the rise, the first is raised
        ([[1, 2.0, 1.99], [1, 1.5, 2.0], [2, 1, 0.5]], [2, 2, 0]),
        # a tie at one batch size goes to the smaller K
        ([[1, 2, 2], [1, 2, 2]], [1, 1]),
        # a single batch size: its optimum
        ([[1, 3, 2]], [1]),
        # a batch size where nothing runs (rate 0 at every K) follows the others
        ([[1, 2, 3], [0, 0, 0], [1, 3, 1]], [2, 1, 1]),
    ],
)
def test_non_increasing_ks(rate, expected):
    assert non_increasing_ks(rate) == expected
    assert non_increasing_ks(rate) == best_non_increasing_by_brute_force(rate)


@pytest.mark.parametrize("seed", range(20))
def test_non_increasing_ks_is_the_best_non_increasing_sequence(seed):
    import random

    rnd = random.Random(seed)
    rate = [[rnd.choice([0.5, 1.0, 1.5, 2.0, 2.5]) for _ in range(4)] for _ in range(5)]
    ks = non_increasing_ks(rate)
    assert ks == sorted(ks, reverse=True), ks
    assert ks == best_non_increasing_by_brute_force(rate), rate


def test_a_drafter_whose_fixed_cost_spreads_over_the_batch_never_makes_k_rise():
    # a draft model whose further passes cost 30 ms a step however many requests share them, on a
    # target still nearly flat: per batch size the optimum rises from K=1 at b=1 to K=3 at b=3..4,
    # then falls to 0; the table keeps the best sequence that never rises, and says what it gave up
    cost = CostModel(0.05, 0.005, 2, first_s=0.02, first_s_per_req=0.005, draft_s=0.03)
    alphas = [0.99] * 3
    optima = [brute_force_best_k(cost, alphas, b, 3) for b in range(1, 17)]
    assert optima[:5] == [1, 2, 3, 3, 0], optima  # the unconstrained optimum rises
    auto = derive_auto_table(cost, alphas, 3, 16)
    assert auto.k_by_batch == sorted(auto.k_by_batch, reverse=True), auto.k_by_batch
    assert auto.optimum_by_batch == optima
    assert auto.k_by_batch == best_non_increasing_by_brute_force([risk_weighed(row) for row in auto.rate])
    assert auto.rows == [(1, 4, 2), (5, 16, 0)]  # docs/k-policies.md quotes this table


@pytest.mark.parametrize(
    "rate, expected",
    [
        ([], []),  # no batch sizes
        # optima that never rise are returned exactly, even where rates differ by less than the
        # rounding that decides ties between whole sequences
        ([[1.0, 1.0 + 1e-13, 0.5]], [1]),
        ([[1.0, 1.0 + 1e-13], [2.0, 1.0]], [1, 0]),
    ],
)
def test_non_increasing_ks_edges(rate, expected):
    assert non_increasing_ks(rate) == expected


@pytest.mark.parametrize(
    "k_policy, can_draft, fresh, k_at_recent_peak, expected",
    [
        (3, True, False, 0, 3),  # only engaged requests: the policy's K, whatever the peak was
        (3, False, False, 3, 0),  # every running request dropped by the drafter, none new: no pass for nobody
        (3, True, True, 0, 0),  # a new one while the batch was just at a K=0 size: not engaged
        (3, True, True, 3, 3),  # a new one, and the recent load drafts too: engaged
        (0, True, True, 0, 0),  # the policy's own K=0
        (2, True, True, 1, 2),  # a smaller K at the peak is still drafting: the policy's K
    ],
)
def test_idle_drafter_k(k_policy, can_draft, fresh, k_at_recent_peak, expected):
    assert idle_drafter_k(k_policy, can_draft=can_draft, fresh=fresh, k_at_recent_peak=k_at_recent_peak) == expected


@pytest.mark.parametrize(
    "memory, target, refreshed, share, expected",
    [
        ([0.2, 0.1], [0.8, 0.6], [False, False], 0.5, [0.5, 0.35]),  # half way back at both positions
        ([0.2, 0.1], [0.8, 0.6], [True, False], 0.5, [0.2, 0.35]),  # a refreshed position stays
        ([0.2, 0.1], [0.8], [False, False], 1.0, [0.8, 0.1]),  # no target past the profile's positions
        ([0.2], [0.8, 0.6], [], 0.0, [0.2]),  # no time passed
    ],
)
def test_an_unrefreshed_memory_fades_toward_the_profile(memory, target, refreshed, share, expected):
    assert fade_toward(memory, target, refreshed, share) == pytest.approx(expected)


@pytest.mark.parametrize(
    "lengths, total, expected",
    [
        ({"a": 3, "b": 3, "c": 3}, 6, {"a": 2, "b": 2, "c": 2}),  # the same prefix for each
        ({"a": 3, "b": 3, "c": 3}, 7, {"a": 3, "b": 2, "c": 2}),  # one left over: the first gets it
        ({"a": 1, "b": 5, "c": 5}, 9, {"a": 1, "b": 4, "c": 4}),  # a short draft's share goes to the others
        ({"a": 2, "b": 0}, 5, {"a": 2, "b": 0}),  # never more than drafted
        ({"a": 3, "b": 3}, 0, {"a": 0, "b": 0}),
    ],
)
def test_equal_slots_share_the_same_budget_alike(lengths: dict, total: int, expected: dict) -> None:
    got = equal_slots(lengths, total)
    assert got == expected
    assert sum(got.values()) == min(total, sum(lengths.values()))


# a 2-core CPU's step, as profiled for the packaged pair: 200 ms plain, a draft pass about 50 ms
PAIR = CostModel(base_s=0.200, slope_s=0.02, knee_tokens=8, draft_s=0.05, first_s=0.05)


def test_one_requests_outlook_prices_the_best_k_in_plain_steps():
    alphas = [0.9, 0.9, 0.9, 0.9, 0.9]
    o = one_request_outlook(PAIR, alphas, k_max=5)
    assert o is not None and o.plain_s == pytest.approx(0.2)
    rates = [expected_tokens(alphas, k) / PAIR.step_s(1, k) for k in range(6)]
    assert o.k == max(range(6), key=lambda k: risk_weighed(rates)[k])
    assert o.draft_pass_share == pytest.approx(0.25)  # 50 ms of 200, every pass alike here
    assert o.verify_share == pytest.approx(1.0)  # K + 1 tokens below the knee: a plain step's read
    assert o.speedup == pytest.approx(rates[o.k] / rates[0])


def test_where_no_k_pays_the_outlook_says_what_k1_would_cost():
    dear = CostModel(base_s=0.2, slope_s=0.0, knee_tokens=8, draft_s=0.3, first_s=0.3)  # a draft pass > a step
    o = one_request_outlook(dear, [0.5, 0.5], k_max=3)
    assert o is not None and o.k == 1 and o.speedup < 1.0
    assert o.speedup == pytest.approx(1.5 / (0.5 / 0.2))
    assert one_request_outlook(dear, [], k_max=3) is None  # no acceptance measured: nothing to say


def test_the_outlooks_parts_add_up_to_the_step_it_prices_when_a_ks_cells_move_it():
    fit = CostModel(base_s=0.2, slope_s=0.0, knee_tokens=8, draft_s=0.05, first_s=0.05)
    dear = replace(fit, points=(CostPoint(1, 0, 1, 0.2, 400), CostPoint(1, 2, 3, 1.3 * fit.fit_step_s(1, 2), 400)))
    o = one_request_outlook(dear, [0.95] * 5, k_max=2)
    assert o is not None and o.k in (1, 2)
    parts = o.verify_share + o.k * o.draft_pass_share
    assert parts == pytest.approx(dear.step_s(1, o.k) / dear.step_s(1, 0))
