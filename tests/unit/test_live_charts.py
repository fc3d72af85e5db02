"""explorer/views/live_charts.py: each trace on its panel's axes, one figure-high line per slider change."""

from __future__ import annotations

import pandas as pd
import pytest

from explorer.views.live_charts import STREAMING_GAP_S, WINDOW_S, live_chart_update, live_figure, streaming


def _frame(positions: int = 2) -> pd.DataFrame:
    t = [-5.0, -3.0, -1.0]
    cols = dict(k=3.0, effective_k=2.5, batch=4.0, tokens_per_step=2.0, accepted_per_step=1.0, acceptance_rate=0.5)
    cols |= {f"pos{i}": 0.7 for i in range(1, positions + 1)}
    return pd.DataFrame({"t": t, **cols, "total_tokens_per_s": 9.0})


FOREGROUND = pd.DataFrame({"t": [-3.0, -1.0], "tokens_per_s": [4.0, 5.0]})


@pytest.mark.parametrize(
    "name, axes",
    [
        ("K in force", ("x", "y")),
        ("effective K", ("x", "y")),
        ("batch size", ("x", "y2")),  # the first panel's right axis
        ("tokens / request-step", ("x2", "y3")),
        ("accepted / request-step", ("x2", "y3")),
        ("draft_acceptance_rate", ("x3", "y4")),
        ("position 1", ("x3", "y4")),
        ("position 2", ("x3", "y4")),
        ("total tokens/s", ("x4", "y5")),
        ("foreground tokens/s", ("x4", "y5")),
    ],
)
def test_each_trace_is_drawn_on_its_panel(name, axes):
    fig = live_figure(_frame(), (), FOREGROUND)
    trace = next(d for d in fig.data if d.name == name)
    assert (trace.xaxis, trace.yaxis) == axes
    assert fig.layout[axes[1].replace("y", "yaxis")] is not None


def test_the_panels_share_the_bottom_time_axis_over_the_window():
    fig = live_figure(_frame())
    assert tuple(fig.layout.xaxis4.range) == (-WINDOW_S, 0)
    assert [fig.layout[a].matches for a in ("xaxis", "xaxis2", "xaxis3")] == ["x4"] * 3
    assert fig.layout.yaxis2.overlaying == "y"


@pytest.mark.parametrize(
    "markers, lines",
    [
        ([], []),
        ([(-10.0, 16)], [(-10.0, "load → 16")]),
        ([(-10.0, 16), (-2.0, 0)], [(-10.0, "load → 16"), (-2.0, "load → 0")]),
        ([(-WINDOW_S - 1, 4), (-1.0, 8)], [(-1.0, "load → 8")]),  # older than the window: not drawn
        ([(0.5, 4)], []),  # in the future (a clock step): not drawn
    ],
)
def test_slider_changes_are_one_line_through_every_panel(markers, lines):
    fig = live_figure(_frame(), markers)
    shapes = fig.layout.shapes
    assert [(s.x0, s.xref, s.yref, s.y0, s.y1) for s in shapes] == [(t, "x4", "paper", 0, 1) for t, _ in lines]
    labels = [(a.x, a.text) for a in fig.layout.annotations if a.text.startswith("load")]
    assert labels == lines


def test_an_empty_window_still_draws_the_four_titled_panels():
    fig = live_figure(pd.DataFrame())
    assert len(fig.data) == 0
    assert len([a for a in fig.layout.annotations if not a.text.startswith("load")]) == 4


def test_figures_do_not_share_layout_state():
    first = live_figure(_frame(), [(-3.0, 2)])
    first.layout.annotations[0].text = "changed"
    second = live_figure(_frame())
    assert second.layout.annotations[0].text != "changed"
    assert len(second.layout.shapes) == 0


@pytest.mark.parametrize(
    "foreground_steps, is_streaming",
    [
        ([], False),
        ([(90.0, 1), (99.0, 2)], True),
        ([(90.0, 1), (100.0 - STREAMING_GAP_S, 2)], False),  # quiet for the whole gap: ended (or stopped)
    ],
)
def test_a_page_streams_while_its_request_has_recent_steps(foreground_steps, is_streaming):
    assert streaming(100.0, foreground_steps) is is_streaming


def test_the_pages_update_is_plain_json_with_gaps_as_null_and_the_markers_after_the_titles():
    import json

    df = _frame()
    df.loc[1, "acceptance_rate"] = float("nan")  # a bin with no drafts: a gap, not a zero
    update = live_chart_update(df, [(-2.0, 8)], now=1234.5, key="k1")
    text = json.dumps(update, allow_nan=False)  # a browser's JSON.parse takes no NaN
    assert json.loads(text)["now"] == 1234.5 and update["key"] == "k1"
    rate = next(t for t in update["traces"] if t["name"] == "draft_acceptance_rate")
    assert rate["y"] == [0.5, None, 0.5] and rate["x"] == [-5.0, -3.0, -1.0]
    assert [(t["name"], t["xaxis"], t["yaxis"]) for t in update["traces"]] == [
        (d.name, d.xaxis, d.yaxis) for d in live_figure(df).data
    ]
    assert [a["text"] for a in update["annotations"]][-1] == "load → 8" and len(update["annotations"]) == 5
    assert [s["x0"] for s in update["shapes"]] == [-2.0]
