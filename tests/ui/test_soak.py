"""The 2-minute soak: 20 simulated users on the launched app (tiny models), then nothing leaked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine_adapter.package_data import PROJECT_ROOT
from tests.support.app_process import tiny_app_args

ROOT = PROJECT_ROOT


@pytest.mark.slow
def test_twenty_users_for_two_minutes_leave_nothing_behind(tiny):
    # two minutes are mostly warm-up (first sessions, caches): the baseline is taken at half time
    cmd = [
        sys.executable,
        "scripts/soak.py",
        "--users",
        "20",
        "--duration",
        "120",
        "--drain-s",
        "180",
        "--baseline-after",
        "0.5",
        "--",
        *tiny_app_args(tiny.target, tiny.perturbed, "--k", "3"),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.stdout.strip(), f"soak.py printed no report (exit {done.returncode}): {done.stderr[-3000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["served"] > 20, report
    assert report["tab_closes"] > 0 and report["load_moves"] > 0, report
    assert report["stops"] > 0 and 0 < report["stopped"] <= report["stops"], report
    assert report["errors"] == {}, report
    assert report["engine_running_after"] == 0 and report["engine_waiting_after"] == 0, report
    assert report["app_rss_growth"] < 0.10, report
    assert done.returncode == 0, done.stderr[-3000:]
