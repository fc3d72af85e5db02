"""The session recorder follows a backend and writes its session (a fake backend, its clock set by the test)."""

from __future__ import annotations

import collections
import json
import time

import pytest

from engine_adapter.records import EngineStep
from engine_adapter.service.engine_service import ServiceStatus
from engine_adapter.service.load import LoadStats
from engine_adapter.trace.format import (
    read_session,
)
from engine_adapter.trace.session_recorder import SessionRecorder
from tests.support.trace_samples import engine_step, request


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

        return ServiceStatus(
            state=self.state,
            progress=None,
            error=None,
            config=EngineConfig(method="draft", k=3),
            url="http://x",
            attached=False,
            generation=self.generation,
        )

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
    assert kinds == {
        "run": 1,
        "engine_step": 5,
        "load": 2,
        "policy": 1,
        "background": 1,
        "request": 1,
        "engine": 1,
        "summary": 1,
    }
    assert lines[0]["session"] and lines[0]["method"] == "draft" and lines[0]["k"] == 3
    assert lines[-1] == {"type": "summary", "wall_s": 3.0, "num_engine_steps": 5, "num_requests": 1, "total_tokens": 9}
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


def _until_stopped(rec: SessionRecorder, timeout_s: float = 5.0) -> None:
    t_end = time.monotonic() + timeout_s
    while rec.status().active and time.monotonic() < t_end:
        time.sleep(0.02)


def test_recording_stops_at_its_size_cap_and_says_so(tmp_path):
    svc = FakeService()
    svc.state = "ready"
    rec = SessionRecorder(svc, tmp_path / "rec.jsonl", poll_s=0.01, max_bytes=2000)
    assert rec.status().active and rec.status().error is None
    svc.steps += [engine_step(i, time.monotonic() + 0.01 * i) for i in range(1, 200)]
    rec.start()
    _until_stopped(rec)
    status = rec.status()
    rec.close()
    assert not status.active and "size cap of 2.0 KiB" in status.error and status.bytes_written >= 2000
    assert read_session(tmp_path / "rec.jsonl").steps  # what was written before the cap stays readable


def test_a_failed_write_stops_recording_and_says_why():
    svc = FakeService()
    svc.state = "ready"
    rec = SessionRecorder(svc, "/dev/full", poll_s=0.01)  # every write fails: no space left on device
    rec.start()
    _until_stopped(rec)
    status = rec.status()
    rec.close()
    assert not status.active and "No space left on device" in status.error
