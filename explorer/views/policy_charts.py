"""Figures and tables for K under load: step time, the auto table, the slot auction.

Contract: pure functions from engine-neutral records (``CostModel``,
``EngineStep``, ``AutoTable``, K tables) to plotly figures or Markdown. They
read measured numbers only; with nothing measured yet they return an empty
figure that says so.

Units: step time in milliseconds on screen (seconds in the records); tokens
per step; tokens per second.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine_adapter.engine_config import KTable
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.k_policy import DRAFT_RISK, AutoTable, risk_weighed
from engine_adapter.records import EngineStep

HEIGHT = 300  # pixels
MAX_BATCH_SHOWN = 64  # batch sizes the auto table's K-by-batch chart shows
VERIFIED_TICKS = tuple(2**i for i in range(15))  # the step-time chart's x ticks, 1 to 16384
SHOWN_K_FACTOR = 0.02  # a K whose cells move its curve by this share or more is named in the subtitle


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(
        title=title, height=HEIGHT, xaxis_visible=False, yaxis_visible=False, margin=dict(l=40, r=10, t=40, b=30)
    )
    return fig


def operating_point(steps: Sequence[EngineStep]) -> tuple[float, float, float, float] | None:
    """Median (batch size, K, tokens per step, seconds per step) of recent steps."""
    if not steps:
        return None
    return (
        statistics.median(s.batch_size for s in steps),
        statistics.median(s.k for s in steps),
        statistics.median(s.num_tokens for s in steps),
        statistics.median(s.interval_s for s in steps),
    )


PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880")


def _add_cells_and_fit(fig: go.Figure, cost: CostModel) -> None:
    """Per K: the measured cells (markers, with their sample counts) and the curve the policies read
    (the fit scaled by that K's cells, ``CostModel.step_s``)."""
    pts = cost.points
    for i, k in enumerate(sorted({p.k for p in pts})):
        colour = PALETTE[i % len(PALETTE)]
        sel = [p for p in pts if p.k == k]
        fig.add_trace(
            go.Scatter(
                x=[p.num_tokens for p in sel],
                y=[p.step_s * 1e3 for p in sel],
                mode="markers",
                name=f"measured, K={k}",
                marker=dict(size=9, color=colour),
                legendgroup=str(k),
                text=[
                    f"{p.batch_size} requests x (K={p.k}+1): {p.num_tokens} tokens, "
                    f"{p.step_s * 1e3:.1f} ms (median of {p.samples} steps)"
                    for p in sel
                ],
                hovertemplate="%{text}<extra></extra>",
            )
        )
        # the model at this K: batch sizes 1..max measured, tokens = b (K + 1)
        bs = np.arange(1, max(p.batch_size for p in sel) + 1)
        fig.add_trace(
            go.Scatter(
                x=bs * (k + 1),
                y=[cost.step_s(int(b), k) * 1e3 for b in bs],
                mode="lines",
                line=dict(color=colour, dash="dot", width=1),
                legendgroup=str(k),
                name=f"model, K={k}",
                showlegend=False,
                hoverinfo="skip",
            )
        )


def _add_knee(fig: go.Figure, cost: CostModel) -> None:
    """The memory-bound region up to the knee, and the knee itself."""
    knee = max(cost.knee_tokens, 1.0)
    # on a log axis a shape's x is in data units but an annotation's x is log10 of
    # them (plotly), so the labels are placed here, not by add_vline/add_vrect
    label = dict(showarrow=False, yref="paper", xanchor="left")
    if cost.knee_tokens >= 1.5:
        fig.add_vrect(x0=1, x1=knee, fillcolor="#4c9be8", opacity=0.08, line_width=0)
        fig.add_annotation(
            text="memory-bound: extra tokens ride along", x=0.0, y=0.98, xref="x", yanchor="top", **label
        )
    else:
        fig.add_annotation(
            text="no flat region measured: every extra token costs", x=0.02, y=0.98, xref="paper", **label
        )
    fig.add_vline(x=knee, line=dict(color="#4c9be8", dash="dash"))
    fig.add_annotation(
        text=f"knee ≈ {cost.knee_tokens:.0f} tokens", x=math.log10(knee), y=0.02, xref="x", yanchor="bottom", **label
    )


def _add_operating_point(fig: go.Figure, recent: Sequence[EngineStep]) -> None:
    op = operating_point(recent)
    if op is None:
        return
    b, k, n, s = op
    fig.add_trace(
        go.Scatter(
            x=[max(n, 1)],
            y=[s * 1e3],
            mode="markers+text",
            name="now (last 5 s)",
            marker=dict(size=18, color="#e8554c", symbol="star"),
            text=[f"now: {b:.0f} req, K={k:.0f}"],
            textposition="top center",
        )
    )


def _fit_subtitle(cost: CostModel) -> str:
    # the drafter on its own line: the subtitle does not wrap, and one line overflowed the chart
    drafter = (
        f"<br>drafter {cost.draft_s * 1e3:.1f} ms + {cost.draft_s_per_req * 1e3:.2f} ms/request per position"
        if cost.draft_s or cost.draft_s_per_req
        else ""
    )
    if cost.first_s or cost.first_s_per_req:  # an idle drafter: none of it at K=0
        drafter += (
            f", first pass {cost.first_s * 1e3:.1f} ms + {cost.first_s_per_req * 1e3:.2f} ms/request (skipped at K=0)"
        )
    moved = ", ".join(
        f"K={k} ×{cost.k_factor(k):.2f}"
        for k in sorted({p.k for p in cost.points})
        if abs(cost.k_factor(k) - 1.0) >= SHOWN_K_FACTOR
    )
    return (
        f"fit: {cost.base_s * 1e3:.1f} ms flat, +{cost.slope_s * 1e3:.2f} ms per "
        f"token past the knee (rmse {cost.rmse_s * 1e3:.1f} ms){drafter}"
        + (f"<br>each K's curve over the fit, by its cells: {moved}" if moved else "")
    )


def step_time_figure(cost: CostModel | None, recent: Sequence[EngineStep], profiling: str | None = None) -> go.Figure:
    """Measured step time vs tokens verified: flat (memory-bound), then rising; knee and 'now' marked."""
    title = "Step time vs tokens verified per step (measured on this machine)"
    if cost is None or not cost.points:
        return _empty(title, profiling or "No cost model yet: profile the engine.")
    fig = go.Figure()
    _add_cells_and_fit(fig, cost)
    _add_knee(fig, cost)
    _add_operating_point(fig, recent)
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{_fit_subtitle(cost)}</sup>"),
        height=HEIGHT + 60,
        xaxis=dict(
            type="log",
            title="tokens verified per step = batch x (K+1)",
            tickvals=list(VERIFIED_TICKS),  # powers of two: plotly's log digits (8 9 1 2 3 ...) read as noise
            ticktext=[str(t) for t in VERIFIED_TICKS],
        ),
        yaxis=dict(title="ms per step", rangemode="tozero"),
        margin=dict(l=50, r=10, t=85, b=40),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def auto_figure(auto: AutoTable | None, batch_size: float, chosen_by: str) -> go.Figure:
    """The curve the auto table maximised at this batch size (the predicted rate, and the same
    weighed as K is chosen: ``k_policy.risk_weighed``), and K chosen per batch size."""
    title = "Auto table: expected tokens/s per request, E(K) / step time"
    if auto is None:
        return _empty(title, "Needs the cost model and some measured acceptance.")
    b = min(max(int(round(batch_size)), 1), len(auto.k_by_batch))
    rate = auto.rate[b - 1]
    weighed = risk_weighed(rate)
    ks = list(range(len(rate)))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.12)
    fig.add_trace(
        go.Scatter(x=ks, y=rate, mode="lines", line=dict(dash="dot", width=1), name="E(K)/step_s, predicted"), 1, 1
    )
    fig.add_trace(go.Scatter(x=ks, y=weighed, mode="lines+markers", name="as K is chosen"), 1, 1)
    best = auto.k_by_batch[b - 1]
    fig.add_trace(
        go.Scatter(
            x=[best],
            y=[weighed[best]],
            mode="markers",
            marker=dict(size=16, symbol="star", color="#e8554c"),
            name="chosen",
        ),
        1,
        1,
    )
    n = min(len(auto.k_by_batch), MAX_BATCH_SHOWN)
    fig.add_trace(
        go.Scatter(
            x=list(range(1, n + 1)), y=auto.k_by_batch[:n], mode="lines", line_shape="hv", name="K by batch size"
        ),
        1,
        2,
    )
    fig.add_trace(go.Scatter(x=[b], y=[best], mode="markers", marker=dict(size=14, color="#e8554c"), name="now"), 1, 2)
    alphas = ", ".join(f"{a:.2f}" for a in auto.alphas)
    subtitle = (
        f"{chosen_by}<br>measured acceptance per position α = [{alphas}]"  # lines: a subtitle does not wrap
        f"<br>each draft position weighed {DRAFT_RISK:.0%} down (dotted: unweighed)"
    )
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{subtitle}</sup>"),
        height=HEIGHT + 45,
        showlegend=False,
        margin=dict(l=50, r=10, t=115, b=60),
    )
    fig.update_xaxes(title_text=chosen_k_caption(auto, b), row=1, col=1)
    fig.update_yaxes(title_text="tokens/s per request", row=1, col=1)
    fig.update_xaxes(title_text="batch size (K chosen for each)", row=1, col=2)
    fig.update_yaxes(title_text="K", row=1, col=2, rangemode="tozero")
    return fig


