"""The idle drafter's catch-up (engine_adapter/vllm_plugin/catch_up.py): the first pass's inputs, rewritten."""

from __future__ import annotations

import numpy as np
import pytest

from engine_adapter.engine.tap_receiver import summarize
from engine_adapter.vllm_plugin.catch_up import (
    Missed,
    MissedRange,
    prepend_catch_up,
    select_within_budget,
    update_missed,
)
from engine_adapter.vllm_plugin.wire import TapRequestStep
from tests.support.tap_records import tap_step

# A first pass of three requests, as vLLM's padded drafter batch lays it out:
# r0 a decode with 2 drafts at positions 10-12, r1 a decode at 20, r2 a prefill chunk at 0-3.
# A token's id is 100 * (request + 1) + its position, so every id says where it belongs.
POSITIONS = np.array([10, 11, 12, 20, 0, 1, 2, 3], dtype=np.int64)
REQUEST = np.array([0, 0, 0, 1, 2, 2, 2, 2])
TOKEN_IDS = (100 * (REQUEST + 1) + POSITIONS).astype(np.int32)
QSL = np.array([0, 3, 4, 8], dtype=np.int32)


def ids_at(request: int, start: int, stop: int) -> list[int]:
    return [100 * (request + 1) + p for p in range(start, stop)]


def missed_range(request: int, start: int, stop: int, since_step: int = 0) -> MissedRange:
    return MissedRange(start, ids_at(request, start, stop), since_step)


def run(missed, budget):
    return prepend_catch_up(TOKEN_IDS, POSITIONS, QSL, missed, budget)


def check_invariants(out, missed) -> None:
    """What every rewrite keeps: cumulative starts, contiguous positions, the given ids in front."""
    qsl = out.query_start_loc
    assert qsl[0] == 0 and qsl[-1] == out.num_actual_tokens == len(out.token_ids) == len(out.positions)
    assert list(np.diff(qsl)) == list(np.diff(QSL) + out.caught_up)
    assert out.max_query_len == int(np.diff(qsl).max())
    for i in range(len(qsl) - 1):
        seg = out.positions[qsl[i] : qsl[i + 1]]
        assert np.all(np.diff(seg) == 1), f"request {i}: positions {seg} not contiguous"
        c = int(out.caught_up[i])
        if c:
            assert seg[0] == missed[i].start
            assert list(out.token_ids[qsl[i] : qsl[i] + c]) == list(missed[i].token_ids)
        # the rest is the request's own segment, unchanged
        assert list(out.token_ids[qsl[i] + c : qsl[i + 1]]) == list(TOKEN_IDS[QSL[i] : QSL[i + 1]])
    old = out.source_index >= 0
    assert list(out.token_ids[old]) == list(TOKEN_IDS) and list(out.positions[old]) == list(POSITIONS)
    assert int((~old).sum()) == int(out.caught_up.sum())


def test_no_one_missed_is_the_identity():
    out = run([None, None, None], budget=64)
    assert list(out.token_ids) == list(TOKEN_IDS)
    assert list(out.positions) == list(POSITIONS)
    assert list(out.query_start_loc) == list(QSL)
    assert (out.max_query_len, out.num_actual_tokens, out.deferred) == (4, 8, ())
    assert list(out.caught_up) == [0, 0, 0]
    assert list(out.source_index) == list(range(8))


def test_one_request_missed_three_tokens():
    missed = [None, missed_range(1, 17, 20), None]
    out = run(missed, budget=8)
    assert list(out.token_ids) == [110, 111, 112, 217, 218, 219, 220, 300, 301, 302, 303]
    assert list(out.positions) == [10, 11, 12, 17, 18, 19, 20, 0, 1, 2, 3]
    assert list(out.query_start_loc) == [0, 3, 7, 11]
    assert (out.max_query_len, out.num_actual_tokens, out.deferred) == (4, 11, ())
    assert list(out.caught_up) == [0, 3, 0]
    assert list(out.source_index) == [0, 1, 2, -1, -1, -1, 3, 4, 5, 6, 7]
    check_invariants(out, missed)


@pytest.mark.parametrize(
    "budget, caught_up, deferred",
    [
        (8, [5, 3, 0], ()),  # both fit
        (5, [5, 0, 0], (1,)),  # the older hole (r0) first; nothing left for r1
        (4, [0, 3, 0], (0,)),  # r0's 5 do not fit at all: r1's 3 do (first fit, not first come)
        (2, [0, 0, 0], (0, 1)),  # neither fits: both keep their holes
    ],
)
def test_two_requests_over_budget_fall_back_to_holes(budget, caught_up, deferred):
    missed = [missed_range(0, 5, 10, since_step=3), missed_range(1, 17, 20, since_step=7), None]
    out = run(missed, budget)
    assert list(out.caught_up) == caught_up
    assert out.deferred == deferred
    check_invariants(out, missed)


def test_a_budget_of_zero_changes_nothing_and_defers_every_hole():
    missed = [missed_range(0, 9, 10), None, missed_range(2, 0, 0)]  # r2's range is empty: nothing to do
    out = run(missed, budget=0)
    assert list(out.token_ids) == list(TOKEN_IDS) and list(out.query_start_loc) == list(QSL)
    assert out.deferred == (0,)
    assert list(out.caught_up) == [0, 0, 0]


def test_the_input_dtypes_are_kept():
    out = run([missed_range(0, 8, 10), None, None], budget=4)
    assert (out.token_ids.dtype, out.positions.dtype, out.query_start_loc.dtype) == (np.int32, np.int64, np.int32)
    assert out.caught_up.dtype == np.int64 and out.source_index.dtype == np.int64


