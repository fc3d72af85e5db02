"""The learner's synthetic evaluation (scripts/cost_learning_eval.py): the truth recovered where the
machine is the line, a dear K scored below it, and one request at a time keeps its K unless idle
time measures the Ks around it."""

from __future__ import annotations

from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.profile_grid import default_grid
from scripts.cost_learning_eval import DISTORTIONS, TRAFFIC, evaluate, one_request_rounds, score, synthetic_steps

TRUE = CostModel(base_s=0.228, slope_s=0.012, knee_tokens=6, draft_s=0.04, draft_s_per_req=0.004, first_s=0.05)
# the line as a profile measures it: its cells fitted (the script fits each shipped prior's)
LINE = fit_cost_model([CostPoint(b, k, b * (k + 1), TRUE.fit_step_s(b, k), 4) for b, k in default_grid(5).cells], True)


def test_the_synthetic_steps_are_the_truths_cells_numbered_on():
    steps = synthetic_steps(lambda b, k: LINE.fit_step_s(b, k), {(1, 3): 5, (4, 1): 3}, first_seq=100)
    assert [s.seq for s in steps] == list(range(100, 108))
    assert [(s.batch_size, s.k) for s in steps] == [(1, 3)] * 5 + [(4, 1)] * 3
    assert all(abs(s.wall_s / LINE.fit_step_s(s.batch_size, s.k) - 1) <= 0.05 for s in steps)


def test_a_table_is_scored_by_its_worst_batch_size():
    def rate(b: int, k: int) -> float:
        return 2.0 if k == 2 else 1.0

    assert score([2] * 16, rate) == 1.0
    assert score([2] * 15 + [0], rate) == 0.5


def test_on_the_line_the_learned_table_is_near_the_best_and_a_dear_k_scores_below():
    rows = evaluate(LINE, [8])
    assert len(rows) == len(DISTORTIONS) * len(TRAFFIC) * 3
    on_line = [r["8"] for r in rows if r["machine"] == "on the line"]
    assert min(on_line) >= 0.95, on_line
    assert min(r["8"] for r in rows) < min(on_line)  # some distortion costs the learned table


def test_one_request_at_a_time_keeps_the_k_the_table_gives_it():
    ks, last = one_request_rounds(LINE, DISTORTIONS["all x1.2"], 0.9, idle=False)
    assert len(set(ks)) == 1 and 0.95 <= last <= 1.0, (ks, last)


def test_idle_cells_around_the_k_find_a_dear_top_k_that_traffic_alone_keeps():
    dear = DISTORTIONS["K=4, 5 20, 30 % dear"]
    ks_alone, last_alone = one_request_rounds(LINE, dear, 0.9, idle=False)
    ks_idle, last_idle = one_request_rounds(LINE, dear, 0.9, idle=True)
    assert len(set(ks_alone)) == 1 and ks_alone[0] >= 4 and last_alone < 0.95, (ks_alone, last_alone)
    assert ks_idle[-1] < ks_alone[-1] and last_idle > last_alone, (ks_idle, last_idle)