def chosen_k_caption(auto: AutoTable, batch_size: int) -> str:
    """Why K is what it is at ``batch_size`` (1-based): the weighed curve's maximum, or, where the batch
    size's own maximum would make K rise with the batch size, what keeping it from rising costs
    (on the weighed curve, ``k_policy.risk_weighed``: the one K is chosen on)."""
    best = auto.k_by_batch[batch_size - 1]
    optimum = auto.optimum_by_batch[batch_size - 1] if auto.optimum_by_batch else best
    if optimum == best:
        return f"K (at batch size {batch_size}, K = {best} maximises)"
    rate = risk_weighed(auto.rate[batch_size - 1])
    gain = rate[optimum] / rate[best] - 1 if rate[best] > 0 else 0.0
    return (
        f"K (at batch size {batch_size}, K = {best}; K = {optimum} gives {gain:+.2%}"
        "<br>but K never rises with the batch size)"
    )


def auction_figure(steps: Sequence[EngineStep], foreground: str | None, rows: int = 8) -> go.Figure:
    """The latest auction step's (request x position) slots: score, admitted or denied."""
    title = "Slot auction: draft slots by survival probability (✓ admitted, ✗ denied)"
    decided = [s for s in steps if s.bids]
    if not decided:
        ran = [s for s in steps if s.auction_slots is not None]
        if not ran:
            return _empty(title, "No step has run under the auction yet.")
        last = ran[-1]  # the auction ran, but no request had drafts to bid with
        # <br>: a plotly annotation does not wrap, and one line overflows the panel
        return _empty(
            title,
            f"engine step {last.seq}: {last.batch_size} requests, none drafting: 0 slots admitted;"
            f"<br>the drafter proposes {last.auction_ceiling} next"
            "<br>(at 0 it idles; the requests it skips are caught up later, or draft across the gap)",
        )
    mine = [s for s in decided if foreground and any(b.request_id == foreground for b in s.bids)]
    step = (mine or decided)[-1]
    bids = sorted(step.bids, key=lambda b: (b.request_id != foreground,))[:rows]
    width = max(len(b.scores) for b in bids)
    z, text, labels = [], [], []
    for n, b in enumerate(bids):
        labels.append("your request" if b.request_id == foreground else f"neighbour {n + (0 if mine else 1)}")
        z.append([b.scores[i] if i < len(b.scores) else None for i in range(width)])
        text.append(
            [f"{b.scores[i]:.2f} {'✓' if i < b.admitted else '✗'}" if i < len(b.scores) else "" for i in range(width)]
        )
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"pos {i + 1}" for i in range(width)],
            y=labels,
            text=text,
            texttemplate="%{text}",
            zmin=0,
            zmax=1,
            colorscale="Blues",
            colorbar=dict(title="survival"),
        )
    )
    fig.update_layout(
        title=dict(
            text=f"{title}<br><sup>engine step {step.seq}: {step.batch_size} requests, "
            f"{step.auction_slots} of {sum(len(b.scores) for b in step.bids)} slots admitted; "
            f"the drafter proposes {step.auction_ceiling} next</sup>"
        ),
        height=HEIGHT,
        yaxis=dict(autorange="reversed"),
        margin=dict(l=110, r=10, t=70, b=40),
    )
    return fig


