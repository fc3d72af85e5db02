"""The quantisation lens drawn: one pool of idle compute, spent by batching, speculation and quantisation (pure views).

Contract, from the backend's ``LensView`` (``engine_adapter.service.quant_lens``):
- ``lens_markdown(view)``: the variant in force, then one row per measured (variant, load):
  plain decoding's tokens/s per request against its roofline, and the speculative speedup; then
  per quantised variant the naive product of the two speedups against the measured combination,
  with the quantised target's text agreement with the full one (its own measurement, apart from
  speculation's guarantee);
- ``lens_figure(view)``: per comparison, four bars: quantisation alone, speculation alone, their product
  and what the two gave together (all over the full pair's plain decoding at that load), with the
  1.0x line: the product's bar stands above the measured one where the two spend the same pool;
- ``lens_key(view)``: what the figure shows, to redraw only when it changes.
"""

from __future__ import annotations

import plotly.graph_objects as go

from engine_adapter.engine_config import VARIANT_LABELS
from engine_adapter.service.backend import LensComparison, LensView

BAR_COLOURS = {
    "quantisation alone": "#8c564b",
    "speculation alone": "#1f77b4",
    "product": "#bbbbbb",
    "together": "#2ca02c",
}
HEIGHT = 320


def _label(variant: str) -> str:
    return VARIANT_LABELS.get(variant, variant)


def _fraction(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "not measured"


def lens_markdown(view: LensView) -> str:
    head = (
        f"The engine runs the **{_label(view.variant)}** at a background load of {view.load}. The presenter "
        "switches the model variant under Engine (a restart; the first switch to a quantised variant makes its "
        "copy, about 20 s for the packaged target) and measures the speedup at this load (above) at each: "
        "every measurement lands here."
    )
    if not view.points:
        return head + "\n\nNo measurement yet."
    lines = [
        head,
        "",
        "| model variant | load | plain tokens/s (per request) | roofline | of roofline | speculative speedup |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in view.points:
        roof = f"{p.roofline_tokens_per_s:.1f}" if p.roofline_tokens_per_s else "-"
        lines.append(
            f"| {_label(p.variant)} | {p.load} | {p.plain_tokens_per_s:.2f} | {roof} "
            f"| {_fraction(p.roofline_fraction)} | {p.speedup:.2f}x |"
        )
    lines += ["", "Roofline: the read bandwidth on the engine's cores over the bytes one plain step reads."]
    if view.comparisons:
        lines += [
            "",
            "| variant | load | quantisation alone | speculation alone | product | measured together | text agreement "
            "with the full target |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for c in view.comparisons:
            agree = f"{c.agreement:.1%}" if c.agreement is not None else "-"
            lines.append(
                f"| {_label(c.variant)} | {c.load} | {c.quant_gain:.2f}x | {c.spec_gain:.2f}x | {c.product:.2f}x "
                f"| **{c.measured:.2f}x** | {agree} |"
            )
        lines += ["", *(_sentence(c) for c in view.comparisons)]
    else:
        lines += ["", "Measure the full pair and a quantised variant at one load to see their speedups side by side."]
    return "\n".join(lines)


def _sentence(c: LensComparison) -> str:
    over = c.product / c.measured - 1 if c.measured else 0.0
    verdict = "overstates" if over > 0 else "understates"
    return (
        f"- At load {c.load}: quantisation alone {c.quant_gain:.2f}x, speculation alone {c.spec_gain:.2f}x; multiplied "
        f"{c.product:.2f}x, measured together {c.measured:.2f}x: the product {verdict} it by {abs(over):.0%}. "
        "Both spend the same idle compute: the time a step waits on reading the weights."
    )


def lens_key(view: LensView) -> tuple:
    return tuple((c.variant, c.load, round(c.measured, 4), round(c.product, 4)) for c in view.comparisons)


def lens_figure(view: LensView) -> go.Figure:
    fig = go.Figure()
    x = [f"{_label(c.variant)}, load {c.load}" for c in view.comparisons]
    series = {
        "quantisation alone": [c.quant_gain for c in view.comparisons],
        "speculation alone": [c.spec_gain for c in view.comparisons],
        "product": [c.product for c in view.comparisons],
        "together": [c.measured for c in view.comparisons],
    }
    for name, ys in series.items():
        fig.add_bar(
            name=name if name != "together" else "measured together",
            x=x,
            y=ys,
            marker_color=BAR_COLOURS[name],
            text=[f"{y:.2f}x" for y in ys],
            textposition="outside",
        )
    fig.add_hline(y=1.0, line=dict(color="#444", dash="dot", width=1))
    title = "Speedups over the full pair's plain decoding: multiplied, and measured together"
    if not view.comparisons:
        title = "No comparison yet: measure the full pair and a quantised variant at the same load"
    top = max((y for ys in series.values() for y in ys), default=1.0)
    fig.update_yaxes(range=[0, max(1.2, top * 1.18)])  # room for the labels above the bars
    fig.update_layout(
        title=dict(text=title, font=dict(size=13)),
        barmode="group",
        height=HEIGHT,
        margin=dict(l=50, r=20, t=50, b=40),
        template="plotly_white",
        yaxis_title="x plain decoding (full pair)",
        legend=dict(orientation="h", y=-0.2),
    )
    return fig
