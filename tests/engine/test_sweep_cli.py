"""``python -m engine_adapter.sweep`` on tiny engines writes its CSV (window mode, by category, one engine
at a time, per model variant, under acceptance rules)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from engine_adapter.engine.resources import MEM_ENV
from engine_adapter.measure.lossy_quality import LOSSY_COLUMNS
from engine_adapter.measure.sweep_runs import COLUMNS, EXTRA_COLUMNS
from engine_adapter.measure.variant_sweep import VARIANT_COLUMNS
from engine_adapter.package_data import PROJECT_ROOT

ROOT = PROJECT_ROOT


def test_sweep_cli_writes_the_csv(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def add(a, b):", "The quick"]))
    out = tmp_path / "sweep.csv"
    cmd = [
        sys.executable,
        "-m",
        "engine_adapter.sweep",
        "--concurrency",
        "1,2",
        "--policies",
        "off,k2,table,auto,auction",
        "--k-max",
        "3",
        "--table",
        "[[1,1,3],[2,64,0]]",
        "--prompts",
        str(prompts),
        "--max-tokens",
        "16",
        "--window-s",
        "2",
        "--out",
        str(out),
        "--target",
        str(tiny.target),
        "--draft",
        str(tiny.same),
        "--kv-cache-gib",
        "1",
        "--dtype",
        "float32",
    ]
    env = os.environ | {"SPEC_EXPLORER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-6000:]
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0].keys()) == COLUMNS + EXTRA_COLUMNS
    assert [(r["policy"], r["concurrency"]) for r in rows] == [
        (p, c) for p in ("off", "k2", "table", "auto", "auction") for c in ("1", "2")
    ]
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
    # every run measured a 2 s window of the steady loop (and ended with the engine idle)
    assert all(2.0 <= float(r["measured_s"]) < 3.0 for r in rows)
    assert (tmp_path / "cache" / "cost").is_dir()  # the cost model was profiled and kept
    assert "cost model learned from" in done.stderr  # ... and learned from the live runs' steps
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["rows"][0]["policy"] == "off" and last["settings"]["dtype"] == "float32"  # --dtype


def test_acceptance_rules_add_the_lossy_columns(tiny, tmp_path):
    """Each live policy under each rule (lossless added first), the relaxed texts compared with the lossless."""
    prompts = tmp_path / "p.jsonl"
    lines = [("What is 12 + 30?", "math"), ("What is the capital of France?", "qa"), ("def add(a, b):", "code")]
    prompts.write_text("\n".join(json.dumps({"prompt": p, "category": c}) for p, c in lines))
    out = tmp_path / "sweep.csv"
    cmd = [sys.executable, "-m", "engine_adapter.sweep", "--concurrency", "1", "--policies", "off,k3"]
    cmd += ["--acceptance", "relaxed", "--top-k", "20", "--delta", "0.5", "--prompts", str(prompts)]
    cmd += ["--max-tokens", "24", "--min-requests", "3", "--window-s", "0", "--out", str(out)]
    cmd += ["--target", str(tiny.target), "--draft", str(tiny.perturbed), "--kv-cache-gib", "1", "--dtype", "float32"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0].keys()) == COLUMNS + EXTRA_COLUMNS + LOSSY_COLUMNS
    by = {(r["policy"], r["acceptance"]): r for r in rows}
    assert set(by) == {("off", "lossless"), ("k3", "lossless"), ("k3", "relaxed")}  # off runs lossless only
    lossless, relaxed = by[("k3", "lossless")], by[("k3", "relaxed")]
    assert float(lossless["agreement"]) == 1.0 and lossless["answers_changed"] == "0"
    assert lossless["answers_compared"] == relaxed["answers_compared"] == "2"  # the math and qa prompts
    assert float(lossless["relaxed_share"]) == 0 < float(relaxed["relaxed_share"])
    assert float(relaxed["draft_acceptance_rate"]) > float(lossless["draft_acceptance_rate"])
    assert float(relaxed["agreement"]) < 1.0 and relaxed["acceptance_rule"] == "relaxed (top_k=20, delta=0.5)"
    assert "warning" not in done.stderr  # every step of a run was verified under its own rule


def one_wave_sweep(tiny, tmp_path, policies: str, *more: str, env: dict[str, str] | None = None, timeout_s=900):
    """The sweep CLI at concurrency 1, one wave of two prompts of 16 tokens, the tiny target drafting
    for itself, its own model cache; returns (the finished process, the CSV's path), checked to exit 0."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def add(a, b):", "The quick"]))
    out = tmp_path / "sweep.csv"
    cmd = [sys.executable, "-m", "engine_adapter.sweep", "--concurrency", "1", "--policies", policies]
    cmd += ["--prompts", str(prompts), "--max-tokens", "16", "--min-requests", "2", "--window-s", "0"]
    cmd += ["--out", str(out), "--target", str(tiny.target), "--draft", str(tiny.same), "--kv-cache-gib", "1"]
    cmd += ["--dtype", "float32", *more]  # as every tiny engine: bfloat16's near-ties break greedy texts apart
    env = os.environ | {"SPEC_EXPLORER_CACHE": str(tmp_path / "cache")} | (env or {})
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert done.returncode == 0, done.stderr[-6000:]
    return done, out


def test_engines_that_do_not_fit_together_run_one_after_the_other_by_category(tiny, tmp_path):
    """With memory for one engine at a time (the override: 4 GiB, each tiny engine about 2.5), ``off``
    runs alone first, then the live engine; speedups are still against off's. ``--by-category``
    measures each category on its own (a ``category`` column), ``--repeats 2`` twice (the median
    between the extremes), and ``--steps-out`` writes every measured step labelled with its run."""
    prompts = tmp_path / "p.jsonl"
    lines = [("def add(a, b):", "code"), ("Once upon", "story")]
    prompts.write_text("\n".join(json.dumps({"prompt": p, "category": c}) for p, c in lines))
    out, steps_out = tmp_path / "sweep.csv", tmp_path / "steps.jsonl"
    cmd = [sys.executable, "-m", "engine_adapter.sweep", "--concurrency", "1", "--policies", "off,k1"]
    cmd += ["--by-category", "--repeats", "2", "--steps-out", str(steps_out), "--prompts", str(prompts)]
    cmd += ["--max-tokens", "8", "--min-requests", "1", "--window-s", "0", "--out", str(out)]
    cmd += ["--target", str(tiny.target), "--draft", str(tiny.same), "--kv-cache-gib", "1", "--dtype", "float32"]
    env = os.environ | {"SPEC_EXPLORER_CACHE": str(tmp_path / "cache"), MEM_ENV: "4"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-6000:]
    err = done.stderr
    assert "GiB at once" in err and "4.0 GiB is available" in err and "one after the other" in err
    assert err.index("closed the speculation-off engine") < err.index("starting the draft engine")
    assert "run 2/2" in err
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0].keys()) == COLUMNS + ["category"] + EXTRA_COLUMNS
    by = {(r["policy"], r["category"]): r for r in rows}
    assert set(by) == {(p, c) for p in ("off", "k1") for c in ("code", "story")}
    for category in ("code", "story"):
        k1 = by[("k1", category)]
        assert float(k1["draft_acceptance_rate"]) == pytest.approx(1.0)  # draft == target
        assert float(k1["speedup_median"]) > 0  # each request against off's rate, measured before
        assert k1["runs"] == "2"
        low, mid, high = (float(k1[f"total_tokens_per_s{end}"]) for end in ("_min", "", "_max"))
        assert low <= mid <= high
    # every measured step of the live policy, labelled with its run, K at most 1, no step of another run
    steps = [json.loads(line) for line in steps_out.read_text().splitlines()]
    live = [s for s in steps if s["policy"] == "k1"]
    assert {(s["category"], s["run"]) for s in live} == {(c, r) for c in ("code", "story") for r in (1, 2)}
    assert all(s["type"] == "engine_step" and s["k"] <= 1 for s in live)
    for key in {(s["category"], s["run"]) for s in live}:  # each run: its one request of at most 8 tokens
        assert 1 <= sum(s["num_emitted"] for s in live if (s["category"], s["run"]) == key) <= 8


