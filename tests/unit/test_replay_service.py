"""ReplayService plays a recorded session at speed, refuses controls politely, exports the chart's CSV."""

from __future__ import annotations

import csv
import io

import pytest

from engine_adapter.records import RequestResult, Step
from engine_adapter.service.replay_service import ReplayService
from explorer.views.live_charts import chart_csv, live_chart_frame
from tests.support.trace_samples import CHART_COLUMNS, write_trace


class ManualClock:
    """A clock the test moves (seconds); ``sleep`` records each wait and moves the clock by it."""

    def __init__(self, t: float = 5000.0) -> None:
        self.t = t
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.t += seconds


async def test_replay_plays_at_speed(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path, n_steps=40, dt=0.1)  # 4 recorded seconds, a step every 0.1 s
    clock = ManualClock()
    svc = ReplayService(path, speed=8.0, clock=clock, sleep=clock.sleep)  # 0.5 s of wall time per pass
    assert svc.replay_info is not None and svc.status().state == "ready"
    clock.t += 0.265625  # 2.125 recorded seconds
    info = svc.replay_info
    assert info.position_s == pytest.approx(2.125) and info.loop == 0
    seen = svc.steps_since(clock() - 180)
    assert len(seen) == 21  # steps 1 to 21 (0.1 to 2.1 s): only what has been played
    assert all(s.t <= clock() + 1e-6 for s in seen)
    # the chart's time axis stays in recorded seconds: steps 0.1 apart, as recorded
    assert seen[-1].t - seen[-2].t == pytest.approx(0.1, abs=1e-3)
    assert seen[-1].t == pytest.approx(clock() - 0.025)  # 0.025 recorded seconds ago
    clock.t += 0.296875  # 4.5 recorded seconds: past the end, it loops
    assert svc.replay_info.loop == 1 and svc.replay_info.position_s == pytest.approx(0.5)
    assert len(svc.steps_since(clock() - 3.9)) == 39  # the end of pass 1 (34) and the start of pass 2 (5)
    # the load as recorded (4 from 2.0 s on), markers in the same frame as the steps
    assert all(n == 4 for _, n in svc.load_changes)
    # a foreground request plays step by step with its recorded timing / speed
    items = [x async for x in svc.stream("anything", max_tokens=1, temperature=0.0)]
    assert [type(x) for x in items] == [Step] * 4 + [RequestResult]
    assert clock.waits == pytest.approx([0.25 / 8] * 4 + [0.01 / 8])  # 4 steps 0.25 s apart, 0.01 s to the end
    assert items[-1].token_ids == [11, 21, 22, 30, 31, 32, 33, 34, 50]
    assert svc.reference is None  # no engine: the lossless check has no twin to run on


async def test_replay_refuses_controls_politely(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    clock = ManualClock()
    svc = ReplayService(path, speed=100.0, clock=clock)
    svc.start(None).result(timeout=1)
    assert "cannot change" in svc.replay_info.note
    await svc.set_background(30)
    assert "recorded one" in svc.replay_info.note
    assert svc.replay_prompt("") == "def add(a, b):"  # Run with no prompt plays the next recorded one
    assert svc.prom_history() == []
    with pytest.raises(RuntimeError, match="replay"):
        await svc.set_policy(None)
    clock.t += 0.05  # 5 recorded seconds at 100x: the whole trace has played
    changes = svc.policy_changes  # recorded, shown (once per pass played), never applied
    assert changes and all(c == {"kind": "fixed", "k": 1} for _, c in changes)


def test_csv_export_has_the_chart_columns(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path, n_steps=40, dt=0.1)
    clock = ManualClock()
    svc = ReplayService(path, speed=1000.0, loop=False, clock=clock)  # plays out at once, then holds
    clock.t += 0.05
    df = live_chart_frame(svc, clock())
    rows = list(csv.DictReader(io.StringIO(chart_csv(df))))
    assert list(rows[0])[: len(CHART_COLUMNS)] == CHART_COLUMNS
    assert {"pos1", "pos2", "pos3", "load"} <= set(rows[0])
    filled = [r for r in rows if r["k"]]
    assert filled and all(r["k"] == "3" for r in filled)
    assert sum(float(r["total_tokens_per_s"]) * 2 for r in filled) == pytest.approx(40 * 5)
    assert filled[-1]["load"] == "4"
