"""Record and replay: the session trace format, the recorder, ReplayService, CSV export,
and the app launched with ``--replay`` on a shipped trace (no engine at all)."""

from __future__ import annotations

import collections
import csv
import io
import json
import time
from pathlib import Path

import pytest
from gradio_client import Client

from engine_adapter.service.load import LoadStats
from engine_adapter.provenance import kinds_for_step
from engine_adapter.records import EngineStep, RequestResult, Step, Token
from engine_adapter.service.replay_service import ReplayService
from engine_adapter.service.engine_service import ServiceStatus
from engine_adapter.trace.session_recorder import SessionRecorder
from engine_adapter.trace.format import (
    SessionTraceWriter,
    engine_step_line,
    load_line,
    policy_line,
    read_session,
    session_header,
    session_request_line,
)
from explorer.views.live_charts import chart_csv, live_chart_frame
from tests.support.app_process import AppNotReady, engine_ready, start_app, wait_ready
from engine_adapter.engine.supervise import session_members

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
CHART_COLUMNS = ["t", "k", "batch", "effective_k", "tokens_per_step", "accepted_per_step", "acceptance_rate",
                 "total_tokens_per_s"]


def engine_step(seq: int, t: float, batch: int = 2) -> EngineStep:
    return EngineStep(seq=seq, t=t, wall_s=0.04321, interval_s=0.1, batch_size=batch, k=3, num_tokens=8,
                      num_drafted=6, num_accepted=3, num_emitted=5, accepted_per_pos=(2, 1, 0),
                      reached_per_pos=(2, 2, 1), num_drafting=2, tap_s=0.000123)


def request(t_start: float, prompt: str = "def add(a, b):", dt: float = 0.25) -> RequestResult:
    """A finished request: prefill, a step keeping 2 of 3 drafts, one keeping all 3 (4 steps)."""
    plan = [([], 0, [11]), ([21, 22, 23], 2, [21, 22, 30]), ([31, 32, 33], 3, [31, 32, 33, 34]),
            ([41, 42, 43], 0, [50])]
    steps = []
    for i, (drafted, acc, emitted) in enumerate(plan):
        kinds = kinds_for_step(i, len(drafted), acc, len(emitted))
        toks = [Token(id=e, text=f"<{e}>", kind=k, step=i, draft_pos=j + 1 if k == "accepted" else None, k=3,
                      batch_size=1, draft_id=drafted[j] if j < len(drafted) else None)
                for j, (e, k) in enumerate(zip(emitted, kinds))]
        rej = [Token(id=d, text=f"x{d}", kind="rejected", step=i, draft_pos=acc + j + 1, k=3, batch_size=1,
                     draft_id=d) for j, d in enumerate(drafted[acc:])]
        steps.append(Step(index=i, t=t_start + dt * (i + 1), wall_s=0.05, batch_size=1, k=3, drafted=drafted,
                          num_drafted=len(drafted), accepted=acc, emitted=emitted, tokens=toks, rejected=rej))
    steps[-1].finish_reason = "length"
    ids = [e for s in steps for e in s.emitted]
    return RequestResult(
        request_id="r1", prompt=prompt, text="".join(t.text for s in steps for t in s.tokens), token_ids=ids,
        kinds=[t.kind for s in steps for t in s.tokens], steps=steps, provenance="tap",
        spec_decode_metrics={"mean_acceptance_length": 2.667, "draft_acceptance_rate": 0.556,
                             "acceptance_histogram": [1, 0, 1, 1], "num_spec_steps": 3,
                             "num_accepted_draft_tokens": 5, "num_draft_tokens": 9, "num_spec_tokens": 3},
        tap_metrics=None, finish_reason="length", num_prompt_tokens=7, t_start=t_start,
        t_first_token=t_start + dt, t_end=t_start + dt * 4 + 0.01,
    )


