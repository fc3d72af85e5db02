"""The measuring CLIs (sweep, bench, quant_check) say in one line why an engine did not start, with
no traceback, and exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine_adapter.engine.resources import MEM_ENV
from engine_adapter.package_data import PROJECT_ROOT


@pytest.mark.parametrize(
    "command",
    [
        ["engine_adapter.sweep", "--concurrency", "1", "--policies", "off,k2", "--max-tokens", "8"],
        ["engine_adapter.bench", "--methods", "off", "--concurrency", "1", "--max-tokens", "8"],
        ["engine_adapter.quant_check", "--schemes", "int8", "--models", "target", "--max-tokens", "8"],
    ],
    ids=["sweep", "bench", "quant_check"],
)
def test_an_engine_that_cannot_start_is_said_in_words(tiny, tmp_path, command):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):"}))
    more = ["--prompts", str(prompts), "--out", str(tmp_path / "s.csv")] if command[0].endswith("sweep") else []
    cmd = [sys.executable, "-m", *command, "--target", str(tiny.target), "--draft", str(tiny.same), *more]
    cmd += ["--kv-cache-gib", "1"]
    env = os.environ | {"SPEC_EXPLORER_CACHE": str(tmp_path / "cache"), MEM_ENV: "0.2"}
    done = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "error: an engine did not start: not enough free memory" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
