"""The lossless check: speculative output against the same prompt with speculation off.

Contract: ``compare(spec, plain, temperature)`` returns a ``Verdict`` with the
first differing token (if any), a plain-language message, and the measured
speedup of the speculative run over the plain one (tokens/s ratio);
``verdict_markdown(verdict, spec, plain)`` is the line the page shows for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_adapter.records import RequestResult


@dataclass(frozen=True)
class Verdict:
    identical: bool
    first_difference: int | None  # token index, None when identical
    message: str
    speedup: float | None


def compare(spec: RequestResult, plain: RequestResult, temperature: float) -> Verdict:
    a, b = spec.token_ids, plain.token_ids
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    if first is None and len(a) != len(b):
        first = n
    speedup = (spec.tokens_per_second / plain.tokens_per_second) if plain.tokens_per_second > 0 else None
    if first is None:
        msg = f"Identical: all {len(a)} tokens match, token for token."
    elif temperature > 0:
        msg = (
            f"The texts differ from token {first} on. That is expected at temperature {temperature:g}: "
            "speculative sampling keeps the target's distribution exactly, but two runs draw "
            "different random samples from it, with or without speculation."
        )
    else:
        msg = (
            f"The texts differ from token {first} on, at temperature 0. Greedy speculative decoding "
            "should match token for token; a difference usually means two candidate tokens had "
            "(nearly) equal scores and different batch shapes broke the tie."
        )
    return Verdict(first is None, first, msg, speedup)


def verdict_markdown(verdict: Verdict, spec: RequestResult, plain: RequestResult) -> str:
    """The check's answer in one line: the verdict, then both speeds and their ratio (tokens/s)."""
    speed = (
        f" Speed: {spec.tokens_per_second:.2f} tokens/s with speculation, "
        f"{plain.tokens_per_second:.2f} without: **{verdict.speedup:.2f}x**."
        if verdict.speedup
        else ""
    )
    return f"**{'✓' if verdict.identical else '≠'} {verdict.message}**{speed}"
