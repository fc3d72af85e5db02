"""``python -m engine_adapter.quant_check`` on a tiny model: the int8 copy's greedy text against the
full model's on the presets, a table per copy, the check kept beside the copy, a JSON last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from engine_adapter.measure.variant_check import CHECK_FILE, first_difference
from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.prompts import load_presets


def test_first_difference_names_the_first_token_that_differs():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a prefix differs where it ends


def test_the_check_compares_the_int8_copy_with_the_full_model_on_every_preset(tiny, tmp_path):
    cmd = [sys.executable, "-m", "engine_adapter.quant_check", "--schemes", "int8", "--models", "target"]
    cmd += ["--target", str(tiny.target), "--dtype", "float32", "--kv-cache-gib", "1", "--max-tokens", "8"]
    cmd += ["--categories", "code,story"]
    env = os.environ | {"SPEC_EXPLORER_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "both engines at once" in proc.stderr  # two tiny engines fit in memory together
    presets = load_presets(categories=["code", "story"])
    assert all(p.label[:40] in proc.stdout for p in presets)
    (summary,) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["scheme"] == "int8" and summary["presets"] == len(presets) and summary["max_tokens"] == 8
    assert 0.0 <= summary["identical_share"] <= summary["mean_agreement"] <= 1.0
    kept = json.loads((tmp_path / "cache" / f"{tiny.target.name}-int8" / CHECK_FILE).read_text())["8"]
    assert [p["label"] for p in kept["presets"]] == [p.label for p in presets]
    assert all(p["tokens"] > 0 and (p["first_difference"] is None) == p["identical"] for p in kept["presets"])
    assert kept["dtype"] == "float32"


def test_the_check_refuses_a_scheme_it_cannot_run():
    cmd = [sys.executable, "-m", "engine_adapter.quant_check", "--schemes", "int3", "--models", "target"]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot check int3" in proc.stderr
