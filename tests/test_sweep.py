"""The sweep CLI: policy parsing (table of cases) and one small real run."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine_adapter.policy.controller import PolicySpec
from engine_adapter.records import EngineStep, RequestResult, Step
from engine_adapter.measure.sweep_runs import COLUMNS, EXTRA_COLUMNS, Policy, Run, acceptance_per_text, k_needed, parse_policy, row_from_runs, window_rate

ROOT = Path(__file__).resolve().parent.parent
TABLE = [(1, 2, 3), (3, 64, 0)]


@pytest.mark.parametrize("name, expected", [
    ("off", Policy("off", None)),
    ("k1", Policy("k1", PolicySpec("fixed", 1))),
    ("k5", Policy("k5", PolicySpec("fixed", 5))),
    ("table", Policy("table", PolicySpec("table", table=TABLE))),
    ("auto", Policy("auto", PolicySpec("auto"))),
    ("auction", Policy("auction", PolicySpec("auction"))),
    ("kx", "unknown policy"),
    ("fast", "unknown policy"),
])
def test_parse_policy(name, expected):
    if isinstance(expected, Policy):
        assert parse_policy(name, TABLE) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_policy(name, TABLE)


def test_table_policy_needs_a_table():
    with pytest.raises(ValueError, match="needs --table"):
        parse_policy("table", None)


@pytest.mark.parametrize("names, k_max, expected", [
    (["off", "k1", "k3"], 5, 3),
    (["k1", "auto"], 5, 5),
    (["table"], 2, 3),  # the table asks for K=3
    (["off"], 4, 4),
])
def test_the_live_engine_drafts_as_far_as_any_policy_asks(names, k_max, expected):
    assert k_needed([parse_policy(n, TABLE) for n in names], k_max) == expected


def _result(prompt: str, steps: list[tuple[int, int]]) -> RequestResult:
    """A request whose steps verified (drafted, accepted) drafts."""
    return RequestResult(
        request_id="r", prompt=prompt, text="", token_ids=[], kinds=[], provenance=None,
        steps=[Step(index=i, t=0.0, wall_s=0.0, batch_size=1, k=d, drafted=None, num_drafted=d,
                    accepted=a, emitted=[]) for i, (d, a) in enumerate(steps)],
        spec_decode_metrics=None, tap_metrics=None, finish_reason="length", num_prompt_tokens=1,
        t_start=0.0, t_first_token=None, t_end=0.0)


# "a" keeps both drafts, "b" rejects its first: pooled over 1 a + 1 b the first
# position is 1/2; over 3 a + 1 b it would read 3/4, so per text it stays 1/2
@pytest.mark.parametrize("results, expected", [
    ([], []),
    ([_result("a", [(0, 0)])], []),  # the prefill step drafts nothing
    ([_result("a", [(2, 2)]), _result("b", [(2, 0)])], [0.5, 1.0]),
    ([_result("a", [(2, 2)])] * 3 + [_result("b", [(2, 0)])], [0.5, 1.0]),
    ([_result("a", [(3, 1), (3, 3)])], [1.0, 0.5, 1.0]),  # 2 kept of 2, 1 of 2, 1 of 1
    ([_result("a", [(2, 1)]), _result("a", [(2, 2)])], [1.0, 0.5]),  # a's two requests averaged
], ids=["none", "no-drafts", "one-each", "repeated-text", "positions", "same-text-differs"])
def test_acceptance_per_text_weighs_each_prompt_once(results, expected):
    assert acceptance_per_text(results) == pytest.approx(expected)


@pytest.mark.parametrize("tps, median, lo, hi", [
    ([12.0], 12.0, 12.0, 12.0),
    ([10.0, 30.0, 20.0], 20.0, 10.0, 30.0),  # the median run, not the best or the mean of outliers
    ([10.0, 14.0], 12.0, 10.0, 14.0),
])
def test_a_level_reports_the_median_run(tps, median, lo, hi):
    runs = [Run({"tokens_per_s": t, "per_request_tokens_per_s": t / 2, "measured_s": 20.0 + t}, [],
                [_result("a", [(2, 1)])]) for t in tps]
    row = row_from_runs(runs)
    assert (row["total_tokens_per_s"], row["total_tokens_per_s_min"], row["total_tokens_per_s_max"]) == (median, lo, hi)
    assert row["per_request_tokens_per_s"] == median / 2 and row["runs"] == len(tps)
    assert row["measured_s"] == 20.0 + median
    assert row["acceptance_per_position_per_text"] == "1.0000 0.0000"


def _engine_step(t: float, interval_s: float, emitted: int) -> EngineStep:
    return EngineStep(seq=0, t=t, wall_s=interval_s, interval_s=interval_s, batch_size=emitted, k=0,
                      num_tokens=emitted, num_drafted=0, num_accepted=0, num_emitted=emitted,
                      accepted_per_pos=(), reached_per_pos=(), num_drafting=0, tap_s=0.0)


@pytest.mark.parametrize("steps, window, rate", [
    ([], (10.0, 30.0), 0.0),
    # 16 tokens per 0.6 s step: the edge steps count by their share inside the window
    ([(10.3, 0.6, 16), (10.9, 0.6, 16), (11.5, 0.6, 16), (12.1, 0.6, 16)], (10.0, 12.0), 16 / 0.6),
    # a long step still running at the window's end counts for the time it took inside
    ([(10.5, 0.5, 8), (11.0, 0.5, 8), (19.0, 8.0, 16)], (10.0, 13.0), (8 + 8 + 16 * 2 / 8) / 3),
    # an idle gap is part of the next step's interval: it dilutes the rate, as it should
    ([(11.0, 1.0, 4), (14.0, 3.0, 4)], (10.0, 14.0), 8 / 4),
    ([(9.0, 1.0, 4), (15.0, 0.5, 4)], (10.0, 14.0), 0.0),  # wholly outside
])
def test_window_rate_prorates_the_edge_steps(steps, window, rate):
    assert window_rate([_engine_step(*s) for s in steps], *window) == pytest.approx(rate)


def test_sweep_cli_writes_the_csv(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def add(a, b):", "The quick"]))
    out = tmp_path / "sweep.csv"
    cmd = [sys.executable, "-m", "engine_adapter.sweep", "--concurrency", "1,2",
           "--policies", "off,k2,table,auto,auction", "--k-max", "3",
           "--table", "[[1,1,3],[2,64,0]]", "--prompts", str(prompts), "--max-tokens", "16",
           "--window-s", "3", "--out", str(out), "--target", str(tiny.target), "--draft", str(tiny.same), "--kv-cache-gib", "1"]
    env = os.environ | {"SPEC_EXPLORER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0].keys()) == COLUMNS + EXTRA_COLUMNS
    assert [(r["policy"], r["concurrency"]) for r in rows] == [
        (p, c) for p in ("off", "k2", "table", "auto", "auction") for c in ("1", "2")]
    by = {(r["policy"], int(r["concurrency"])): r for r in rows}
    assert float(by[("off", 1)]["effective_k"]) == 0
    assert float(by[("k2", 1)]["effective_k"]) == pytest.approx(2.0)
    assert float(by[("k2", 1)]["draft_acceptance_rate"]) == pytest.approx(1.0)  # draft == target
    assert by[("k2", 1)]["acceptance_per_position"] == "1.0000 1.0000"
    assert by[("k2", 2)]["acceptance_per_position_per_text"] == "1.0000 1.0000"
    assert float(by[("table", 1)]["effective_k"]) == pytest.approx(3.0)
    # at concurrency 2 the table says K=0 for most steps (batch size 2); a lone request may still draft
    assert float(by[("table", 2)]["effective_k"]) <= 3.0
    for policy in ("auto", "auction"):  # measured, with drafts within the engine's K
        for c in (1, 2):
            assert float(by[(policy, c)]["total_tokens_per_s"]) > 0
            assert 0 <= float(by[(policy, c)]["effective_k"]) <= 3
    # every run measured a 3 s window of the steady loop (and ended with the engine idle)
    assert all(3.0 <= float(r["measured_s"]) < 4.0 for r in rows)
    assert (tmp_path / "cache" / "cost").is_dir()  # the cost model was profiled and kept
    assert json.loads(done.stdout.strip().splitlines()[-1])["rows"][0]["policy"] == "off"


def test_by_category_adds_the_column(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "category": c})
                                 for p, c in [("def add(a, b):", "code"), ("Once upon", "story")]))
    out = tmp_path / "sweep.csv"
    cmd = [sys.executable, "-m", "engine_adapter.sweep", "--concurrency", "1", "--policies", "k1",
           "--by-category", "--prompts", str(prompts), "--max-tokens", "8", "--min-requests", "1", "--repeats", "2",
           "--window-s", "0", "--steps-out", str(tmp_path / "steps.jsonl"),
           "--out", str(out), "--target", str(tiny.target), "--draft", str(tiny.same), "--kv-cache-gib", "1"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0].keys()) == COLUMNS + ["category"] + EXTRA_COLUMNS
    # every measured step, labelled with its run, K at most 1, and no step of another run
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert {(s["category"], s["run"]) for s in steps} == {(c, r) for c in ("code", "story") for r in (1, 2)}
    assert all(s["type"] == "engine_step" and s["policy"] == "k1" and s["k"] <= 1 for s in steps)
    for key in {(s["category"], s["run"]) for s in steps}:  # each run: its one request of at most 8 tokens
        assert 1 <= sum(s["num_emitted"] for s in steps if (s["category"], s["run"]) == key) <= 8
    assert sorted(r["category"] for r in rows) == ["code", "story"]
    for r in rows:  # two runs each, the median between the extremes
        assert r["runs"] == "2"
        assert float(r["total_tokens_per_s_min"]) <= float(r["total_tokens_per_s"]) <= float(r["total_tokens_per_s_max"])
    assert "run 2/2" in done.stderr


@pytest.mark.parametrize("steps, batch, step_s, tap_s", [
    ([], 0.0, 0.0, 0.0),
    ([(4, 0.20, 0.001)], 4.0, 0.2, 0.001),
    ([(16, 0.60, 0.002), (8, 0.40, 0.004)], 12.0, 0.5, 0.003),  # pooled over steps, not weighted by batch
])
def test_a_level_reports_where_its_step_time_goes(steps, batch, step_s, tap_s):
    run = Run({"tokens_per_s": 1.0, "per_request_tokens_per_s": 1.0, "measured_s": 20.0},
              [replace(_engine_step(1.0, w, b), wall_s=w, tap_s=t) for b, w, t in steps], [])
    row = row_from_runs([run])
    assert (row["mean_batch_size"], row["mean_step_s"], row["mean_tap_s"]) == pytest.approx((batch, step_s, tap_s))
