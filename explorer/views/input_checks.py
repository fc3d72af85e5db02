"""Checks on what a page (or an API caller) sends, with messages a person can act on.

Contract: each function returns None when the input is fine, else the message
to show; nothing raises. The slider limits on the page are the same numbers,
so only API callers (gradio_client, curl) ever meet these messages.
"""

from __future__ import annotations

import math

MAX_PROMPT_CHARS = 8000
MAX_TOKENS = 1024
MAX_TEMPERATURE = 2.0


def _number(value: object) -> float | None:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def check_run(prompt: object, temperature: object, max_tokens: object) -> str | None:
    if not isinstance(prompt, str) or not prompt.strip():
        return "Type a prompt (or pick a preset) first."
    if len(prompt) > MAX_PROMPT_CHARS:
        return (
            f"The prompt is {len(prompt)} characters long; the limit here is {MAX_PROMPT_CHARS}. "
            "Shorten it and run again."
        )
    t = _number(temperature)
    if t is None or not 0.0 <= t <= MAX_TEMPERATURE:
        return f"Temperature must be a number from 0 to {MAX_TEMPERATURE:g}; got {temperature!r}."
    n = _number(max_tokens)
    if n is None or not n.is_integer() or not 1 <= n <= MAX_TOKENS:
        return f"Max tokens must be a whole number from 1 to {MAX_TOKENS}; got {max_tokens!r}."
    return None
