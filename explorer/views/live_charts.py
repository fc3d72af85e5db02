"""Live charts of the engine under load, from the tap's server-wide steps.

Contract: ``bin_steps(steps, now, window_s, bin_s)`` turns ``EngineStep``
records into a pandas DataFrame with one row per time bin (``t`` in seconds
relative to ``now``, negative = past; ``bin_prom`` gives the same columns from
``/metrics`` snapshots); ``live_chart_frame(backend, now)`` is the frame the
page draws (tap steps, or ``/metrics`` when attached) with one more column,
``load``: the background load in force in each bin; ``chart_csv(df)`` is its
CSV text (empty cells = no data in that bin); ``live_figure(df, markers, fg)`` draws
the four panels as one plotly figure with shared time axis (``live_traces`` and
``marker_layout`` are its parts as plain, JSON-ready data: what ``live_chart_update`` sends a
page, which draws it itself every ``CHART_REFRESH_S``, ``assets/live_chart.js``):
1. K in force and effective K (drafts verified per drafting request), batch size;
2. tokens emitted and drafts accepted per request-step;
3. draft acceptance rate and acceptance per draft position;
4. total tokens/s and the foreground request's tokens/s.
Slider changes are vertical lines on every panel, so cause and effect line up.

Units: seconds (``WINDOW_S`` = the window every chart shows, ``BIN_S`` = one
bin), tokens per second, tokens per request-step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine_adapter.records import EngineStep

if TYPE_CHECKING:
    from engine_adapter.records import PromSnapshot
    from engine_adapter.service.backend import Backend

WINDOW_S = 180.0  # seconds of history every live chart (and its CSV) shows
BIN_S = 2.0  # seconds per bin
POSITION_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def bin_steps(
    steps: Sequence[EngineStep], now: float, window_s: float = WINDOW_S, bin_s: float = BIN_S
) -> pd.DataFrame:
    rows = []
    for s in steps:
        if now - s.t > window_s:
            continue
        row = {
            "bin": (s.t - now) // bin_s * bin_s + bin_s / 2,
            "k": s.k,
            "batch": s.batch_size,
            "emitted": s.num_emitted,
            "drafted": s.num_drafted,
            "accepted": s.num_accepted,
            "drafting": s.num_drafting,
            "wall": s.wall_s,
            "steps": 1,
        }
        for i, (acc, reached) in enumerate(zip(s.accepted_per_pos, s.reached_per_pos)):
            row[f"acc{i + 1}"] = acc
            row[f"reach{i + 1}"] = reached
        rows.append(row)
    if not rows:
        return pd.DataFrame()
    raw = pd.DataFrame(rows).fillna(0)
    df = raw.groupby("bin").agg({c: "mean" if c in ("k", "batch") else "sum" for c in raw.columns if c != "bin"})
    out = pd.DataFrame(index=df.index)
    out["k"] = df["k"]
    out["batch"] = df["batch"]
    out["effective_k"] = (df["drafted"] / df["drafting"]).where(df["drafting"] > 0)
    request_steps = df["batch"] * df["steps"]
    out["tokens_per_step"] = df["emitted"] / request_steps
    out["accepted_per_step"] = df["accepted"] / request_steps
    out["acceptance_rate"] = (df["accepted"] / df["drafted"]).where(df["drafted"] > 0)
    out["total_tokens_per_s"] = df["emitted"] / bin_s
    for col in df.columns:
        if col.startswith("acc") and col[3:].isdigit():
            i = col[3:]
            out[f"pos{i}"] = (df[col] / df[f"reach{i}"]).where(df[f"reach{i}"] > 0)
    # every bin of the window, empty ones as gaps: a line must not bridge idle time
    grid = [b * bin_s + bin_s / 2 for b in range(-int(window_s // bin_s), 0)]
    out = out.reindex(sorted(set(grid) | set(out.index)))
    return out.reset_index().rename(columns={"index": "t", "bin": "t"})


# each panel's (x axis, y axis) in the skeleton's layout; row 1's right axis is "y2"
PANEL_AXES = {1: ("x", "y"), 2: ("x2", "y3"), 3: ("x3", "y4"), 4: ("x4", "y5")}
BATCH_AXES = ("x", "y2")


def live_figure(
    df: pd.DataFrame,
    markers: Sequence[tuple[float, int]] = (),
    foreground: pd.DataFrame | None = None,
    window_s: float = WINDOW_S,
) -> go.Figure:
    layout = json.loads(_live_skeleton_json())  # a fresh copy: plotly's make_subplots costs ~50 ms a call
    layout["xaxis4"]["range"] = [-window_s, 0]
    shapes, annotations = marker_layout(markers, window_s)
    layout["shapes"] = shapes
    layout["annotations"] += annotations
    return go.Figure(data=live_traces(df, foreground), layout=layout)


def live_traces(df: pd.DataFrame, foreground: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """The live figure's traces as plotly dicts of plain lists (an empty bin is None: a gap)."""
    traces = _engine_traces(df) if not df.empty else []
    if foreground is not None and not foreground.empty:
        fg = dict(x=_values(foreground["t"]), y=_values(foreground["tokens_per_s"]), line=dict(color="#9467bd"))
        traces.append(_scatter(FOREGROUND_TRACE, PANEL_AXES[4], **fg))
    return traces