@pytest.mark.parametrize("seed", range(6))
def test_random_tables_keep_the_invariants(seed):
    rng = np.random.default_rng(seed)
    stops = [10, 20, 0]  # each request's segment starts there
    missed = []
    for i, stop in enumerate(stops):
        n = int(rng.integers(0, stop + 1))
        missed.append(None if n == 0 else missed_range(i, stop - n, stop, since_step=int(rng.integers(0, 4))))
    budget = int(rng.integers(0, 24))
    out = run(missed, budget)
    check_invariants(out, missed)
    lengths = [0 if m is None else len(m) for m in missed]
    assert sum(out.caught_up) <= budget
    assert all(c in (0, n) for c, n in zip(out.caught_up, lengths))  # whole ranges only


@pytest.mark.parametrize(
    "missed, budget, message",
    [
        ([None, missed_range(1, 16, 19), None], 8, "does not end just before"),  # a gap before the segment
        ([None, missed_range(1, 17, 21), None], 8, "does not end just before"),  # overlaps the segment
        ([None, None], 8, "entries for 3 requests"),
        ([None, None, None], -1, "budget must be >= 0"),
        ([None, MissedRange(-1, [7]), None], 8, "negative position"),
    ],
)
def test_a_broken_contract_is_refused(missed, budget, message):
    with pytest.raises(ValueError, match=message):
        run(missed, budget)


def test_a_query_start_loc_that_does_not_cover_the_tokens_is_refused():
    with pytest.raises(ValueError, match="cumulative"):
        prepend_catch_up(TOKEN_IDS, POSITIONS, [0, 3, 4, 7], [None, None, None], 8)


def test_selection_is_oldest_first_then_batch_order():
    assert select_within_budget([2, 2, 2], [5, 1, 1], 4) == [False, True, True]
    assert select_within_budget([3, 0, 1], [0, 0, 0], 3) == [True, False, False]


# --- the bookkeeping across steps -------------------------------------------------------------
def test_a_hole_opens_grows_is_deferred_and_is_caught_up():
    # step 5, K=0: segment 10..13 (the input and 3 drafts proposed at the last K>0 step)
    m = update_missed(None, segment_start=10, num_scheduled=4, drafter_ran=False, caught_up=False, step=5)
    assert m == Missed(10, 13, 5)
    # step 6, K=0: one draft was accepted, so the segment starts at 12: last is refreshed, then grows
    m = update_missed(m, segment_start=12, num_scheduled=1, drafter_ran=False, caught_up=False, step=6)
    assert m == Missed(10, 12, 5)
    # step 7, K>0 but over budget: the hole stays, 10..12
    m = update_missed(m, segment_start=13, num_scheduled=1, drafter_ran=True, caught_up=False, step=7)
    assert m == Missed(10, 12, 5) and m.count == 3
    # step 8: what step 7 wrote read the hole, so the range reaches the new segment (15)
    assert m.refreshed(15) == Missed(10, 14, 5)
    assert update_missed(m, segment_start=15, num_scheduled=4, drafter_ran=True, caught_up=True, step=8) is None


def test_no_hole_stays_none_when_the_drafter_runs():
    assert update_missed(None, segment_start=7, num_scheduled=1, drafter_ran=True, caught_up=False, step=1) is None


def test_a_request_recomputed_from_before_its_hole_has_none():
    m = Missed(40, 44, 2)
    assert m.refreshed(40) is None and m.refreshed(12) is None
    assert update_missed(m, segment_start=12, num_scheduled=30, drafter_ran=True, caught_up=False, step=9) is None
    # recomputed in a K=0 step: a new hole at the new segment, keeping its place in the order
    assert update_missed(m, segment_start=12, num_scheduled=30, drafter_ran=False, caught_up=False, step=9) == Missed(
        12, 41, 2
    )


def test_nothing_is_caught_up_in_a_skipped_step():
    with pytest.raises(ValueError, match="skipped"):
        update_missed(Missed(3, 4, 0), segment_start=5, num_scheduled=1, drafter_ran=False, caught_up=True, step=1)


def test_the_range_reads_the_requests_own_ids():
    row = np.arange(1000, 1030, dtype=np.int32)  # token_ids_cpu row: position p holds 1000 + p
    r = Missed(17, 19, 4).as_range(row)
    assert (r.start, list(r.token_ids), r.since_step, len(r)) == (17, [1017, 1018, 1019], 4, 3)


@pytest.mark.parametrize(
    "rows, accepted_per_pos, reached_per_pos, totals",
    [
        # (drafted, accepted, drafted_across) per request
        ([(3, 3, False), (3, 1, False)], (2, 1, 1), (2, 2, 1), (6, 4)),
        # drafts across a hole count in the totals (vLLM's own), not per position
        ([(3, 3, False), (3, 0, True)], (1, 1, 1), (1, 1, 1), (6, 3)),
        ([(2, 1, True)], (), (), (2, 1)),
    ],
)
def test_the_tap_summary_leaves_drafts_across_a_hole_out_of_the_per_position_counts(
    rows, accepted_per_pos, reached_per_pos, totals
):
    reqs = [
        TapRequestStep(
            engine_request_id=f"cmpl-r{i}-0-1a2b3c4d",
            drafted=list(range(n)),
            accepted=a,
            emitted=[0] * (a + 1),
            finish_reason=None,
            num_prompt_tokens=10,
            num_drafted=n,
            drafter_idle=True,
            drafted_across=across,
        )
        for i, (n, a, across) in enumerate(rows)
    ]
    s = summarize(tap_step(batch_size=len(rows), k=3, num_tokens=4 * len(rows), reqs=reqs))
    assert (s.accepted_per_pos, s.reached_per_pos) == (accepted_per_pos, reached_per_pos)
    assert (s.num_drafted, s.num_accepted) == totals