def table_in_force_markdown(
    table: KTable | None, batch_size: float | None, auction: bool, k_max: int, equal: bool = False
) -> str:
    """vLLM's rows with the one in force at the current batch size marked (``auction``: the slot
    auction's words instead; ``equal``: its slots shared alike)."""
    if auction and equal:
        return (
            f"**Equal slots:** each step the drafter proposes as many positions (up to {k_max}) as pay "
            "for their own cost, the auction counts how many slots pay for themselves, and those slots are "
            "shared alike between the drafting requests, whatever their predictability (grid below)."
        )
    if auction:
        return (
            f"**Slot auction:** each step the drafter proposes as many positions (up to {k_max}) as pay "
            f"for their own cost (K in the live charts), and each request keeps the positions the "
            f"auction admits (grid below)."
        )
    if not table:
        return "No K table in force."
    b = int(round(batch_size)) if batch_size else None
    lines = ["| start_bs | end_bs | K | |", "|---:|---:|---:|---|"]
    in_force = None
    if b:
        for i, (start, _end, _) in enumerate(table):
            if start <= b:
                in_force = i  # the last row starting at or below b: its K holds in any gap after it
    for i, (start, end, k) in enumerate(table):
        mark = ""
        if i == in_force:
            gap = b > end
            mark = f"◀ **in force** at batch size {b}" + (" (in the gap after this row: its K carries)" if gap else "")
        cells = [str(start), str(end), str(min(k, k_max))]
        if i == in_force:
            cells = [f"**{c}**" for c in cells]
        lines.append(f"| {' | '.join(cells)} | {mark} |")
    return "\n".join(lines)
