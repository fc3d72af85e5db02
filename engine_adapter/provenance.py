"""Per-token provenance and per-request statistics, as pure functions.

Contract:
- ``kinds_for_step(step_index, num_drafted, accepted, num_emitted)`` gives the
  kind of each emitted token of one step (vLLM's vocabulary, see records.py).
- ``metrics_from_steps(steps, num_spec_tokens)`` recomputes vLLM's per-request
  ``metrics.speculative_decoding`` from the steps (the same rule as vLLM's
  ``RequestSpecDecodeMetrics``: a step counts when it verified >= 1 draft).
- ``alpha_from_histogram(histogram, k)`` estimates per-token acceptance.
- ``steps_from_counts(...)`` rebuilds steps from stream chunks plus vLLM's
  ``per_step_accepted``/``per_step_drafted`` when there is no tap (attach mode).
- ``drafted_across_hole(steps)``: the steps whose drafts an idle draft model made across a
  hole in its KV cache (the tokens it skipped at K=0 steps, blank).
- ``text_agreement(a, b)``: how much of two token sequences agrees once aligned (``difflib``'s
  matching blocks over the longer one): how far a lossy rule's text drifted from the target's.
- ``labelled_step(...)``: one request's step as a ``Step``, each emitted token and rejected draft
  labelled with its kind, position, K and batch size, their texts given: the one builder the live
  client (``engine.step_stream.make_step``) and the trace reader (``trace.format``) share.

No I/O and no engine here; the statistics are kept apart from the stream code.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Sequence

from engine_adapter.records import RelaxedDraft, SpecDecodeMetrics, Step, Token, TokenKind


def drafted_across_hole(steps: Sequence[Step]) -> set[int]:
    """Indices of the steps that verified drafts made across a hole: a step's drafts were proposed
    at the end of the step before it, so they were made across the hole when that step already
    had one (``drafter_idle``) that it did not catch up (``caught_up``). The engine lets a request
    do so only once its hole is longer than the catch-up budget and holds zeros."""
    return {s.index for prev, s in zip(steps, steps[1:]) if s.num_drafted and prev.drafter_idle and not prev.caught_up}


def text_agreement(a: Sequence[int], b: Sequence[int]) -> float:
    """Share of the longer sequence's tokens that the aligned sequences share (1.0 = identical)."""
    if not a and not b:
        return 1.0
    blocks = difflib.SequenceMatcher(None, list(a), list(b), autojunk=False).get_matching_blocks()
    return sum(m.size for m in blocks) / max(len(a), len(b))


def kinds_for_step(
    step_index: int, num_drafted: int, accepted: int, num_emitted: int, relaxed: Collection[int] = ()
) -> list[TokenKind]:
    """Kinds of the ``num_emitted`` tokens one step appended, in order.

    The step verified ``num_drafted`` drafts and kept ``accepted`` of them; the
    target then adds one token: ``recovered`` at the first rejection, ``bonus``
    if every draft was kept. A stop (max_tokens, stop token) can cut the step
    short, so fewer tokens may have been emitted than ``accepted + 1``. Kept drafts
    at the 1-based positions ``relaxed`` were kept only by a lossy rule: ``relaxed``.
    """
    if step_index == 0 and num_drafted == 0:
        full: list[TokenKind] = ["prefill"]
    elif num_drafted == 0:
        full = ["plain"]
    else:
        full = ["relaxed" if j + 1 in relaxed else "accepted" for j in range(accepted)]
        full.append("bonus" if accepted == num_drafted else "recovered")
    return full[:num_emitted]


def metrics_from_steps(steps: Sequence[tuple[int, int]], num_spec_tokens: int) -> SpecDecodeMetrics:
    """vLLM's per-request metrics from (num_drafted, accepted) per step."""
    histogram = [0] * (num_spec_tokens + 1)
    per_acc: list[int] = []
    per_drafted: list[int] = []
    for num_drafted, accepted in steps:
        if num_drafted == 0:
            continue  # vLLM does not count steps with no draft
        histogram[accepted] += 1
        per_acc.append(accepted)
        per_drafted.append(num_drafted)
    num_spec_steps = len(per_acc)
    num_accepted = sum(per_acc)
    num_drafted_total = sum(per_drafted)
    return SpecDecodeMetrics(
        mean_acceptance_length=(1.0 + num_accepted / num_spec_steps if num_spec_steps else 1.0),
        draft_acceptance_rate=(num_accepted / num_drafted_total if num_drafted_total else 0.0),
        acceptance_histogram=histogram,
        num_spec_steps=num_spec_steps,
        num_accepted_draft_tokens=num_accepted,
        num_draft_tokens=num_drafted_total,
        num_spec_tokens=num_spec_tokens,
        per_step_accepted=per_acc,
        per_step_drafted=per_drafted,
    )


def metrics_from_histogram(histogram: Sequence[int], num_draft_tokens: int) -> SpecDecodeMetrics:
    """The summary numbers from a histogram alone (vLLM's ``to_dict`` rule)."""
    num_spec_steps = sum(histogram)
    num_accepted = sum(j * h for j, h in enumerate(histogram))
    return SpecDecodeMetrics(
        mean_acceptance_length=1.0 + num_accepted / num_spec_steps if num_spec_steps else 1.0,
        draft_acceptance_rate=num_accepted / num_draft_tokens if num_draft_tokens else 0.0,
        acceptance_histogram=list(histogram),
        num_spec_steps=num_spec_steps,
        num_accepted_draft_tokens=num_accepted,
        num_draft_tokens=num_draft_tokens,
        num_spec_tokens=len(histogram) - 1,
    )


