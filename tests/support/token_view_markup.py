"""Read the token view's markup back into steps, for tests that hold the value an API caller gets.

Contract: ``view_steps(value)`` takes the token view's value (``explorer.views.token_view``:
its ``html`` string) and returns one dict per step, in order: ``i`` (``data-step``), ``ts``
(``data-t``), ``t`` the emitted tokens and ``r`` the rejected drafts, each token ``{"h": its
inner markup, "k": its kind, "tip": its data-tip}``, all as they stand in the markup (still
escaped: that is what the tests check). The markup is the view's own: token spans hold text and
at most the view's one-level ``tv-*`` spans (newline and empty-token markers); anything else in
``html`` fails the parse loudly.
"""

from __future__ import annotations

import re
from typing import Any

_STEP = re.compile(r'<span class="tv-step" data-step="(\d+)" data-t="([0-9.]+)">')
_INNER = r'(?:[^<]|<span class="tv-[a-z]+">[^<]*</span>)*'  # text and the view's one-level markers
_TOKEN = re.compile(rf'<span class="tv-tok k-([a-z]+)" data-tip="([^"]*)">({_INNER})</span>')


def view_steps(value: dict[str, Any]) -> list[dict[str, Any]]:
    html, pos, steps = value["html"], 0, []
    while pos < len(html):
        m = _STEP.match(html, pos)
        assert m, f"not a step at {pos}: {html[pos : pos + 120]!r}"
        step: dict[str, Any] = {"i": int(m.group(1)), "ts": m.group(2), "t": [], "r": []}
        pos = m.end()
        while (tok := _TOKEN.match(html, pos)) is not None:
            kind, tip, inner = tok.groups()
            if kind == "rejected":
                step["r"].append({"h": inner, "tip": tip})
            else:
                assert not step["r"], f"an emitted token after a rejected draft in step {step['i']}"
                step["t"].append({"h": inner, "k": kind, "tip": tip})
            pos = tok.end()
        assert html.startswith("</span>", pos), f"step {step['i']} not closed: {html[pos : pos + 120]!r}"
        pos += len("</span>")
        steps.append(step)
    assert len(steps) == value["steps"], (len(steps), value["steps"])
    return steps
