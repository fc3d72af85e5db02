"""ReplayService plays a recorded session at speed, refuses controls politely, exports the chart's CSV."""

from __future__ import annotations

import csv
import io
import time

import pytest

from engine_adapter.records import RequestResult, Step
from engine_adapter.service.replay_service import ReplayService
from explorer.views.live_charts import chart_csv, live_chart_frame
from tests.support.trace_samples import CHART_COLUMNS, write_trace


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
    assert list(rows[0])[: len(CHART_COLUMNS)] == CHART_COLUMNS
    assert {"pos1", "pos2", "pos3", "load"} <= set(rows[0])
    filled = [r for r in rows if r["k"]]
    assert filled and all(r["k"] == "3" for r in filled)
    assert sum(float(r["total_tokens_per_s"]) * 2 for r in filled) == pytest.approx(40 * 5)
    assert filled[-1]["load"] == "4"