def test_variants_run_the_sweep_once_per_model_variant(tiny, tmp_path):
    """--variants full,int8-pair: the sweep runs on the tiny pair, then on its int8 copies (made in
    the model cache); the CSV says each row's variant, bytes per step, roofline fraction, speedups,
    the naive product and the agreement with the full target's greedy text."""
    done, out = one_wave_sweep(tiny, tmp_path, "off,k2", "--variants", "full,int8-pair")
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0].keys()) == ["variant", *COLUMNS, *EXTRA_COLUMNS, *VARIANT_COLUMNS]
    by = {(r["variant"], r["policy"]): r for r in rows}
    assert list(by) == [("full", "off"), ("full", "k2"), ("int8-pair", "off"), ("int8-pair", "k2")]
    assert (tmp_path / "cache" / f"{tiny.target.name}-int8" / "config.json").is_file()
    assert float(by[("int8-pair", "off")]["bytes_per_step"]) < float(by[("full", "off")]["bytes_per_step"])
    for variant in ("full", "int8-pair"):
        assert 0 < float(by[(variant, "off")]["roofline_fraction"])
        assert by[(variant, "k2")]["roofline_fraction"] == ""  # plain decoding's figure only
        assert float(by[(variant, "k2")]["draft_acceptance_rate"]) == pytest.approx(1.0)  # draft == target
        assert float(by[(variant, "off")]["speedup_over_off"]) == pytest.approx(1.0)
    assert float(by[("full", "off")]["agreement_with_full"]) == 1.0  # the reference itself
    assert float(by[("full", "k2")]["agreement_with_full"]) == 1.0  # greedy speculation is lossless
    assert 0 < float(by[("int8-pair", "off")]["agreement_with_full"]) <= 1.0
    quantised = by[("int8-pair", "k2")]
    off_gain = float(by[("int8-pair", "off")]["speedup_over_full_off"])
    spec_gain = float(by[("full", "k2")]["speedup_over_off"])
    # the CSV keeps 3 decimals of each: a small product (a slow runner's int8 pair) is rounded
    assert float(quantised["naive_product"]) == pytest.approx(off_gain * spec_gain, rel=0.01, abs=2e-3)
    assert by[("full", "k2")]["naive_product"] == "" and by[("int8-pair", "off")]["naive_product"] == ""
    assert "c=1, int8-pair + k2: product" in done.stdout and "overstates it by" in done.stdout
    assert "variants full,int8-pair" in json.loads(done.stdout.strip().splitlines()[-1])["settings"]["models"]
