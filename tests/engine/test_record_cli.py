"""The recorder CLI's contract, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.provenance import kinds_for_step
from tests.support.app_process import tiny_engine_args

ROOT = PROJECT_ROOT


@pytest.mark.parametrize(
    "acceptance", [[], ["--acceptance", "relaxed", "--top-k", "20", "--delta", "0.5"]], ids=["lossless", "relaxed"]
)
def test_record_cli_writes_the_documented_trace(tiny, tmp_path, acceptance):
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"prompt": "def add(a, b):", "category": "code"},
        {"prompt": "The quick brown fox"},
        {"prompt": "Once upon a time", "other": 1},
    ]
    prompts.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "trace.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "engine_adapter.record",
        "--k",
        "3",
        "--prompts",
        str(prompts),
        "--max-tokens",
        "24",
        "--concurrency",
        "2",
        "--temperature",
        "0",
        "--out",
        str(out),
        *tiny_engine_args(tiny.target, tiny.perturbed),
        *acceptance,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["total_tokens"] == 72

    trace = [json.loads(x) for x in out.read_text().splitlines()]
    run, requests, summary = trace[0], trace[1:-1], trace[-1]
    assert run["type"] == "run" and run["method"] == "draft" and run["k"] == 3
    assert run["concurrency"] == 2 and run["temperature"] == 0.0
    assert run["vllm_version"].startswith("0.32")
    rule = "relaxed" if acceptance else "lossless"
    assert run["acceptance"]["name"] == rule and (not acceptance or run["acceptance"]["delta"] == 0.5)
    assert summary["type"] == "summary" and summary["total_tokens"] == 72
    assert summary["tokens_per_second"] > 0 and summary["wall_s"] > 0
    assert [r["prompt"] for r in requests] == [x["prompt"] for x in lines]
    for r in requests:
        assert r["type"] == "request"
        steps = r["steps"]
        assert [i for s in steps for i in s["emitted"]] == r["token_ids"]
        assert len(r["kinds"]) == len(r["token_ids"]) == 24
        kinds = [
            k
            for n, s in enumerate(steps)
            for k in kinds_for_step(
                n, len(s["drafted"]), s["accepted"], len(s["emitted"]), {x[0] for x in s["relaxed"]}
            )
        ]
        assert kinds == r["kinds"]
        m = r["spec_decode_metrics"]
        spec = [s for s in steps if s["drafted"]]
        assert [s["accepted"] for s in spec] == m["per_step_accepted"]  # vLLM counts relaxed drafts accepted
        assert [len(s["drafted"]) for s in spec] == m["per_step_drafted"]
        for s in steps:
            assert set(s) >= {"drafted", "accepted", "emitted", "batch_size", "t", "relaxed", "rule"}
            for position, target_id, p_draft, p_target, _text in s["relaxed"]:  # the target chose otherwise
                assert s["drafted"][position - 1] != target_id and p_target >= p_draft
            n = min(s["accepted"], len(s["emitted"]))
            assert s["emitted"][:n] == s["drafted"][:n]

    relaxed = [k for r in requests for k in r["kinds"] if k == "relaxed"]
    assert bool(relaxed) == bool(acceptance), relaxed  # the perturbed tiny draft has near-misses to relax


def test_record_cli_rejects_a_bad_acceptance_rule(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x"}\n')
    cmd = [sys.executable, "-m", "engine_adapter.record", "--prompts", str(prompts), "--out", str(tmp_path / "t")]
    done = subprocess.run([*cmd, "--acceptance", "relaxed", "--delta", "2"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "delta is a difference of probabilities" in done.stderr, done.stderr[-2000:]


def test_record_cli_rejects_a_bad_prompts_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine_adapter.record",
            "--prompts",
            str(bad),
            "--out",
            str(tmp_path / "t.jsonl"),
            "--method",
            "off",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert 'expected an object with a "prompt" string' in done.stderr
