"""The sweep CLI: policy parsing (table of cases) and one small real run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter.sweep import COLUMNS, Policy, parse_policy

ROOT = Path(__file__).resolve().parent.parent
TABLE = [(1, 2, 3), (3, 64, 0)]


@pytest.mark.parametrize("name, expected", [
    ("off", Policy("off", "off", 1)),
    ("k1", Policy("k1", "draft", 1)),
    ("k5", Policy("k5", "draft", 5)),
    ("table", Policy("table", "draft", 3, TABLE)),
    ("auto", "control channel"),
    ("auction", "control channel"),
    ("kx", "unknown policy"),
    ("fast", "unknown policy"),
])
def test_parse_policy(name, expected):
    if isinstance(expected, Policy):
        assert parse_policy(name, "draft", TABLE) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_policy(name, "draft", TABLE)


def test_table_policy_needs_a_table():
    with pytest.raises(ValueError, match="needs --table"):
        parse_policy("table", "draft", None)


def test_sweep_cli_writes_the_csv(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def add(a, b):", "The quick"]))
    out = tmp_path / "sweep.csv"
    cmd = [sys.executable, "-m", "engine_adapter.sweep", "--concurrency", "1,2", "--policies", "off,k2,table",
           "--table", "[[1,1,3],[2,64,0]]", "--prompts", str(prompts), "--max-tokens", "16",
           "--out", str(out), "--target", str(tiny.target), "--draft", str(tiny.same), "--kv-cache-gib", "1"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0].keys()) == COLUMNS
    assert [(r["policy"], r["concurrency"]) for r in rows] == [
        ("off", "1"), ("off", "2"), ("k2", "1"), ("k2", "2"), ("table", "1"), ("table", "2")]
    by = {(r["policy"], int(r["concurrency"])): r for r in rows}
    assert float(by[("off", 1)]["effective_k"]) == 0
    assert float(by[("k2", 1)]["effective_k"]) == pytest.approx(2.0)
    assert float(by[("k2", 1)]["draft_acceptance_rate"]) == pytest.approx(1.0)  # draft == target
    assert float(by[("table", 1)]["effective_k"]) == pytest.approx(3.0)
    # at concurrency 2 the table says K=0 for most steps (batch size 2); a lone request may still draft
    assert float(by[("table", 2)]["effective_k"]) <= 3.0
    assert json.loads(done.stdout.strip().splitlines()[-1])["rows"][0]["policy"] == "off"
