"""The ledger as a page shows it: labels instead of ids (a neighbour's id never reaches a page),
the 1.0x line, the counts above and below it, the table fastest first."""

from __future__ import annotations

from engine_adapter.ledger import LedgerRow
from engine_adapter.records import load_request_id
from engine_adapter.service.backend import SpeedSettings, SpeedupRow, SpeedupView
from explorer.views.ledger_view import (
    discount_share_figure,
    in_flight,
    ledger_figure,
    ledger_summary_markdown,
    ledger_table_markdown,
    row_labels,
    speedup_banner_markdown,
    speedup_probe_markdown,
)


def row(rid: str, owner: str, kind: str, first_t: float, accepted: int, plain_s: float | None) -> LedgerRow:
    return LedgerRow(
        request_id=rid,
        owner=owner,
        kind=kind,
        steps=10,
        num_drafted=30,
        num_accepted=accepted,
        num_reached=30,
        num_emitted=10 + accepted,
        decode_s=1.0,
        plain_s=plain_s,
        first_t=first_t,
        last_t=5.0,
        batch_size=4.0,
    )


CODE = load_request_id("code")
ROWS = [
    row("mine1", "you", "", 1.0, 27, 1.8),
    row("secretneighbour2", "neighbour", "", 2.0, 3, 0.7),
    row("secretneighbour1", "neighbour", "", 0.5, 15, 1.1),
    row(CODE, "load", "code", 0.1, 24, 1.5),
]


def test_labels_name_no_request() -> None:
    labels = row_labels(ROWS)
    assert labels == {
        CODE: "load: code",
        "secretneighbour1": "neighbour 1",
        "mine1": "your request",
        "secretneighbour2": "neighbour 2",
    }
    shown = ledger_figure(ROWS, True).to_json() + ledger_table_markdown(ROWS) + ledger_summary_markdown(ROWS, 0.9, True)
    assert "secretneighbour" not in shown and CODE not in shown and "mine1" not in shown


def test_the_picture_has_one_mark_per_request_and_the_plain_line() -> None:
    fig = ledger_figure(ROWS, True)
    marks = sorted((x, y) for trace in fig.data for x, y in zip(trace.x, trace.y))
    assert marks == sorted((r.predictability, r.speedup) for r in ROWS)
    assert [s.y0 for s in fig.layout.shapes] == [1.0]
    assert {t.name for t in fig.data} == {"you", "neighbours", "code"}


def test_the_summary_counts_who_is_above_and_below_plain() -> None:
    text = ledger_summary_markdown(ROWS, 0.93, True)
    assert "4 requests running: **3** at or above plain decoding's speed, **1** below" in text
    assert "min 0.70x, median 1.30x, max 1.80x" in text and "Jain's fairness index 0.93" in text
    assert "Speedups are *estimated*" in text
    unpriced = [row("x", "neighbour", "", 0, 1, None)]
    assert "speedups unknown (no cost model yet)" in ledger_summary_markdown(unpriced, None, False)


def test_the_table_lists_yours_first_then_the_fastest() -> None:
    lines = ledger_table_markdown(ROWS).splitlines()
    who = [line.split("|")[1].strip() for line in lines[2:]]
    assert who == ["your request", "load: code", "neighbour 1", "neighbour 2"]


def test_only_requests_seen_lately_are_in_flight() -> None:
    old = row("gone", "neighbour", "", 0.0, 1, 1.0)
    old = LedgerRow(**{**old.__dict__, "last_t": 1.0})
    assert [r.request_id for r in in_flight([*ROWS, old], 5.5)] == [r.request_id for r in ROWS]


def test_the_share_chart_stacks_each_group() -> None:
    fig = discount_share_figure({"code": [(0.0, 10), (5.0, 20)], "you": [(0.0, 5), (5.0, 0)]}, now=10.0, bin_s=5.0)
    assert [t.name for t in fig.data] == ["you", "code"]
    assert list(fig.data[1].y) == [2.0, 4.0] and list(fig.data[1].x) == [-10.0, -5.0]


def test_the_speed_measurement_as_every_page_sees_it() -> None:
    settings = SpeedSettings("a CPU, 2 cores", "bfloat16", "t / d", "draft", "auto table", 4, "today")
    rows = (SpeedupRow("code", 1.5, 1.2, 1.8, 2, 4.0, 6.0),)
    running = SpeedupView("running", 3, 8, 95.0, "repeat 1 of 2: story, auto table", rows, settings)
    text = speedup_probe_markdown(running)
    assert "run 3 of 8, about 1:35 left — repeat 1 of 2: story, auto table" in text
    assert "| code | 1.50x | 1.20-1.80x | 2 | 4.00 | 6.00 |" in text
    assert "for about 1:35 more" in speedup_banner_markdown(running)
    done = SpeedupView("done", 8, 8, None, "done", rows, settings)
    assert speedup_banner_markdown(done) == ""
    assert "Measured on a CPU, 2 cores, bfloat16; t / d; method draft, policy auto table; 4 background requests" in (
        speedup_probe_markdown(done)
    )
    assert "stopped:** the engine restarted" in speedup_probe_markdown(
        SpeedupView("failed", 2, 8, None, "the engine restarted", (), settings)
    )
