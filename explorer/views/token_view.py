"""The token provenance view's value: adapter ``Step`` records as the markup its template shows.

Contract: ``token_view_value(steps, ...)`` turns adapter ``Step`` records into
the value the template (``assets/token_view.html``, drawn by
``explorer.components.TokenView``) renders: ``html``, the steps' markup in one
string (``step_html`` per step: a ``tv-step`` span of ``tv-tok k-<kind>`` spans,
rejected drafts last, each with its tooltip in ``data-tip``), ``steps`` (how
many), and the prompt, message, level, streaming flag and footer; every string
(token text, tooltips, messages) is made inert here by ``inert()``, before it
reaches the template, which inserts them raw (``{{{...}}}``) for that reason. Inert means more than
HTML-escaped: Gradio evaluates the Handlebars output as a JavaScript template
literal, so ``$``, backtick and backslash become HTML entities too (a token
``${alert(1)}`` must print, never run).
Whitespace stays faithful (the view uses ``white-space: pre-wrap``); newlines
get a faint ↵ marker and C0 control characters their Unicode control picture.
Each step's span carries ``data-step`` (its index) and ``data-t`` (its ``Step.t``
in seconds, six decimals: ``time.monotonic()`` of the engine host on a live
engine), which ``scripts/ui_latency.py`` reads to time each step to the page.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from engine_adapter.provenance import drafted_across_hole
from engine_adapter.records import Step, Token

KIND_LABEL = MappingProxyType(
    {
        "prefill": "prefill (first token, computed by the target)",
        "accepted": "accepted draft",
        "relaxed": "relaxed draft (kept only by the lossy acceptance rule; vLLM's own rule rejected it)",
        "recovered": "recovered (target's token at the first rejection)",
        "bonus": "bonus (target's extra token after all drafts were kept)",
        "plain": "plain decode (no draft this step)",
        "rejected": "rejected draft (thrown away)",
    }
)


_JS_LITERAL = MappingProxyType(str.maketrans({"$": "&#36;", "`": "&#96;", "\\": "&#92;"}))


def plural(n: int, word: str) -> str:
    """``n`` and the word, with an s unless n is 1: "1 token", "2 tokens"."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def run_tally(n_tokens: int, n_steps: int) -> str:
    """A run's size as the page says it: "12 tokens, 1 engine step"."""
    return f"{plural(n_tokens, 'token')}, {plural(n_steps, 'engine step')}"


def inert(text: str) -> str:
    """HTML-escape and neutralise JS template-literal syntax."""
    return html.escape(text, quote=True).translate(_JS_LITERAL)


def _visible(text: str) -> str:
    """Make inert, then make newlines and control characters visible."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append('<span class="tv-nl">↵</span>\n')
        elif ch == "\t":
            out.append("\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(chr(0x2400 + ord(ch)) if ord(ch) < 32 else "␡")
        else:
            out.append(inert(ch))
    return "".join(out)


def token_html(text: str) -> str:
    return _visible(text) if text else '<span class="tv-sp">∅</span>'


def _tip(tok: Token, step: Step, across: bool = False) -> str:
    lines = [
        KIND_LABEL.get(tok.kind, tok.kind),
        f"step {step.index} · K in force {step.k} · batch size {step.batch_size}",
    ]
    if tok.draft_pos is not None:
        lines.append(f"draft position {tok.draft_pos} of {step.num_drafted}")
    lines.append(f"token id {tok.id} · text {tok.text!r}")
    if tok.relaxed is not None:
        r = tok.relaxed
        lines.append(
            f"the target's own top choice: id {r.target_id} {r.target_text!r} (p={r.p_target:.3f}); "
            f"this draft had p={r.p_draft:.3f}"
        )
    if tok.kind == "recovered" and step.drafted is not None and step.accepted < len(step.drafted):
        lines.append(f"replaced draft id {step.drafted[step.accepted]}")
    if step.drafted is None and step.num_drafted:
        lines.append("(attached server: draft ids unknown, counts only)")
    if across:
        lines.append(
            "drafted across a hole: the draft model skipped this request at K=0 steps and the hole outgrew the "
            "catch-up budget, so it drafts from the request's own text with the skipped tokens blank"
        )
    elif step.drafter_idle:
        lines.append(
            "drafter idle for this request: it skipped the request at a K=0 step; it drafts again once caught up "
            "(or across the hole, if the hole outgrows the catch-up budget)"
        )
    if step.caught_up:
        lines.append(f"drafter caught up {step.caught_up} tokens at step {step.index}: drafts again from the next step")
    return inert("\n".join(lines))


def _token_span(tok: Token, kind: str, step: Step, across: bool) -> str:
    return f'<span class="tv-tok k-{inert(kind)}" data-tip="{_tip(tok, step, across)}">{token_html(tok.text)}</span>'


def step_html(step: Step, across: bool = False) -> str:
    """One engine step as the view's markup: its emitted tokens, then its rejected drafts (ghosts)."""
    kept = "".join(_token_span(t, t.kind, step, across) for t in step.tokens)
    ghosts = "".join(_token_span(t, "rejected", step, across) for t in step.rejected)
    # data-t: a number only, inert as it is
    return f'<span class="tv-step" data-step="{int(step.index)}" data-t="{float(step.t):.6f}">{kept}{ghosts}</span>'


def token_view_value(
    steps: Sequence[Step],
    *,
    message: str | None = None,
    level: str = "info",
    streaming: bool = False,
    footer: str | None = None,
    prompt: str | None = None,
) -> dict[str, Any]:
    across = drafted_across_hole(steps)
    return {
        "prompt": _visible(prompt) if prompt else None,
        # one string, not a list of steps: the page's Gradio client deep-copies every output
        # component's value at each status message of any event (docs/benchmarks.md, "UI latency")
        "html": "".join(step_html(s, s.index in across) for s in steps),
        "steps": len(steps),
        "message": inert(message) if message else None,
        "level": level if level in ("info", "warn", "error") else "info",
        "streaming": streaming,
        "footer": inert(footer) if footer else None,
    }
