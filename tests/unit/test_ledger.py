"""The ledger's arithmetic on synthetic steps with a known plain step time: each request's
predictability, drafts granted, tokens per step and speedup over plain decoding; Jain's index;
the accepted drafts per task kind; owners from request ids; the trace keeps the rows."""

from __future__ import annotations

import pytest

from engine_adapter.ledger import accepted_by_kind, jain_index, ledger_rows, request_owner
from engine_adapter.records import EngineStep, RequestInStep, load_request_id, load_request_kind, profile_request_id
from engine_adapter.service.history import EngineHistory
from engine_adapter.trace.format import engine_step_from_line, engine_step_line

CODE = load_request_id("code")
STORY = load_request_id("story")
MINE = "a1b2c3"
OTHER = "d4e5f6"
PROFILE = profile_request_id("b1r0")


def plain_s(batch_size: int) -> float:
    return 0.1 + 0.01 * batch_size  # a known plain step time: 0.12 s at 2 requests


def step(t: float, interval_s: float, *rows: RequestInStep, prefill: int = 0) -> EngineStep:
    tokens = sum(1 + r.num_drafted for r in rows) + prefill
    return EngineStep(
        seq=int(t * 10),
        t=t,
        wall_s=interval_s,
        interval_s=interval_s,
        batch_size=len(rows),
        k=max((r.num_drafted for r in rows), default=0),
        num_tokens=tokens,
        num_drafted=sum(r.num_drafted for r in rows),
        num_accepted=sum(r.num_accepted for r in rows),
        num_emitted=sum(r.num_emitted for r in rows),
        accepted_per_pos=(),
        reached_per_pos=(),
        num_drafting=sum(1 for r in rows if r.num_drafted),
        tap_s=0.0,
        requests=rows,
    )


def req(rid: str, drafted: int, accepted: int, across: bool = False) -> RequestInStep:
    return RequestInStep(
        request_id=rid, num_drafted=drafted, num_accepted=accepted, num_emitted=accepted + 1, drafted_across=across
    )


def test_owners_come_from_request_ids() -> None:
    assert load_request_kind(CODE) == "code" and load_request_kind(MINE) is None
    assert load_request_kind(load_request_id("")) == ""
    assert request_owner(CODE, MINE) == ("load", "code")
    assert request_owner(MINE, MINE) == ("you", "")
    assert request_owner(OTHER, MINE) == ("neighbour", "")
    assert request_owner(PROFILE, MINE) is None
    with pytest.raises(ValueError):
        load_request_id("code-1")


def test_each_request_gets_its_own_account() -> None:
    # two steps of 0.2 s each at batch size 2: code keeps all 3 drafts, story keeps 0 of 3
    steps = [step(t, 0.2, req(CODE, 3, 3), req(STORY, 3, 0)) for t in (1.0, 1.2)]
    rows = {r.request_id: r for r in ledger_rows(steps, plain_s)}
    code, story = rows[CODE], rows[STORY]
    assert (code.owner, code.kind, story.kind) == ("load", "code", "story")
    assert code.predictability == 1.0 and story.predictability == 0.0
    assert code.drafts_per_step == 3.0 and code.tokens_per_step == 4.0 and story.tokens_per_step == 1.0
    # plain decoding: 8 tokens at 0.12 s each = 0.96 s, against 0.4 s measured
    assert code.speedup == pytest.approx(0.96 / 0.4)
    assert story.speedup == pytest.approx(0.24 / 0.4)  # slowed below plain: it paid for drafts it lost
    assert code.batch_size == 2.0 and (code.first_t, code.last_t) == (1.0, 1.2)


def test_prefill_steps_count_tokens_but_not_toward_the_speedup() -> None:
    steps = [step(1.0, 5.0, req(MINE, 0, 0), prefill=50), step(1.1, 0.1, req(MINE, 2, 2))]
    (row,) = ledger_rows(steps, plain_s, own=MINE)
    assert row.owner == "you" and row.steps == 2 and row.num_emitted == 4
    assert row.decode_s == pytest.approx(0.1)
    assert row.speedup == pytest.approx(3 * 0.11 / 0.1)


def test_drafts_across_a_hole_are_granted_but_not_predictability() -> None:
    steps = [step(1.0, 0.1, req(OTHER, 3, 0, across=True)), step(1.1, 0.1, req(OTHER, 2, 1))]
    (row,) = ledger_rows(steps, plain_s)
    assert row.owner == "neighbour"
    assert row.num_drafted == 5 and row.num_reached == 2 and row.predictability == 0.5


def test_profiling_requests_and_a_missing_cost_model() -> None:
    steps = [step(1.0, 0.1, req(PROFILE, 3, 3)), step(1.1, 0.1, req(CODE, 1, 1))]
    rows = ledger_rows(steps, None)
    assert [r.request_id for r in rows] == [CODE]
    assert rows[0].speedup is None and rows[0].predictability == 1.0


@pytest.mark.parametrize(
    "values, expected",
    [([1.0, 1.0, 1.0], 1.0), ([1.0, 0.0, 0.0, 0.0], 0.25), ([2.0, 1.0], 0.9), ([], None), ([0.0, 0.0], 1.0)],
)
def test_jain_index(values: list[float], expected: float | None) -> None:
    got = jain_index(values)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_accepted_drafts_per_kind_in_time_bins() -> None:
    steps = [
        step(0.5, 0.1, req(CODE, 3, 3), req(MINE, 2, 1)),
        step(1.5, 0.1, req(CODE, 3, 2), req(STORY, 3, 1), req(OTHER, 1, 1)),
        step(1.7, 0.1, req(STORY, 3, 0, across=True)),
    ]
    got = accepted_by_kind(steps, 1.0, own=MINE)
    assert got == {
        "code": [(0.0, 3), (1.0, 2)],
        "neighbours": [(0.0, 0), (1.0, 1)],
        "story": [(0.0, 0), (1.0, 1)],
        "you": [(0.0, 1), (1.0, 0)],
    }


def test_the_trace_keeps_every_request_row() -> None:
    original = step(2.0, 0.1, req(CODE, 3, 2), req(MINE, 1, 0, across=True))
    line = engine_step_line(original, t0=0.0)
    assert line["requests"] == [[CODE, 3, 2, 3], [MINE, 1, 0, 1, 1]]
    assert engine_step_from_line(line).requests == original.requests
    assert "requests" not in engine_step_line(step(2.0, 0.1), t0=0.0)  # none: left out, as every default


def test_the_history_keeps_request_rows_for_rows_s_only() -> None:
    history = EngineHistory(history_s=10.0, rows_s=2.0)
    for i in range(60):
        history.add(step(i * 0.25, 0.25, req(CODE, 1, 1)))  # 15 s of steps, 4 a second
    steps = history.steps_since(float("-inf"))
    assert steps[0].t >= 14.75 - 10.0 and len(steps) == 41  # 10 s kept
    with_rows = [s.t for s in steps if s.requests]
    assert with_rows == [s.t for s in steps if s.t >= 14.75 - 2.0]  # rows for the last 2 s only
