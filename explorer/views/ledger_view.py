"""The ledger drawn: who gets the discount, request by request (pure views).

Contract, from ``engine_adapter.ledger``'s rows and series, never a request's text or id:
- ``in_flight(rows, newest_t)``: the rows of requests still running at the newest step;
- ``row_labels(rows)``: "your request", "neighbour N" (by first step), "load: <kind>";
- ``ledger_figure(rows, estimated)``: predictability against speedup, one mark per request,
  coloured by its group (``GROUP_COLOURS``), the 1.0x line drawn;
- ``discount_share_figure(series)``: accepted drafts (tokens gained) per group over time;
- ``ledger_summary_markdown(rows, jain, estimated)`` and ``ledger_table_markdown(rows)``;
- ``speedup_probe_markdown(view)``: the page's speed measurement (progress, then its table with
  the settings line); ``speedup_banner_markdown(view)``: every page's notice while it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

import plotly.graph_objects as go

from engine_adapter.ledger import LedgerRow, owner_kind_label
from engine_adapter.service.backend import SpeedupView

HEIGHT = 340
IN_FLIGHT_S = 2.0  # a request seen this close to the newest step is still running
TABLE_ROWS = 12
GROUP_COLOURS = {
    "you": "#d62728",
    "neighbours": "#7f7f7f",
    "code": "#1f77b4",
    "math": "#9467bd",
    "qa": "#17becf",
    "story": "#ff7f0e",
    "summarisation": "#8c564b",
    "translation": "#2ca02c",
    "load": "#bcbd22",
}
ESTIMATE_NOTE = (
    "the request's tokens times the cost model's plain (K=0) step time at that batch size, "
    "over the time its steps took (decode steps only)"
)


def in_flight(rows: Sequence[LedgerRow], newest_t: float) -> list[LedgerRow]:
    return [r for r in rows if newest_t - r.last_t <= IN_FLIGHT_S]


def row_labels(rows: Sequence[LedgerRow]) -> dict[str, str]:
    """request id -> its label on the page (neighbours numbered by their first step)."""
    labels: dict[str, str] = {}
    neighbours = 0
    for r in sorted(rows, key=lambda r: r.first_t):
        if r.owner == "you":
            labels[r.request_id] = "your request"
        elif r.owner == "neighbour":
            neighbours += 1
            labels[r.request_id] = f"neighbour {neighbours}"
        else:
            labels[r.request_id] = f"load: {r.kind or 'mixed'}"
    return labels


def _group(r: LedgerRow) -> str:
    return owner_kind_label(r.owner, r.kind)


def ledger_figure(rows: Sequence[LedgerRow], estimated: bool) -> go.Figure:
    title = "Who gets the discount: one mark per request running"
    fig = go.Figure()
    labels = row_labels(rows)
    shown = [r for r in rows if r.predictability is not None and r.speedup is not None]
    for group in sorted({_group(r) for r in shown}, key=lambda g: (g != "you", g)):
        mine = [r for r in shown if _group(r) == group]
        fig.add_trace(
            go.Scatter(
                x=[r.predictability for r in mine],
                y=[r.speedup for r in mine],
                mode="markers",
                name=group,
                marker=dict(
                    color=GROUP_COLOURS.get(group, "#333333"),
                    size=[14 if r.owner == "you" else 9 for r in mine],
                    symbol=["star" if r.owner == "you" else "circle" for r in mine],
                    line=dict(width=1, color="white"),
                ),
                text=[labels[r.request_id] for r in mine],
                customdata=[[r.drafts_per_step, r.tokens_per_step, r.batch_size] for r in mine],
                hovertemplate="%{text}<br>predictability %{x:.2f}<br>speedup %{y:.2f}x"
                "<br>drafts granted per step %{customdata[0]:.1f}<br>tokens per step %{customdata[1]:.2f}"
                "<br>batch size %{customdata[2]:.0f}<extra></extra>",
            )
        )
    fig.add_hline(y=1.0, line=dict(color="black", dash="dash", width=1), annotation_text="plain decoding (1.0x)")
    note = (
        "speedup estimated: its tokens x plain step time / its steps' time"
        if estimated
        else ("no cost model: no speedup to show")
    )
    if not shown:
        fig.add_annotation(
            text="No request has verified drafts in the last seconds." if estimated else note,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
        )
    top = max([2.0, *(r.speedup * 1.1 for r in shown if r.speedup is not None)])
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{note}</sup>"),
        height=HEIGHT,
        xaxis=dict(title="predictability (drafts kept / verified)", range=[-0.03, 1.03]),
        yaxis=dict(title="speedup over plain decoding", range=[0, top]),
        legend=dict(orientation="h", y=-0.25),
        margin=dict(l=60, r=10, t=70, b=40),
    )
    return fig


def discount_share_figure(series: dict[str, list[tuple[float, int]]], now: float, bin_s: float) -> go.Figure:
    """Accepted drafts per group, stacked, against seconds before now."""
    fig = go.Figure()
    for group in sorted(series, key=lambda g: (g != "you", g)):
        points = series[group]
        fig.add_trace(
            go.Scatter(
                x=[t - now for t, _ in points],
                y=[n / bin_s for _, n in points],
                name=group,
                mode="lines",
                stackgroup="one",
                line=dict(color=GROUP_COLOURS.get(group, "#333333"), width=0.5),
                hovertemplate=f"{group}: %{{y:.1f}} accepted drafts/s<extra></extra>",
            )
        )
    if not series:
        fig.add_annotation(text="No requests yet.", xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False)
    fig.update_layout(
        title=dict(
            text="Where the discount goes<br><sup>accepted drafts per second (tokens gained), by who asked</sup>"
        ),
        height=HEIGHT,
        xaxis=dict(title="seconds ago"),
        yaxis=dict(title="accepted drafts / s", rangemode="tozero"),
        legend=dict(orientation="h", y=-0.25),
        margin=dict(l=60, r=10, t=50, b=40),
    )
    return fig


def ledger_summary_markdown(rows: Sequence[LedgerRow], jain: float | None, estimated: bool) -> str:
    if not rows:
        return "**Ledger:** no request is running."
    speedups = [r.speedup for r in rows if r.speedup is not None]
    head = f"**Ledger:** {len(rows)} request{'s' if len(rows) != 1 else ''} running"
    if not speedups:
        why = "no cost model yet" if not estimated else "none has a decode step yet"
        return f"{head}; speedups unknown ({why})."
    above = sum(1 for s in speedups if s >= 1.0)
    return (
        f"{head}: **{above}** at or above plain decoding's speed, **{len(speedups) - above}** below. "
        f"Speedup min {min(speedups):.2f}x, median {median(speedups):.2f}x, max {max(speedups):.2f}x; "
        f"Jain's fairness index {jain:.2f} (1: everyone alike). Speedups are *estimated*: {ESTIMATE_NOTE}."
    )


def ledger_table_markdown(rows: Sequence[LedgerRow]) -> str:
    """The requests, fastest first (at most ``TABLE_ROWS``; the rest counted)."""
    if not rows:
        return ""
    labels = row_labels(rows)
    ranked = sorted(rows, key=lambda r: (r.owner != "you", -(r.speedup or 0.0)))
    lines = [
        "| who | predictability | drafts granted / step | tokens / step | speedup |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in ranked[:TABLE_ROWS]:
        pred = f"{r.predictability:.2f}" if r.predictability is not None else "–"
        speed = f"{r.speedup:.2f}x" if r.speedup is not None else "–"
        per_step = f"{r.drafts_per_step:.1f} | {r.tokens_per_step:.2f}"
        lines.append(f"| {labels[r.request_id]} | {pred} | {per_step} | {speed} |")
    if len(ranked) > TABLE_ROWS:
        lines.append(f"\n…and {len(ranked) - TABLE_ROWS} more.")
    return "\n".join(lines)


def speedup_probe_markdown(view: SpeedupView) -> str:
    """The page's speed measurement: its progress, or its table with the settings line."""
    if view.state == "idle":
        return view.message or (
            "No speed measurement yet. It alternates plain decoding (K=0 for everyone) and the policy "
            "in force on one prompt of each task kind, under the load as it is."
        )
    if view.state == "running":
        left = f", about {_clock(view.expected_end_s)} left" if view.expected_end_s is not None else ""
        runs = f"run {view.done_runs} of {view.total_runs}{left}"
        return f"⏱ **Measuring the speedup at this load**: {runs} — {view.message}." + _table(view)
    if view.state == "failed":
        return f"✕ **The speed measurement stopped:** {view.message}." + _table(view)
    head = "**Speedup at this load, measured** (each task's decode rate under the policy over plain decoding's)"
    return head + _table(view)


def _table(view: SpeedupView) -> str:
    return "\n\n" + view.markdown() if view.rows else ""


def speedup_banner_markdown(view: SpeedupView) -> str:
    """Every page's notice while a speed measurement runs ("" otherwise)."""
    if view.state != "running":
        return ""
    left = f" for about {_clock(view.expected_end_s)} more" if view.expected_end_s is not None else ""
    return (
        f"⏱ **A speed measurement is running**{left} (the presenter's): the K policy switches between "
        "plain decoding and the policy in force at each of its requests, for every visitor's requests too."
    )


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}"
