"""Pure tests of engine_adapter.provenance: token kinds, vLLM's per-request
metrics, per-position acceptance and the attach-mode step reconstruction."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

from engine_adapter.acceptance import alpha_from_histogram, per_position_acceptance
from engine_adapter.provenance import (
    drafted_across_hole,
    kinds_for_step,
    metrics_from_histogram,
    metrics_from_steps,
    steps_from_counts,
)
from engine_adapter.records import Step

# --- kinds_for_step ---------------------------------------------------------

KINDS_CASES = [
    # (step_index, num_drafted, accepted, num_emitted, expected)
    pytest.param(0, 0, 0, 1, ["prefill"], id="prefill"),
    pytest.param(5, 0, 0, 1, ["plain"], id="plain"),
    pytest.param(1, 0, 0, 1, ["plain"], id="plain-first-decode"),
    pytest.param(3, 3, 3, 4, ["accepted"] * 3 + ["bonus"], id="full-accept-K3"),
    pytest.param(3, 1, 1, 2, ["accepted", "bonus"], id="full-accept-K1"),
    pytest.param(3, 3, 0, 1, ["recovered"], id="mismatch-at-position-1"),
    pytest.param(3, 5, 2, 3, ["accepted", "accepted", "recovered"], id="mismatch-at-position-3"),
    pytest.param(3, 5, 4, 5, ["accepted"] * 4 + ["recovered"], id="mismatch-at-last-position"),
    pytest.param(3, 3, 3, 2, ["accepted", "accepted"], id="stop-cuts-full-accept"),
    pytest.param(3, 3, 3, 3, ["accepted"] * 3, id="stop-drops-bonus-only"),
    pytest.param(3, 3, 1, 1, ["accepted"], id="stop-drops-recovered"),
    pytest.param(3, 3, 2, 0, [], id="zero-emitted-spec"),
    pytest.param(0, 0, 0, 0, [], id="zero-emitted-prefill"),
    pytest.param(4, 0, 0, 0, [], id="zero-emitted-plain"),
]


@pytest.mark.parametrize("index, drafted, accepted, emitted, expected", KINDS_CASES)
def test_kinds_for_step(index, drafted, accepted, emitted, expected):
    assert kinds_for_step(index, drafted, accepted, emitted) == expected


# --- vLLM's documented example ------------------------------------------------

VLLM_HISTOGRAM = [39, 1, 0, 3]
VLLM_STEPS = [(3, 0)] * 39 + [(3, 1)] + [(3, 3)] * 3  # realises the histogram, 129 drafted


def test_vllm_example_from_histogram():
    m = metrics_from_histogram(VLLM_HISTOGRAM, 129)
    assert m.mean_acceptance_length == pytest.approx(1.2326, abs=5e-5)
    assert m.draft_acceptance_rate == pytest.approx(0.0775, abs=5e-5)
    assert m.num_spec_steps == 43
    assert m.num_accepted_draft_tokens == 10
    assert m.num_draft_tokens == 129
    assert m.num_spec_tokens == 3
    assert m.acceptance_histogram == VLLM_HISTOGRAM
    assert alpha_from_histogram(VLLM_HISTOGRAM, 3) == pytest.approx(0.20)


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(VLLM_STEPS, id="spec-only"),
        pytest.param([(0, 0)] + VLLM_STEPS[:20] + [(0, 0)] * 5 + VLLM_STEPS[20:] + [(0, 0)], id="with-undrafted-steps"),
    ],
)
def test_vllm_example_from_steps_agrees(steps):
    from_steps = metrics_from_steps(steps, 3)
    from_hist = metrics_from_histogram(VLLM_HISTOGRAM, 129)
    d_steps, d_hist = from_steps.to_dict(), from_hist.to_dict()
    assert d_steps.pop("per_step_accepted") == [a for _, a in VLLM_STEPS]
    assert d_steps.pop("per_step_drafted") == [3] * 43
    assert d_steps == d_hist  # every summary field, steps with no draft not counted


# --- metrics_from_steps == vLLM's RequestSpecDecodeMetrics ----------------------


def _dynamic_k_steps(seed: int, k: int, n: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        d = rng.randint(0, k)  # dynamic K: 0..K drafted, 0 = plain step
        out.append((d, rng.randint(0, d)))
    return out


VLLM_AGREE_CASES = [
    pytest.param([], 3, id="empty"),
    pytest.param([(0, 0)] * 6, 3, id="all-undrafted"),
    pytest.param([(3, 0)] * 4, 3, id="all-rejected"),
    pytest.param([(3, 3), (3, 0), (3, 1), (0, 0), (3, 2), (3, 3)], 3, id="mixed-K3"),
    pytest.param([(1, 1), (1, 0), (1, 1), (0, 0), (1, 1)], 1, id="K1"),
    pytest.param([(5, 5), (2, 1), (4, 4), (0, 0), (1, 0), (5, 2), (3, 3)], 5, id="K5-variable-drafted"),
    pytest.param(_dynamic_k_steps(7, 5, 200), 5, id="K5-dynamic-random"),
    pytest.param(_dynamic_k_steps(11, 8, 50), 8, id="K8-dynamic-random"),
]


@pytest.mark.parametrize("steps, k", VLLM_AGREE_CASES)
def test_metrics_from_steps_equals_vllm(steps, k):
    theirs = RequestSpecDecodeMetrics.new(k)
    for num_drafted, accepted in steps:
        if num_drafted:  # vLLM's scheduler observes only steps that verified drafts
            theirs.observe(num_drafted, accepted, detailed=True)
    assert metrics_from_steps(steps, k).to_dict() == theirs.to_dict()


# --- per_position_acceptance ---------------------------------------------------

PER_POS_CASES = [
    # (per_step_accepted, per_step_drafted, k, expected)
    pytest.param([], [], 3, [None, None, None], id="no-steps"),
    pytest.param([3], [3], 3, [1.0, 1.0, 1.0], id="one-full-accept"),
    pytest.param([0], [3], 3, [0.0, None, None], id="one-reject-at-1"),
    pytest.param([1], [3], 3, [1.0, 0.0, None], id="reject-at-2"),
    pytest.param([0, 3, 1, 2], [3, 3, 3, 3], 3, [3 / 4, 2 / 3, 1 / 2], id="mixed"),
    pytest.param([2], [2], 3, [1.0, 1.0, None], id="short-draft-never-reaches-3"),
    pytest.param([1, 1], [1, 3], 3, [1.0, 0.0, None], id="variable-drafted"),
    pytest.param([3, 3], [3, 3], 2, [1.0, 1.0], id="k-smaller-than-drafted"),
]


@pytest.mark.parametrize("accepted, drafted, k, expected", PER_POS_CASES)
def test_per_position_acceptance(accepted, drafted, k, expected):
    got = per_position_acceptance(accepted, drafted, k)
    assert len(got) == k
    for g, e in zip(got, expected):
        assert (g is None) if e is None else g == pytest.approx(e)


# --- steps_from_counts -----------------------------------------------------------

P = (0, 0, 1)  # a plain step; also the prefill step (always first)

STEPS_CASES = [
    # (chunk_sizes, per_step_accepted, per_step_drafted, expected steps, exact)
    pytest.param([], [], [], [], True, id="empty"),
    pytest.param([1], [], [], [P], True, id="prefill-only"),
    pytest.param(
        [1, 4, 1, 3], [3, 0, 2], [3, 3, 3], [P, (3, 3, 4), (3, 0, 1), (3, 2, 3)], True, id="no-plain-unmerged"
    ),
    pytest.param(
        [5, 4], [3, 0, 2], [3, 3, 3], [P, (3, 3, 4), (3, 0, 1), (3, 2, 3)], True, id="no-plain-merged-arrays-exact"
    ),
    pytest.param(
        [1, 4, 1, 2], [3, 0, 2], [3, 3, 3], [P, (3, 3, 4), (3, 0, 1), (3, 2, 2)], True, id="no-plain-last-cut-by-stop"
    ),
    pytest.param(
        [1, 4, 1, 1], [3, 0, 3], [3, 3, 3], [P, (3, 3, 4), (3, 0, 1), (3, 3, 1)], True, id="no-plain-last-cut-to-1"
    ),
    pytest.param([7], [3, 2], [3, 3], [P, (3, 3, 4), (3, 2, 2)], True, id="no-plain-merged-last-cut"),
    pytest.param(
        [1, 1, 4, 1, 3, 1], [3, 2], [3, 3], [P, P, (3, 3, 4), P, (3, 2, 3), P], True, id="plain-interleaved-unmerged"
    ),
    pytest.param(
        [1, 1, 1, 3], [0, 2], [2, 2], [P, (2, 0, 1), P, (2, 2, 3)], True, id="plain-and-reject-ambiguous-spec-first"
    ),
    pytest.param([1, 1, 1, 2], [3], [3], [P, P, P, (3, 3, 2)], True, id="plain-then-last-cut-by-stop"),
    pytest.param([1, 1, 1], [3], [3], [P, P, (3, 3, 1)], True, id="plain-then-last-cut-to-1"),
    pytest.param([1, 1, 1, 1], [], [], [P, P, P, P], True, id="all-plain"),
    # prefill+plain | spec+plain | spec merged: no one-chunk-per-step alignment
    pytest.param(
        [2, 5, 3], [3, 2], [3, 3], [P, (3, 3, 4), (3, 2, 3), P, P], False, id="plain-with-merged-chunks-inexact"
    ),
    pytest.param([1, 6, 2], [1, 3], [3, 3], [P, (3, 1, 2), (3, 3, 4), P, P], False, id="merged-two-plain-inexact"),
]


@pytest.mark.parametrize("chunks, accepted, drafted, expected, exact", STEPS_CASES)
def test_steps_from_counts(chunks, accepted, drafted, expected, exact):
    steps, got_exact = steps_from_counts(chunks, accepted, drafted)
    assert sum(n for _, _, n in steps) == sum(chunks)
    assert got_exact is exact
    assert steps == expected
    # the spec steps always come back in vLLM's order
    assert [(d, a) for d, a, _ in steps if d] == list(zip(drafted, accepted))


def _random_request(rng: random.Random, k: int, n: int, cut: bool):
    """True steps after the prefill: (num_drafted, accepted, num_emitted)."""
    steps = []
    for _ in range(n):
        d = rng.choice([0, 0, rng.randint(1, k)])  # plenty of plain steps
        a = rng.randint(0, d)
        steps.append((d, a, a + 1 if d else 1))
    if cut and steps and steps[-1][0] and steps[-1][1] > 0:
        d, a, _ = steps[-1]
        steps[-1] = (d, a, rng.randint(1, a))  # a stop cuts the last step short
    return steps


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("cut", [False, True], ids=["uncut", "last-cut"])
def test_steps_from_counts_random_unmerged(seed, cut):
    rng = random.Random(seed)
    k = rng.randint(1, 6)
    truth = [P] + _random_request(rng, k, rng.randint(0, 40), cut)
    chunks = [n for _, _, n in truth]  # one chunk per step (the prefill token is chunk 0)
    spec = [(d, a) for d, a, _ in truth if d]
    got, exact = steps_from_counts(chunks, [a for _, a in spec], [d for d, _ in spec])
    assert exact
    # A plain step and a spec step that accepted 0 both emit one token, so the two
    # can trade places; everything else is recovered exactly:
    assert [n for _, _, n in got] == chunks  # every step's token count, in order
    assert [(d, a) for d, a, _ in got if d] == spec  # the spec steps, in order
    assert Counter(got) == Counter(truth)  # the same steps
    assert got[0] == P
    for g, t in zip(got, truth):  # steps that emitted > 1 token sit exactly where they were
        if t[2] > 1:
            assert g == t


@pytest.mark.parametrize(
    "steps, across",
    [
        # (num_drafted, drafter_idle, caught_up) per step
        ([(0, False, 0), (3, False, 0)], set()),  # no hole
        ([(0, True, 0), (0, True, 0), (3, True, 0)], {2}),  # drafts proposed after step 1, across its hole
        ([(0, True, 0), (0, False, 2), (3, False, 0)], set()),  # caught up at step 1: clean drafts at step 2
        ([(3, True, 0), (0, True, 0)], set()),  # the hole opened at step 0 after its drafts were verified
        ([(0, True, 0), (0, True, 0)], set()),  # a hole, no drafts
    ],
)
def test_drafted_across_hole(steps, across):
    records = [
        Step(i, float(i), 0.0, 1, n, None, n, 0, [1], drafter_idle=idle, caught_up=cu)
        for i, (n, idle, cu) in enumerate(steps)
    ]
    assert drafted_across_hole(records) == across
