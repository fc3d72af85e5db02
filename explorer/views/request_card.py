"""The per-request card: vLLM's numbers for one request, each explained.

Contract: pure functions from adapter records to Markdown text and plotly
figures. Three numbers that must never be confused sit side by side, each
with a one-line meaning:
- draft_acceptance_rate  = accepted / drafted
- mean_acceptance_length = 1 + accepted / verify steps (includes the target's token)
- alpha (per-token acceptance) = accepted / draft positions actually tested
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from engine_adapter.acceptance import alpha_from_histogram, per_position_acceptance
from engine_adapter.provenance import drafted_across_hole
from engine_adapter.records import RequestResult, Step
from engine_adapter.service.backend import SpeedSettings

CARD_CHART_HEIGHT = 220  # pixels


def _layout() -> dict[str, object]:
    """The two card charts' shared layout (a fresh dict each time: no module-level mutable state)."""
    return dict(height=CARD_CHART_HEIGHT, margin=dict(l=40, r=10, t=36, b=36), template="plotly_white")


def card_markdown(
    result: RequestResult | None, live_steps: Sequence[Step] = (), settings: SpeedSettings | None = None
) -> str:
    """The request's numbers; ``settings``: what its speed depends on, said under the speed."""
    if result is None:
        n = sum(len(s.emitted) for s in live_steps)
        return f"**Generating…** {n} tokens so far." if live_steps else "Run a prompt to see its numbers."
    m = result.spec_decode_metrics
    lines = [
        f"**{len(result.token_ids)} tokens** in {result.t_end - result.t_start:.2f} s = "
        f"**{result.tokens_per_second:.2f} tokens/s** for this request "
        f"(finish: {result.finish_reason}; provenance: {result.provenance}).",
    ]
    if settings is not None:
        lines.append(f"*Measured on* {settings.line()}.")
    if m is None:
        lines.append("Speculation is off: every token was computed by the target, one per step.")
        return "\n\n".join(lines)
    k = m["num_spec_tokens"]
    alpha = alpha_from_histogram(m["acceptance_histogram"], k)
    lines += [
        f"- **draft_acceptance_rate = {m['draft_acceptance_rate']:.3f}** — share of all drafted tokens "
        "the target kept.",
        f"- **mean_acceptance_length = {m['mean_acceptance_length']:.3f}** — tokens gained per verify step, "
        "counting the target's own token (1.0 = no gain).",
        f"- **per-token acceptance α = {alpha:.3f}** — chance one draft token is kept, given those before "
        "it were (from the histogram: accepted ÷ positions tested).",
        f"- num_spec_steps **{m['num_spec_steps']}** verify steps · drafted **{m['num_draft_tokens']}** · "
        f"accepted **{m['num_accepted_draft_tokens']}** · num_spec_tokens (K) **{k}**{_k_in_force(result, k)}.",
    ]
    if result.num_relaxed:
        kept = m["num_accepted_draft_tokens"] - result.num_relaxed
        lines.append(
            f"- ⚠ **of the {m['num_accepted_draft_tokens']} accepted, {result.num_relaxed} were relaxed-only**: kept "
            f"by the lossy acceptance rule, rejected by vLLM's own; without them {kept} of {m['num_draft_tokens']} "
            f"drafts ({kept / max(m['num_draft_tokens'], 1):.3f}) were kept. vLLM's numbers above count them."
        )
    lines += _drafter_holes(result.steps)
    return "\n\n".join(lines[:1]) + "\n\n" + "\n".join(lines[1:])