def marker_layout(
    markers: Sequence[tuple[float, int]], window_s: float = WINDOW_S
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(shapes, annotations) of the load changes in the window: one figure-high line each on the
    bottom time axis "x4", which every panel matches (add_vline would draw one shape per panel,
    about 50 ms each in plotly's Python layer), and its "load → n" label."""
    shown = [(t, n) for t, n in markers if -window_s <= t <= 0]
    line = dict(color="#e377c2", dash="dot", width=1)
    font = dict(size=10, color="#e377c2")
    shapes = [dict(type="line", xref="x4", yref="paper", x0=t, x1=t, y0=0, y1=1, line=line) for t, _ in shown]
    labels = [
        dict(x=t, xref="x4", y=1.0, yref="paper", yanchor="bottom", text=f"load → {n}", showarrow=False, font=font)
        for t, n in shown
    ]
    return shapes, labels


def live_chart_update(
    df: pd.DataFrame, markers: Sequence[tuple[float, int]], now: float, key: str = "", working: bool = False
) -> dict[str, Any]:
    """What a page needs to redraw its live chart: the engine's traces, the layout's shapes and
    annotations (the panels' titles, then the load markers), ``key`` (the same while the engine's
    data has not changed), ``working`` (requests are in flight: the time axis moves even while a
    long step, a large prefill, adds no data), and the server's ``now`` (the engine host's
    monotonic seconds, the token view's ``data-t`` clock), from which the page bins its own
    request's steps into the foreground trace."""
    shapes, labels = marker_layout(markers)
    titles = json.loads(_live_skeleton_json())["annotations"]
    update = {"now": now, "key": key, "working": working, "traces": live_traces(df)}
    return update | {"shapes": shapes, "annotations": titles + labels}


def _values(column: pd.Series) -> list[float | None]:
    return [None if pd.isna(v) else round(float(v), 4) for v in column]


@cache
def _live_skeleton_json() -> str:
    """The layout of the four empty panels (titles, axes, size, template) as JSON text."""
    fig = make_subplots(
        rows=4,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        specs=[[{"secondary_y": True}], [{}], [{}], [{}]],
        subplot_titles=(
            "K in force, effective K and batch size",
            "per request-step: tokens emitted and drafts accepted",
            "draft acceptance rate and acceptance per draft position",
            "throughput (tokens/s)",
        ),
    )
    fig.update_xaxes(title_text="seconds (0 = now)", row=4, col=1)
    fig.update_yaxes(range=[0, 1.05], row=3, col=1)
    fig.update_layout(
        height=760,
        margin=dict(l=50, r=50, t=40, b=40),
        template="plotly_white",
        legend=dict(orientation="h", y=-0.08),
        uirevision="live",
    )
    return fig.layout.to_json()


FOREGROUND_TRACE = "foreground tokens/s"  # the page's own request (assets/live_chart.js draws it by this name)


def _scatter(name: str, axes: tuple[str, str], **kw: Any) -> dict[str, Any]:
    return dict(type="scatter", name=name, xaxis=axes[0], yaxis=axes[1], **kw)


def _engine_traces(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The engine's traces, each on its panel's axes; the batch size on row 1's right axis."""
    t = _values(df["t"])

    def line(name: str, axes: tuple[str, str], column: str, **style: Any) -> dict[str, Any]:
        return _scatter(name, axes, x=t, y=_values(df[column]), line=style)

    traces = [
        line("K in force", PANEL_AXES[1], "k", shape="hv", color="#444"),
        line("effective K", PANEL_AXES[1], "effective_k", color="#1f77b4"),
        line("batch size", BATCH_AXES, "batch", color="#aaa", dash="dot"),
        line("tokens / request-step", PANEL_AXES[2], "tokens_per_step", color="#2ca02c"),
        line("accepted / request-step", PANEL_AXES[2], "accepted_per_step", color="#1f77b4", dash="dash"),
        line("draft_acceptance_rate", PANEL_AXES[3], "acceptance_rate", color="#000", width=3),
    ]
    for col in [c for c in df.columns if c.startswith("pos")]:
        i = int(col[3:])
        colour = POSITION_COLOURS[(i - 1) % len(POSITION_COLOURS)]
        traces.append(line(f"position {i}", PANEL_AXES[3], col, color=colour, width=1))
    traces.append(line("total tokens/s", PANEL_AXES[4], "total_tokens_per_s", color="#d62728"))
    return traces


def bin_prom(snapshots: Sequence[PromSnapshot], now: float, window_s: float = WINDOW_S) -> pd.DataFrame:
    """The same columns as ``bin_steps`` from ``/metrics`` snapshots (attach mode: no tap).

    Each pair of consecutive snapshots (about a second apart) is one row. What
    /metrics cannot give per step (K in force, tokens per request-step) is
    estimated from counters: effective K = draft tokens / drafts, tokens per
    request-step ~ mean_acceptance_length.
    """
    rows = []
    for a, b in zip(snapshots, snapshots[1:]):
        if now - b.t > window_s:
            continue
        d = b - a
        row = {
            "t": b.t - now,
            "k": d.effective_k,
            "batch": b.running,
            "effective_k": d.effective_k,
            "tokens_per_step": d.mean_acceptance_length,
            "accepted_per_step": (d.mean_acceptance_length - 1) if d.mean_acceptance_length else None,
            "acceptance_rate": d.draft_acceptance_rate,
            "total_tokens_per_s": d.generation_tokens_per_second,
        }
        for i, p in enumerate(d.per_position_acceptance):
            row[f"pos{i + 1}"] = p
        rows.append(row)
    return pd.DataFrame(rows)


FRESH_S = 5.0  # seconds: a step newer than this is "the engine is doing something" for the redraw key
# seconds between two redraws of a page's charts (the live charts, the K-policy panel's) while the engine
# works: each redraw costs the browser's renderer and the engine shares the machine's two cores with it
# (chromium's share of a core falls by about a quarter from 1 s to 2 s: docs/benchmarks.md,
# "what the live charts cost the token view")
CHART_REFRESH_S = 2.0
# while the page's own request streams (a step of it newer than STREAMING_GAP_S), the K-policy panel's
# charts and the ledger's wait for the request's end: a Gradio redraw holds the browser's main thread
# for 100-400 ms on 2 cores (over a second at background load 16), and the token view the reader is
# watching would wait behind it (docs/benchmarks.md, UI latency)
STREAMING_GAP_S = 2.0


def streaming(now: float, foreground_steps: Sequence[tuple[float, int]]) -> bool:
    """Whether the page's own request is streaming: a step of it in the last ``STREAMING_GAP_S``.
    ``foreground_steps``: (monotonic t, tokens) of the page's current request's steps, oldest first."""
    return bool(foreground_steps) and now - foreground_steps[-1][0] < STREAMING_GAP_S


def engine_activity(backend: Backend, now: float) -> tuple:
    """What has happened on the engine lately, as a key that changes whenever a chart of it would:
    the newest engine step (or /metrics sample, attached), and the newest load change. A page's
    timer redraws its charts only when this differs from what it drew last: an idle engine's
    charts are left as they are, instead of being rebuilt and redrawn every second (an idle page
    took most of a core between chromium and the app: docs/benchmarks.md, "what the page costs")."""
    if backend.status().attached:
        prom = backend.prom_history()
        newest = prom[-1].t if prom else None
    else:
        recent = backend.steps_since(now - FRESH_S)
        newest = recent[-1].seq if recent else None
    changes = backend.load_changes
    return (newest, changes[-1] if changes else None, backend.status().generation)


def live_chart_frame(backend: Backend, now: float | None = None, window_s: float = WINDOW_S) -> pd.DataFrame:
    """The frame the live chart draws, plus ``load``: the background load in force in each bin."""
    now = time.monotonic() if now is None else now
    if backend.status().attached:  # no tap: server-wide counters from /metrics
        df = bin_prom(backend.prom_history(), now, window_s)
    else:
        df = bin_steps(backend.steps_since(now - window_s), now, window_s)
    if df.empty:
        df = bin_steps([], now, window_s)
    if "t" in df.columns:
        changes = sorted((t - now, n) for t, n in backend.load_changes)
        df = df.copy()
        df["load"] = [next((n for t_c, n in reversed(changes) if t_c <= t), 0) for t in df["t"]]
    return df


def chart_csv(df: pd.DataFrame) -> str:
    """``df`` as CSV (``t`` = seconds, 0 = now)."""
    return df.to_csv(index=False, float_format="%.6g")
