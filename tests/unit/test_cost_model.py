"""The cost model where steps are padded to CUDA-graph capture sizes: pure, no engine.

A step of n tokens runs the graph of the smallest captured size >= n and costs what it costs; past
the largest it runs unpadded. Without capture sizes (CPU, eager) the model is the plain hinge
(``test_k_policy.py`` holds that fit).
"""

from __future__ import annotations

import json

import pytest

from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model, padded_tokens

SIZES = (8, 16, 32, 64)  # captured step sizes, tokens
VLLM_LIKE = tuple(range(8, 513, 8))  # every 8th up to 512, as vLLM captures past 4


@pytest.mark.parametrize(
    "num_tokens, sizes, padded",
    [
        (1, SIZES, 8),
        (8, SIZES, 8),  # on a captured size: no padding
        (9, SIZES, 16),
        (33, SIZES, 64),
        (64, SIZES, 64),
        (65, SIZES, 65),  # past the largest: no graph, unpadded
        (1000, SIZES, 1000),
        (5, (), 5),  # nothing captured (CPU, eager)
    ],
)
def test_padded_tokens(num_tokens, sizes, padded):
    assert padded_tokens(num_tokens, sizes) == padded


GRAPHS = CostModel(base_s=0.010, slope_s=0.001, knee_tokens=0, capture_sizes=SIZES)


@pytest.mark.parametrize(
    "same_cost",
    [
        [(9, 0), (3, 3), (16, 0), (4, 3), (8, 1)],  # 9..16 tokens: the 16-token graph
        [(17, 0), (10, 2), (32, 0), (8, 3), (16, 1)],  # 17..32: the 32-token graph
        [(33, 0), (16, 3), (64, 0), (32, 1)],  # 33..64: the 64-token graph
    ],
)
def test_steps_between_two_capture_sizes_cost_the_same(same_cost):
    costs = {GRAPHS.step_s(b, k) for b, k in same_cost}
    assert len(costs) == 1
    (b, k) = same_cost[-1]
    assert GRAPHS.step_s(b, k) == pytest.approx(0.010 + 0.001 * b * (k + 1))


def test_steps_past_the_largest_capture_size_are_unpadded():
    assert GRAPHS.verify_s(65) < GRAPHS.verify_s(66) < GRAPHS.verify_s(100)
    assert GRAPHS.verify_s(66) == pytest.approx(0.010 + 0.001 * 66)
    assert GRAPHS.step_s(40, 1) == pytest.approx(0.010 + 0.001 * 80)


@pytest.mark.parametrize("num_tokens", [1, 3, 4, 5, 9, 17, 64, 65, 300])
def test_without_capture_sizes_the_hinge_is_unchanged(num_tokens):
    plain = CostModel(0.1, 0.01, 4)
    assert plain.capture_sizes == ()
    assert plain.verify_s(num_tokens) == pytest.approx(0.1 + 0.01 * max(0, num_tokens - 4))


@pytest.mark.parametrize(
    "model",
    [
        CostModel(0.1, 0.01, 4, points=(CostPoint(1, 0, 1, 0.1, 4),)),  # no capture sizes (CPU)
        CostModel(0.01, 0.0001, 256, draft_s=0.002, capture_sizes=VLLM_LIKE, points=(CostPoint(4, 3, 16, 0.01, 4),)),
    ],
)
def test_the_model_round_trips_through_json(model):
    assert CostModel.from_dict(model.to_dict()) == model
    assert CostModel.from_dict(json.loads(json.dumps(model.to_dict()))) == model  # lists back to tuples
    hash(CostModel.from_dict(json.loads(json.dumps(model.to_dict()))))  # the live policy keys previews by it


def test_a_model_saved_before_capture_sizes_loads_unpadded():
    saved = CostModel(0.1, 0.01, 4, points=(CostPoint(1, 0, 1, 0.1, 4),)).to_dict()
    del saved["capture_sizes"]  # a cache file written before the key existed
    loaded = CostModel.from_dict(saved)
    assert loaded.capture_sizes == () and loaded == CostModel.from_dict(loaded.to_dict())


def test_capture_sizes_are_kept_sorted_and_unique():
    assert CostModel(0.1, 0.0, 0, capture_sizes=[32, 8, 16, 8]).capture_sizes == (8, 16, 32)


# a GPU-like truth with a knee at 64 tokens; cells off the graphs (b = 3, 5, 12, 20, 100) pad up
TRUTH = CostModel(0.010, 0.0002, 64, draft_s=0.002, draft_s_per_req=0.00001, capture_sizes=VLLM_LIKE)
CELLS = [(b, k) for b in (1, 3, 5, 12, 16, 20, 100) for k in (0, 1, 3, 5)]


def _measured(truth: CostModel) -> list[CostPoint]:
    """Cells as the profiler records them: the tokens scheduled (unpadded), the padded step's time."""
    return [CostPoint(b, k, b * (k + 1), truth.fit_step_s(b, k), 5) for b, k in CELLS]


def test_the_fit_reads_padded_token_counts():
    fit = fit_cost_model(_measured(TRUTH), drafter_runs_model=True, capture_sizes=VLLM_LIKE)
    assert fit.capture_sizes == VLLM_LIKE and fit.rmse_s < 1e-7
    assert fit.knee_tokens == pytest.approx(64)
    for b, k in CELLS + [(7, 2), (50, 4)]:
        assert fit.step_s(b, k) == pytest.approx(TRUTH.step_s(b, k), rel=1e-4)
    unpadded = fit_cost_model(_measured(TRUTH), drafter_runs_model=True)  # the same cells, padding ignored
    assert unpadded.capture_sizes == () and unpadded.rmse_s > 100 * fit.rmse_s