def _drafter_holes(steps: Sequence[Step]) -> list[str]:
    """Per hole an idle draft model left in this request: when it opened, and when it was caught
    up, or drafted across, or neither."""
    lines, opened = [], None
    across = sorted(drafted_across_hole(steps))
    for s in steps:
        if s.drafter_idle and opened is None:
            opened = s.index
        if s.caught_up:
            since = f" (K was 0 at step {opened}: the draft model skipped this request)" if opened is not None else ""
            lines.append(
                f"- **drafter caught up {s.caught_up} tokens at step {s.index}**{since}: it re-ran the tokens it "
                f"had missed, and drafts for this request again from step {s.index + 1}."
            )
            opened = None
    first_across = next((i for i in across if opened is not None and i > opened), None)
    if opened is not None and first_across is not None:
        lines.append(
            f"- **drafter idle from step {opened}, drafting across the hole from step {first_across}**: the load "
            "put K at 0 and the draft model skipped this request; the hole grew past the catch-up budget, so it "
            "was never re-run. The draft model drafts on from this request's own text with the skipped tokens "
            "blank (zeros in its KV cache): fewer of its drafts are kept, and none carries another request's text."
        )
    elif opened is not None:
        lines.append(
            f"- **drafter idle from step {opened}**: the load put K at 0, the draft model skipped this request "
            f"to save its cost and had not caught up when the request ended (the last "
            f"{sum(len(s.emitted) for s in steps if s.index >= opened)} tokens came from the target alone)."
        )
    return lines


def _k_in_force(result: RequestResult, num_spec_tokens: int) -> str:
    """Under a live K policy vLLM's num_spec_tokens is the engine's maximum, not the K
    this request's steps ran with: say which K they did run with, when it differs."""
    if result.provenance != "tap":  # without the tap a step's K is inferred, not the scheduler's
        return ""
    ks = sorted({s.k for s in result.steps if s.index > 0})  # step 0 is the prefill
    if not ks or ks == [num_spec_tokens]:
        return ""
    shown = str(ks[0]) if len(ks) == 1 else f"{ks[0]}–{ks[-1]}"
    return f" (the engine's maximum; K in force for this request's steps: **{shown}**)"


def why_no_drafts(result: RequestResult | None, running: bool = False) -> str | None:
    """Why a request's draft charts are empty (None: they are not); ``running``: no result yet
    because the request is still generating (its charts are drawn once, when it ends)."""
    if result is None:
        return "Drawn when this request ends." if running else "Run a prompt to see this chart."
    m = result.spec_decode_metrics
    if m is None:
        return "Speculation is off: no drafts to count."
    if not m["num_spec_steps"]:
        if len(result.steps) <= 1:  # the prefill's token only
            return "The request ended at its first token:<br>no draft was tested."
        return "No verify steps: K was 0 in every step<br>of this request, so no draft was tested."
    return None


def _say(fig: go.Figure, text: str) -> None:
    """An empty chart says why, in its middle (instead of bare axes)."""
    fig.add_annotation(
        text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=12, color="#555")
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)


def histogram_figure(result: RequestResult | None, running: bool = False) -> go.Figure:
    fig = go.Figure()
    m = result.spec_decode_metrics if result else None
    fig.update_layout(title="acceptance_histogram", xaxis_title="j accepted drafts", yaxis_title="steps", **_layout())
    if why := why_no_drafts(result, running):
        _say(fig, why)
        return fig
    hist = m["acceptance_histogram"]
    fig.add_bar(
        x=[str(j) for j in range(len(hist))],
        y=hist,
        marker_color="#4c8bd6",
        hovertemplate="%{y} steps accepted %{x} drafts<extra></extra>",
    )
    return fig


def position_figure(result: RequestResult | None, running: bool = False) -> go.Figure:
    fig = go.Figure()
    m = result.spec_decode_metrics if result else None
    fig.update_layout(
        title="P(kept) per draft position, when reached",
        xaxis_title="draft position",
        yaxis=dict(range=[0, 1.05], title="P(kept)"),
        **_layout(),
    )
    why = why_no_drafts(result, running)
    if why is None and not m.get("per_step_accepted"):
        why = f"No per-step drafts recorded for this request<br>(provenance: {result.provenance})."
    if why:
        _say(fig, why)
        return fig
    rates = per_position_acceptance(m["per_step_accepted"], m["per_step_drafted"], m["num_spec_tokens"])
    fig.add_bar(
        x=[str(i + 1) for i in range(len(rates))],
        y=[r if r is not None else 0 for r in rates],
        marker_color="#e08a2e",
        hovertemplate="position %{x}: kept %{y:.2f} of the times it was reached<extra></extra>",
    )
    return fig
