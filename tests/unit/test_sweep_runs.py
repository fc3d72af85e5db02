"""The sweep's pure parts, as tables: policy names, K needed, acceptance per text, the median run,
the window rate with prorated edge steps, where a level's step time goes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine_adapter.measure.sweep_runs import (
    Policy,
    Run,
    acceptance_per_text,
    k_needed,
    off_rates,
    parse_policy,
    row_from_runs,
    speedup_columns,
    window_rate,
)
from engine_adapter.policy.controller import PolicySpec
from engine_adapter.records import EngineStep, RequestResult, Step

TABLE = [(1, 2, 3), (3, 64, 0)]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("off", Policy("off", None)),
        ("k1", Policy("k1", PolicySpec("fixed", 1))),
        ("k5", Policy("k5", PolicySpec("fixed", 5))),
        ("table", Policy("table", PolicySpec("table", table=TABLE))),
        ("auto", Policy("auto", PolicySpec("auto"))),
        ("auction", Policy("auction", PolicySpec("auction"))),
        ("kx", "unknown policy"),
        ("fast", "unknown policy"),
    ],
)
def test_parse_policy(name, expected):
    if isinstance(expected, Policy):
        assert parse_policy(name, TABLE) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_policy(name, TABLE)


def test_table_policy_needs_a_table():
    with pytest.raises(ValueError, match="needs --table"):
        parse_policy("table", None)


@pytest.mark.parametrize(
    "names, k_max, expected",
    [
        (["off", "k1", "k3"], 5, 3),
        (["k1", "auto"], 5, 5),
        (["table"], 2, 3),  # the table asks for K=3
        (["off"], 4, 4),
    ],
)
def test_the_live_engine_drafts_as_far_as_any_policy_asks(names, k_max, expected):
    assert k_needed([parse_policy(n, TABLE) for n in names], k_max) == expected


def _result(prompt: str, steps: list[tuple[int, int]]) -> RequestResult:
    """A request whose steps verified (drafted, accepted) drafts."""
    return RequestResult(
        request_id="r",
        prompt=prompt,
        text="",
        token_ids=[],
        kinds=[],
        provenance=None,
        steps=[
            Step(index=i, t=0.0, wall_s=0.0, batch_size=1, k=d, drafted=None, num_drafted=d, accepted=a, emitted=[])
            for i, (d, a) in enumerate(steps)
        ],
        spec_decode_metrics=None,
        tap_metrics=None,
        finish_reason="length",
        num_prompt_tokens=1,
        t_start=0.0,
        t_first_token=None,
        t_end=0.0,
    )


# "a" keeps both drafts, "b" rejects its first: pooled over 1 a + 1 b the first
# position is 1/2; over 3 a + 1 b it would read 3/4, so per text it stays 1/2
@pytest.mark.parametrize(
    "results, expected",
    [
        ([], []),
        ([_result("a", [(0, 0)])], []),  # the prefill step drafts nothing
        ([_result("a", [(2, 2)]), _result("b", [(2, 0)])], [0.5, 1.0]),
        ([_result("a", [(2, 2)])] * 3 + [_result("b", [(2, 0)])], [0.5, 1.0]),
        ([_result("a", [(3, 1), (3, 3)])], [1.0, 0.5, 1.0]),  # 2 kept of 2, 1 of 2, 1 of 1
        ([_result("a", [(2, 1)]), _result("a", [(2, 2)])], [1.0, 0.5]),  # a's two requests averaged
    ],
    ids=["none", "no-drafts", "one-each", "repeated-text", "positions", "same-text-differs"],
)
def test_acceptance_per_text_weighs_each_prompt_once(results, expected):
    assert acceptance_per_text(results) == pytest.approx(expected)


@pytest.mark.parametrize(
    "tps, median, lo, hi",
    [
        ([12.0], 12.0, 12.0, 12.0),
        ([10.0, 30.0, 20.0], 20.0, 10.0, 30.0),  # the median run, not the best or the mean of outliers
        ([10.0, 14.0], 12.0, 10.0, 14.0),
    ],
)
def test_a_level_reports_the_median_run(tps, median, lo, hi):
    runs = [
        Run(
            {"tokens_per_s": t, "per_request_tokens_per_s": t / 2, "measured_s": 20.0 + t}, [], [_result("a", [(2, 1)])]
        )
        for t in tps
    ]
    row = row_from_runs(runs)
    assert (row["total_tokens_per_s"], row["total_tokens_per_s_min"], row["total_tokens_per_s_max"]) == (median, lo, hi)
    assert row["per_request_tokens_per_s"] == median / 2 and row["runs"] == len(tps)
    assert row["measured_s"] == 20.0 + median
    assert row["acceptance_per_position_per_text"] == "1.0000 0.0000"


def _engine_step(t: float, interval_s: float, emitted: int) -> EngineStep:
    return EngineStep(
        seq=0,
        t=t,
        wall_s=interval_s,
        interval_s=interval_s,
        batch_size=emitted,
        k=0,
        num_tokens=emitted,
        num_drafted=0,
        num_accepted=0,
        num_emitted=emitted,
        accepted_per_pos=(),
        reached_per_pos=(),
        num_drafting=0,
        tap_s=0.0,
    )


@pytest.mark.parametrize(
    "steps, window, rate",
    [
        ([], (10.0, 30.0), 0.0),
        # 16 tokens per 0.6 s step: the edge steps count by their share inside the window
        ([(10.3, 0.6, 16), (10.9, 0.6, 16), (11.5, 0.6, 16), (12.1, 0.6, 16)], (10.0, 12.0), 16 / 0.6),
        # a long step still running at the window's end counts for the time it took inside
        ([(10.5, 0.5, 8), (11.0, 0.5, 8), (19.0, 8.0, 16)], (10.0, 13.0), (8 + 8 + 16 * 2 / 8) / 3),
        # an idle gap is part of the next step's interval: it dilutes the rate, as it should
        ([(11.0, 1.0, 4), (14.0, 3.0, 4)], (10.0, 14.0), 8 / 4),
        ([(9.0, 1.0, 4), (15.0, 0.5, 4)], (10.0, 14.0), 0.0),  # wholly outside
    ],
)
def test_window_rate_prorates_the_edge_steps(steps, window, rate):
    assert window_rate([_engine_step(*s) for s in steps], *window) == pytest.approx(rate)


@pytest.mark.parametrize(
    "steps, batch, step_s, tap_s",
    [
        ([], 0.0, 0.0, 0.0),
        ([(4, 0.20, 0.001)], 4.0, 0.2, 0.001),
        ([(16, 0.60, 0.002), (8, 0.40, 0.004)], 12.0, 0.5, 0.003),  # pooled over steps, not weighted by batch
    ],
)
def test_a_level_reports_where_its_step_time_goes(steps, batch, step_s, tap_s):
    run = Run(
        {"tokens_per_s": 1.0, "per_request_tokens_per_s": 1.0, "measured_s": 20.0},
        [replace(_engine_step(1.0, w, b), wall_s=w, tap_s=t) for b, w, t in steps],
        [],
    )
    row = row_from_runs([run])
    assert (row["mean_batch_size"], row["mean_step_s"], row["mean_tap_s"]) == pytest.approx((batch, step_s, tap_s))


def _timed(prompt: str, tokens: int, seconds: float) -> RequestResult:
    """A request that emitted ``tokens`` tokens in ``seconds``."""
    return replace(_result(prompt, []), token_ids=[1] * tokens, t_end=seconds)


def test_each_request_is_compared_with_plain_decoding_on_its_own_prompt():
    plain = [_timed("code", 10, 1.0), _timed("code", 10, 2.0), _timed("code", 10, 3.0), _timed("story", 10, 1.0)]
    off = off_rates(plain)
    assert off == {"code": 5.0, "story": 10.0}  # the median per prompt
    # code at 10 tokens/s (2x its plain 5), story at 8 (0.8x its plain 10), a prompt off never ran
    got = speedup_columns([_timed("code", 20, 2.0), _timed("story", 8, 1.0), _timed("math", 1, 1.0)], off)
    assert got["speedup_min"] == 0.8 and got["speedup_max"] == 2.0 and got["speedup_median"] == 1.4
    assert got["below_plain_share"] == 0.5
    assert got["speedup_jain_index"] == pytest.approx((2.8**2) / (2 * (4 + 0.64)), abs=1e-4)
    assert speedup_columns([_timed("code", 20, 2.0)], {}) == {}  # no off in the sweep: no columns