def steps_from_counts(
    chunk_sizes: Sequence[int],
    per_step_accepted: Sequence[int],
    per_step_drafted: Sequence[int],
) -> tuple[list[tuple[int, int, int]], bool]:
    """(num_drafted, accepted, num_emitted) per step without the tap, and whether exact.

    vLLM's per-step arrays are exact but skip steps where nothing was drafted
    (plain decode steps, one token each). ``chunk_sizes`` are the stream's
    chunk token counts (one chunk per engine step while the client keeps up;
    the first chunk holds the prefill token). When every step drafted, the
    arrays alone are exact. Otherwise the plain steps are placed by aligning
    chunks to steps; if chunks were merged and no alignment exists, the plain
    steps are put last and the result is flagged inexact.
    """
    total = sum(chunk_sizes)
    if total == 0:
        return [], True
    spec = [(d, a) for d, a in zip(per_step_drafted, per_step_accepted)]
    spec_tokens = sum(a + 1 for _, a in spec)
    # A stop can cut the last step short (to 1..accepted tokens), hiding up to
    # ``cut`` tokens, so there are between ``fewest`` and ``fewest + cut`` plain steps.
    fewest = total - 1 - spec_tokens
    cut = spec[-1][1] if spec else 0
    steps: list[tuple[int, int, int]] = [(0, 0, 1)]

    sizes = list(chunk_sizes)
    sizes[0] -= 1
    sizes = [s for s in sizes if s > 0]
    # match chunk j.. with spec i.. and p plain steps left; spec first, then plain
    memo: dict[tuple[int, int, int], list[tuple[int, int, int]] | None] = {}

    def align(j: int, i: int, p: int) -> list[tuple[int, int, int]] | None:
        if j == len(sizes):
            return [] if i == len(spec) and p == 0 else None
        key = (j, i, p)
        if key not in memo:
            found = None
            if i < len(spec):
                d, a = spec[i]
                # only the very last step can be cut short by a stop
                last = i == len(spec) - 1 and j == len(sizes) - 1
                if sizes[j] == a + 1 or (last and sizes[j] <= a):
                    rest = align(j + 1, i + 1, p)
                    if rest is not None:
                        found = [(d, a, sizes[j])] + rest
            if found is None and p > 0 and sizes[j] == 1:
                rest = align(j + 1, i, p - 1)
                if rest is not None:
                    found = [(0, 0, 1)] + rest
            memo[key] = found
        return memo[key]

    if len(sizes) <= 900:  # recursion depth
        for num_plain in range(max(fewest, 0), fewest + cut + 1):  # fewest plain steps first
            aligned = align(0, 0, num_plain)
            if aligned is not None:
                return steps + aligned, True
    if fewest <= 0:  # chunks merged: the arrays alone (no plain step; last maybe cut short)
        left = total - 1
        for d, a in spec:
            n = min(a + 1, left)
            steps.append((d, a, n))
            left -= n
        return steps, True
    steps += [(d, a, a + 1) for d, a in spec] + [(0, 0, 1)] * fewest
    return steps, False


def labelled_step(
    *,
    index: int,
    t: float,
    wall_s: float,
    batch_size: int,
    k: int,
    drafted: list[int] | None,
    num_drafted: int,
    accepted: int,
    emitted: list[int],
    texts: Sequence[str],
    rejected_texts: Sequence[str],
    finish_reason: str | None = None,
    drafter_idle: bool = False,
    caught_up: int = 0,
    relaxed: Sequence[RelaxedDraft] = (),
    rule: str = "lossless",
) -> Step:
    """``texts``: one per emitted token; ``rejected_texts``: one per rejected draft, the drafts after
    the ``accepted`` ones (``drafted`` None: the count only, no ghosts)."""
    by_pos = {r.position: r for r in relaxed}
    kinds = kinds_for_step(index, num_drafted, accepted, len(emitted), by_pos)
    tokens = [
        Token(
            id=tid,
            text=text,
            kind=kind,
            step=index,
            draft_pos=(j + 1) if kind in ("accepted", "relaxed") else None,
            k=k,
            batch_size=batch_size,
            draft_id=drafted[j] if drafted is not None and j < len(drafted) else None,
            relaxed=by_pos.get(j + 1) if kind == "relaxed" else None,
        )
        for j, (tid, kind, text) in enumerate(zip(emitted, kinds, texts))
    ]
    rejected = [
        Token(
            id=did,
            text=text,
            kind="rejected",
            step=index,
            draft_pos=accepted + j + 1,
            k=k,
            batch_size=batch_size,
            draft_id=did,
        )
        for j, (did, text) in enumerate(zip((drafted or [])[accepted:], rejected_texts))
    ]
    return Step(
        index=index,
        t=t,
        wall_s=wall_s,
        batch_size=batch_size,
        k=k,
        drafted=drafted,
        num_drafted=num_drafted,
        accepted=accepted,
        emitted=list(emitted),
        tokens=tokens,
        rejected=rejected,
        finish_reason=finish_reason,
        drafter_idle=drafter_idle,
        caught_up=caught_up,
        relaxed=sorted(relaxed, key=lambda r: r.position),
        rule=rule,
    )
