"""The app launched with ``--replay`` on a shipped trace (no engine at all),
and a live session recorded by the app that replays."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from engine_adapter.engine.supervise import session_members
from engine_adapter.package_data import PROJECT_ROOT, data_path
from engine_adapter.trace.format import (
    read_session,
)
from explorer.panels.load import LIVE_CHART_PATH
from tests.support.app_process import running_app, tiny_app_args
from tests.support.token_view_markup import view_steps
from tests.support.trace_samples import CHART_COLUMNS

ROOT = PROJECT_ROOT


TRACES = data_path("traces")


def session_pids(sid: int) -> list[int]:
    return session_members(sid)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def replay_app(tmp_path_factory):
    args = ["--replay", "traces/low_load.jsonl", "--replay-speed", "4"]
    log = tmp_path_factory.mktemp("replay-app") / "app.log"
    with running_app(args, log, None, timeout_s=120, stop_s=30) as (app, _):
        yield app.url, app.proc


def test_replay_app_needs_no_engine(replay_app):
    url, app = replay_app
    client = Client(url, verbose=False)
    status = client.predict(api_name="/status")
    assert "▶ **Replay** of `low_load.jsonl`" in status and "method **draft**" in status, status
    assert "No engine is running" in status
    others = [p for p in session_pids(app.pid) if p != app.pid]
    assert not [cmdline(p) for p in others if "vllm" in cmdline(p)], "a replay must start no engine"
    assert not others, [cmdline(p) for p in others]


def test_the_page_keeps_no_run_history(replay_app):
    """Gradio's run history would keep each visitor's prompts and outputs in the browser for the next
    person on that browser, and rewrite it at every streamed step; app.py turns it off."""
    url, _ = replay_app
    config = httpx.get(f"{url}/config", timeout=10).json()
    assert config["run_history"] is False
    assert "runs" not in config["footer_links"]
    assert httpx.get(f"{url}/gradio_api/runs", timeout=10).status_code == 404


def test_replay_app_runs_the_recorded_requests(replay_app):
    url, _ = replay_app
    trace = read_session(TRACES / "low_load.jsonl")
    assert trace.requests, "the shipped trace holds foreground requests"
    client = Client(url, verbose=False)
    wanted = trace.request_lines[1]
    job = client.submit(wanted["prompt"], 0.0, 8, api_name="/run")  # its prompt: that very request
    updates = list(job)
    assert len(updates) >= 3, "the token view should update step by step"
    view, card, _hist, _pos, line = updates[-1]
    line = json.loads(line)
    kinds = [t["k"] for s in view_steps(view) for t in s["t"]]
    assert kinds == wanted["kinds"] and line["token_ids"] == wanted["token_ids"]
    assert line["text"] == wanted["text"] and line["prompt"] == wanted["prompt"]
    assert f"draft_acceptance_rate = {wanted['spec_decode_metrics']['draft_acceptance_rate']:.3f}" in card
    assert [len(s["r"]) for s in view_steps(view)] == [
        len(s["drafted"]) - s["accepted"] if s["drafted"] else 0 for s in wanted["steps"]
    ]
    # an unrecorded prompt plays the next recorded request (the one after it)
    *_, nxt = client.predict("a prompt nobody recorded", 0.0, 8, api_name="/run")
    assert json.loads(nxt)["token_ids"] == trace.request_lines[2 % len(trace.requests)]["token_ids"]
    verdict, *_ = client.predict(0.0, api_name="/lossless")
    assert "needs a live engine" in verdict


def test_replay_app_charts_move_and_export_csv(replay_app):
    url, _ = replay_app
    client = Client(url, verbose=False)
    time.sleep(2)
    # the page's chart gate (assets/chart_gate.js) says "no redraw": the readouts only, no figure
    readout, *policy = client.predict(False, api_name="/charts")
    unsent = (None, {"__type__": "update"})  # what gradio_client returns for an output left as it was
    assert all(p in unsent for p in policy[2:5]), "no chart is sent when the gate says no"
    assert "Requests running in the engine" in readout
    # the live chart's data, as the page's own loop fetches it (assets/live_chart.js)
    first = httpx.get(url.rstrip("/") + LIVE_CHART_PATH, timeout=30).json()
    time.sleep(2.5)
    later = httpx.get(url.rstrip("/") + LIVE_CHART_PATH, timeout=30).json()
    assert later["now"] > first["now"] and later["key"] != first["key"], "the replay moves the live chart"
    k = next(t for t in later["traces"] if t["name"] == "K in force")
    assert any(y is not None for y in k["y"]) and len(k["x"]) == len(k["y"])
    path = client.predict(api_name="/export_csv")
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    assert list(rows[0])[: len(CHART_COLUMNS)] == CHART_COLUMNS and "load" in rows[0]
    assert any(r["k"] for r in rows), "the replayed steps fill the chart's bins"
    client.predict(8, api_name="/set_load")  # the slider cannot change a recording; the status says so
    assert "the background load is the recorded one" in client.predict(api_name="/status")


def test_app_records_a_live_session_that_replays(tiny, tmp_path):
    """app.py --record on a tiny engine: the trace holds the run, the steps, the load, and replays."""
    out = tmp_path / "session.jsonl"
    # fixed K=3: the tests read K=3's drafts (the default, auto, may choose K=0 on tiny models)
    args = tiny_app_args(tiny.target, tiny.perturbed, "--k", "3", "--policy", "fixed", "--record", str(out))
    with running_app(args, tmp_path / "app.log") as (_, client):
        *_, live_line = client.predict("def add(a, b):", 0.0, 24, api_name="/run")
        live_line = json.loads(live_line)
        client.predict(2, api_name="/set_load")
        time.sleep(3)
        client.predict(0, api_name="/set_load")
        time.sleep(1.5)
    trace = read_session(out)
    assert trace.header["session"] and trace.header["method"] == "draft" and trace.header["k"] == 3
    assert trace.summary is not None and trace.summary["num_requests"] == 1
    assert [n for _, n in trace.loads] == [2, 0]
    assert len(trace.steps) >= 24 and max(s.batch_size for s in trace.steps) >= 2
    line = trace.request_lines[0]
    assert line["token_ids"] == live_line["token_ids"] and line["kinds"] == live_line["kinds"]
    assert line["spec_decode_metrics"] == live_line["spec_decode_metrics"]
    assert "".join(x for s in line["steps"] for x in s["texts"]) == line["text"] == live_line["text"]
    assert 0 <= line["t_start"] < line["steps"][0]["t"] <= line["t_end"] <= trace.summary["wall_s"]
    # the foreground request's steps are among the server-wide engine steps, at the same times
    step_times = {round(s.t, 4) for s in trace.steps}
    assert all(s["t"] in step_times for s in line["steps"])
