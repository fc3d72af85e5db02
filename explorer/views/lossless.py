"""The lossless check: speculative output against the same prompt with speculation off.

Contract: ``compare(spec, plain, temperature)`` returns a ``Verdict`` with the
first differing token (if any), a plain-language message, the measured
speedup of the speculative run over the plain one (tokens/s ratio) and, when a
lossy acceptance rule kept drafts (``relaxed`` tokens), the comparison it calls
for: the first relaxed token, the share of tokens that agree once the two texts
are aligned (``provenance.text_agreement``), and the acceptance with and without the relaxed drafts;
``verdict_markdown(verdict, spec, plain)`` is the line the page shows for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_adapter.provenance import text_agreement
from engine_adapter.records import RequestResult
from engine_adapter.service.backend import SpeedSettings


@dataclass(frozen=True)
class Verdict:
    identical: bool
    first_difference: int | None  # token index, None when identical
    message: str
    speedup: float | None
    agreement: float = 1.0  # tokens that agree once aligned, over the longer text
    first_relaxed: int | None = None  # token index of the first relaxed token (a lossy rule), None if none
    num_relaxed: int = 0


def compare(spec: RequestResult, plain: RequestResult, temperature: float) -> Verdict:
    a, b = spec.token_ids, plain.token_ids
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    if first is None and len(a) != len(b):
        first = n
    speedup = (spec.tokens_per_second / plain.tokens_per_second) if plain.tokens_per_second > 0 else None
    first_relaxed = next((i for i, k in enumerate(spec.kinds) if k == "relaxed"), None)
    if first_relaxed is not None:
        return Verdict(
            first is None,
            first,
            _lossy_message(spec, first, first_relaxed, text_agreement(a, b), temperature),
            speedup,
            text_agreement(a, b),
            first_relaxed,
            spec.num_relaxed,
        )
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
    return Verdict(first is None, first, msg, speedup, text_agreement(a, b))


def _lossy_message(spec: RequestResult, first: int | None, first_relaxed: int, agree: float, temp: float) -> str:
    head = (
        f"A lossy acceptance rule kept {spec.num_relaxed} draft(s) that vLLM's own rule rejected; "
        f"the first is token {first_relaxed}. "
    )
    if first is None:
        return head + "The texts are still identical: each relaxed draft happened to be the target's choice later."
    where = (
        "exactly at the first relaxed token: the target would have written another token there"
        if first == first_relaxed
        else f"at token {first}" + (" (the random samples differ too, at this temperature)" if temp > 0 else "")
    )
    return head + f"The texts part {where}; {agree:.0%} of the tokens agree once the texts are aligned."


def verdict_markdown(
    verdict: Verdict, spec: RequestResult, plain: RequestResult, settings: SpeedSettings | None = None
) -> str:
    """The check's answer in one line: the verdict, then both speeds and their ratio (tokens/s),
    with what they depend on (``settings``: the speculative run's; the twin runs no load)."""
    where = f" (on {settings.line()}; the speculation-off twin runs alone, without the load)" if settings else ""
    speed = (
        f" Speed: {spec.tokens_per_second:.2f} tokens/s with speculation, "
        f"{plain.tokens_per_second:.2f} without: **{verdict.speedup:.2f}x**{where}."
        if verdict.speedup
        else ""
    )
    lossy = ""
    m = spec.spec_decode_metrics
    if verdict.num_relaxed and m and m.get("num_draft_tokens"):
        drafted, accepted = m["num_draft_tokens"], m["num_accepted_draft_tokens"]
        lossy = (
            f" Acceptance: {accepted / drafted:.3f} with the relaxed drafts (vLLM's count), "
            f"{(accepted - verdict.num_relaxed) / drafted:.3f} without them, in this run."
        )
    return f"**{'✓' if verdict.identical else '≠'} {verdict.message}**{speed}{lossy}"