def write_trace(path: Path, t0: float = 1000.0, n_steps: int = 40, dt: float = 0.1) -> None:
    w = SessionTraceWriter(path)
    w.write(session_header({"method": "draft", "k": 3, "target": "T", "draft": "D"}, "0.32.0"))
    for i in range(1, n_steps + 1):
        w.write(engine_step_line(engine_step(i, t0 + dt * i, batch=1 if i < n_steps / 2 else 5), t0))
    w.write(load_line(n_steps * dt / 2, 4))
    w.write(policy_line(n_steps * dt / 4, {"kind": "fixed", "k": 1}))
    w.write(session_request_line(request(t0 + 0.5), t0))
    w.write({"type": "summary", "wall_s": n_steps * dt, "num_engine_steps": n_steps, "num_requests": 1,
             "total_tokens": 9})
    w.close()


def test_session_trace_round_trip(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["session"] is True and lines[0]["vllm_version"] == "0.32.0"
    assert {x["type"] for x in lines} == {"run", "engine_step", "load", "policy", "request", "summary"}
    trace = read_session(path)
    assert trace.duration_s == pytest.approx(4.0)
    # engine steps: every field back, times relative to the session start
    original = engine_step(7, 1000.7, batch=1)
    back = trace.steps[6]
    assert back.t == pytest.approx(0.7) and back.seq == 7
    for name in EngineStep.__dataclass_fields__:
        a, b = getattr(back, name), getattr(original, name)
        if name != "t":
            assert (a == pytest.approx(b, abs=1e-5)) if isinstance(b, float) else a == b, name
    assert trace.loads == [(2.0, 4)]
    assert trace.policies == [{"type": "policy", "t": 1.0, "kind": "fixed", "k": 1}]
    # the request: the recorder's line plus session times and token texts, rebuilt exactly
    r0, r = request(1000.5), trace.requests[0]
    line = trace.request_lines[0]
    assert set(line) >= {"request_id", "prompt", "text", "token_ids", "kinds", "steps", "spec_decode_metrics",
                         "tokens_per_second", "ttft_s", "wall_s", "t_start", "t_end"}
    assert r.token_ids == r0.token_ids and r.kinds == r0.kinds and r.text == r0.text
    assert r.t_start == pytest.approx(0.5) and r.t_end == pytest.approx(r0.t_end - 1000)
    assert r.spec_decode_metrics == r0.spec_decode_metrics
    for a, b in zip(r.steps, r0.steps):
        assert (a.drafted, a.accepted, a.emitted, a.k) == (b.drafted, b.accepted, b.emitted, b.k)
        assert [(t.id, t.text, t.kind, t.draft_pos) for t in a.tokens] == \
            [(t.id, t.text, t.kind, t.draft_pos) for t in b.tokens]
        assert [(t.id, t.text) for t in a.rejected] == [(t.id, t.text) for t in b.rejected]
        assert a.t == pytest.approx(b.t - 1000)
    assert r.tokens_per_second == pytest.approx(r0.tokens_per_second, rel=1e-3)


def test_reader_copes_with_a_cut_last_line(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    text = path.read_text().splitlines()[:-1]  # no summary: the app was killed
    path.write_text("\n".join(text) + '\n{"type":"engine_step","seq":99,"t":')
    trace = read_session(path)
    assert trace.summary is None and len(trace.steps) == 40 and len(trace.requests) == 1
    with pytest.raises(ValueError, match="starts with"):
        (tmp_path / "bad.jsonl").write_text('{"type": "request"}\n')
        read_session(tmp_path / "bad.jsonl")


def test_a_recorder_trace_replays_its_requests(tmp_path):
    """A trace from `python -m engine_adapter.record` (engine-host clock, no timeline) plays too."""
    from engine_adapter.trace.format import request_line

    path = tmp_path / "rec.jsonl"
    lines = [{"type": "run", "method": "draft", "k": 3}, request_line(request(5000.0)),
             request_line(request(5003.0, prompt="The quick brown fox")),
             {"type": "summary", "wall_s": 4.0, "total_tokens": 18, "tokens_per_second": 4.5}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    trace = read_session(path)
    assert [r.t_start for r in trace.requests] == [0.0, pytest.approx(3.0)]
    assert trace.requests[1].steps[0].t == pytest.approx(3.25) and trace.duration_s == pytest.approx(4.01)
    assert [t.text for t in trace.requests[0].tokens][:2] == ["⟨11⟩", "⟨21⟩"]  # no texts: ids shown
    svc = ReplayService(path, speed=50.0)
    assert svc.replay_prompt("The quick brown fox") == "The quick brown fox"


class FakeService:
    """EngineService's surface as the recorder reads it."""

    def __init__(self) -> None:
        self.state = "starting"
        self.generation = 1
        self.steps: list[EngineStep] = []
        self.load_changes: collections.deque = collections.deque()
        self.policy_changes: collections.deque = collections.deque()
        self.on_result: list = []
        self.bg: LoadStats | None = None

    def status(self) -> ServiceStatus:
        from engine_adapter.engine_config import EngineConfig

        return ServiceStatus(self.state, None, None, EngineConfig(method="draft", k=3), "http://x", False,
                             self.generation)

    def steps_since(self, t: float) -> list[EngineStep]:
        return [s for s in self.steps if s.t > t]

    def background_stats(self) -> LoadStats | None:
        return self.bg

    def background_tokens_per_second(self, window_s: float = 10.0) -> float:
        return 12.5 if self.bg else 0.0


def test_recorder_follows_a_service(tmp_path):
    now = [500.0]
    svc = FakeService()
    rec = SessionRecorder(svc, tmp_path / "rec.jsonl", clock=lambda: now[0])
    assert svc.on_result == [rec._on_result]
    svc.steps.append(engine_step(1, 499.0))  # the handshake, before the engine was ready
    rec.poll_once()
    assert rec.t0 is None  # nothing is written before the engine is ready
    svc.state = "ready"
    rec.poll_once()
    assert rec.t0 == 500.0
    svc.steps += [engine_step(i, 500.0 + 0.1 * i) for i in range(2, 6)]
    svc.load_changes.append((500.2, 8))
    svc.policy_changes.append((500.3, {"policy": "k1", "table": [[1, 64, 1]]}))
    svc.bg = LoadStats(8, 8, 0, 0, 0, None)
    now[0] = 501.0
    rec.poll_once()
    svc.load_changes[-1] = (500.2, 16)  # the service coalesces a drag into one marker
    svc.steps += [engine_step(6, 501.5)]
    for cb in svc.on_result:
        cb(request(500.6))
    now[0] = 502.0
    svc.generation = 2  # a restart with new settings
    rec.poll_once()
    rec.poll_once()  # nothing new: nothing written twice
    now[0] = 503.0
    rec.close()
    assert svc.on_result == []
    lines = [json.loads(x) for x in (tmp_path / "rec.jsonl").read_text().splitlines()]
    kinds = collections.Counter(x["type"] for x in lines)
    assert kinds == {"run": 1, "engine_step": 5, "load": 2, "policy": 1, "background": 1, "request": 1,
                     "engine": 1, "summary": 1}
    assert lines[0]["session"] and lines[0]["method"] == "draft" and lines[0]["k"] == 3
    assert lines[-1] == {"type": "summary", "wall_s": 3.0, "num_engine_steps": 5, "num_requests": 1,
                         "total_tokens": 9}
    policy = next(x for x in lines if x["type"] == "policy")
    assert policy["t"] == pytest.approx(0.3) and policy["policy"] == "k1"
    trace = read_session(tmp_path / "rec.jsonl")
    assert trace.loads == [(pytest.approx(0.2), 16)]  # the later value for the same marker wins
    assert [s.seq for s in trace.steps] == [2, 3, 4, 5, 6]
    assert trace.requests[0].t_start == pytest.approx(0.6)
    assert trace.backgrounds[0]["tokens_per_s"] == 12.5


def test_recorder_time_zero_is_when_the_engine_became_ready(tmp_path):
    """A request sent the moment the status says ready is recorded whole, even between two polls."""
    now = [10.0]
    svc = FakeService()
    rec = SessionRecorder(svc, tmp_path / "rec.jsonl", clock=lambda: now[0])
    rec.poll_once()  # not ready yet at 10.0
    svc.state = "ready"
    svc.steps.append(engine_step(1, 10.2))  # a user's first step, before the recorder's next poll
    for cb in svc.on_result:
        cb(request(10.1))
    now[0] = 10.5
    rec.close()
    trace = read_session(tmp_path / "rec.jsonl")
    assert rec.t0 == 10.0 and [s.t for s in trace.steps] == [pytest.approx(0.2)]
    assert trace.requests[0].t_start == pytest.approx(0.1)


async def test_replay_plays_at_speed(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path, n_steps=40, dt=0.1)  # 4 recorded seconds
    svc = ReplayService(path, speed=8.0)  # 0.5 s of wall time per pass
    assert svc.replay_info is not None and svc.status().state == "ready"
    time.sleep(0.25)
    info = svc.replay_info
    assert 1.8 < info.position_s < 3.6 and info.loop == 0
    now = time.monotonic()
    seen = svc.steps_since(now - 180)
    assert 15 <= len(seen) <= 36  # only what has been played, at 8x
    assert all(s.t <= now + 1e-6 for s in seen)
    # the chart's time axis stays in recorded seconds: steps 0.1 apart, as recorded
    assert seen[-1].t - seen[-2].t == pytest.approx(0.1, abs=1e-3)
    time.sleep(0.35)  # past the end: it loops
    assert svc.replay_info.loop == 1
    assert len(svc.steps_since(time.monotonic() - 3.9)) >= 35  # the end of pass 1 and the start of pass 2
    # the load as recorded (4 from 2.0 s on), markers in the same frame as the steps
    assert all(n == 4 for _, n in svc.load_changes)
    # a foreground request plays step by step with its recorded timing / speed
    t = time.monotonic()
    items = [x async for x in svc.stream("anything", max_tokens=1, temperature=0.0)]
    took = time.monotonic() - t
    assert [type(x) for x in items] == [Step] * 4 + [RequestResult]
    assert 0.9 / 8 < took < 0.9 / 8 + 0.4  # 4 steps 0.25 s apart (and 0.01 s to the end), at 8x
    assert items[-1].token_ids == [11, 21, 22, 30, 31, 32, 33, 34, 50]
    with pytest.raises(RuntimeError, match="replay"):
        async for _ in svc.stream("x", max_tokens=1, temperature=0.0, reference=True):
            pass


async def test_replay_refuses_controls_politely(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    svc = ReplayService(path, speed=100.0)
    svc.start(None).result(timeout=1)
    assert "cannot change" in svc.replay_info.note
    await svc.set_background(30)
    assert "recorded one" in svc.replay_info.note
    assert svc.replay_prompt("") == "def add(a, b):"  # Run with no prompt plays the next recorded one
    assert svc.prom_history() == []
    with pytest.raises(RuntimeError, match="replay"):
        await svc.set_policy(None)
    time.sleep(0.05)  # 5 recorded seconds at 100x: the whole trace has played
    changes = svc.policy_changes  # recorded, shown (once per pass played), never applied
    assert changes and all(c == {"kind": "fixed", "k": 1} for _, c in changes)


def test_csv_export_has_the_chart_columns(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path, n_steps=40, dt=0.1)
    svc = ReplayService(path, speed=1000.0, loop=False)  # plays out at once, then holds
    time.sleep(0.05)
    df = live_chart_frame(svc)
    rows = list(csv.DictReader(io.StringIO(chart_csv(df))))
    assert list(rows[0])[:len(CHART_COLUMNS)] == CHART_COLUMNS
    assert {"pos1", "pos2", "pos3", "load"} <= set(rows[0])
    filled = [r for r in rows if r["k"]]
    assert filled and all(r["k"] == "3" for r in filled)
    assert sum(float(r["total_tokens_per_s"]) * 2 for r in filled) == pytest.approx(40 * 5)
    assert filled[-1]["load"] == "4"


# --- the launched app on a shipped trace, as a new user runs it ---------------------------

def session_pids(sid: int) -> list[int]:
    return session_members(sid)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def replay_app(tmp_path_factory):
    app = start_app(["--replay", "traces/low_load.jsonl", "--replay-speed", "4"],
                    tmp_path_factory.mktemp("replay-app") / "app.log")
    try:
        try:
            wait_ready(app, None, timeout_s=120, poll_s=0.5)
        except AppNotReady as e:
            pytest.fail(f"the replay app never answered: {e}")
        yield app.url, app.proc
    finally:
        if not app.stop(timeout_s=30):
            pytest.fail("the replay app did not exit within 30 s of Ctrl-C")


def test_replay_app_needs_no_engine(replay_app):
    url, app = replay_app
    client = Client(url, verbose=False)
    status = client.predict(api_name="/status")
    assert "▶ **Replay** of `low_load.jsonl`" in status and "method **draft**" in status, status
    assert "No engine is running" in status
    others = [p for p in session_pids(app.pid) if p != app.pid]
    assert not [cmdline(p) for p in others if "vllm" in cmdline(p)], "a replay must start no engine"
    assert not others, [cmdline(p) for p in others]


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
    kinds = [t["k"] for s in view["steps"] for t in s["t"]]
    assert kinds == wanted["kinds"] and line["token_ids"] == wanted["token_ids"]
    assert line["text"] == wanted["text"] and line["prompt"] == wanted["prompt"]
    assert f"draft_acceptance_rate = {wanted['spec_decode_metrics']['draft_acceptance_rate']:.3f}" in card
    assert [len(s["r"]) for s in view["steps"]] == [len(s["drafted"]) - s["accepted"] if s["drafted"] else 0
                                                   for s in wanted["steps"]]
    # an unrecorded prompt plays the next recorded request (the one after it)
    *_, nxt = client.predict("a prompt nobody recorded", 0.0, 8, api_name="/run")
    assert nxt["token_ids"] == trace.request_lines[2 % len(trace.requests)]["token_ids"]
    verdict, *_ = client.predict(0.0, api_name="/lossless")
    assert "needs a live engine" in verdict


def test_replay_app_charts_move_and_export_csv(replay_app):
    url, _ = replay_app
    client = Client(url, verbose=False)
    time.sleep(2)
    _fig, readout = client.predict([], api_name="/live")
    assert "Requests running in the engine" in readout
    path = client.predict(api_name="/export_csv")
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    assert list(rows[0])[:len(CHART_COLUMNS)] == CHART_COLUMNS and "load" in rows[0]
    assert any(r["k"] for r in rows), "the replayed steps fill the chart's bins"
    client.predict(8, api_name="/set_load")  # the slider cannot change a recording; the status says so
    assert "the background load is the recorded one" in client.predict(api_name="/status")


@pytest.mark.parametrize("name", ["low_load.jsonl", "load_0_32_0.jsonl"])
def test_shipped_traces_are_small_and_complete(name):
    path = TRACES / name
    assert path.stat().st_size < 2_000_000
    trace = read_session(path)
    assert trace.header["session"] and trace.header["vllm_version"]
    assert trace.summary is not None and len(trace.steps) > 50 and trace.requests
    for line in trace.request_lines:
        assert [i for s in line["steps"] for i in s["emitted"]] == line["token_ids"]
        assert "".join(x for s in line["steps"] for x in s["texts"]) == line["text"]
    if name.startswith("load_0_32"):
        assert max(n for _, n in trace.loads) == 32 and trace.loads[-1][1] == 0
        assert max(s.batch_size for s in trace.steps) >= 30


def test_app_records_a_live_session_that_replays(tiny, tmp_path):
    """app.py --record on a tiny engine: the trace holds the run, the steps, the load, and replays."""
    out = tmp_path / "session.jsonl"
    app = start_app(["--method", "draft", "--k", "3", "--target", str(tiny.target), "--draft", str(tiny.perturbed),
                     "--dtype", "float32", "--max-model-len", "1024", "--kv-cache-gib", "1", "--record", str(out)],
                    tmp_path / "app.log")
    try:
        try:
            client = wait_ready(app, engine_ready, timeout_s=300)
        except AppNotReady as e:
            pytest.fail(f"the app's engine never became ready: {e}")
        *_, live_line = client.predict("def add(a, b):", 0.0, 24, api_name="/run")
        client.predict(2, api_name="/set_load")
        time.sleep(3)
        client.predict(0, api_name="/set_load")
        time.sleep(1.5)
    finally:
        if not app.stop(timeout_s=60):
            pytest.fail("the app did not exit within 60 s of Ctrl-C")
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
