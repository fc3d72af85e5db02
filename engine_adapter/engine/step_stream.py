"""One request's steps, assembled: from the tap's messages, or from stream chunks and counts.

Contract: ``HttpState`` is what a request's OpenAI stream has delivered (token ids per
chunk, vLLM's per-request metrics, finish reason); ``steps_from_tap`` yields one ``Step``
per engine step that named the request (exact drafts, accepted count, emitted ids, K
and batch size as the engine ran them); ``steps_from_chunks`` yields a live guess per
chunk when there is no tap, and ``reconcile_counts`` rebuilds those steps from vLLM's
exact ``per_step_accepted``/``per_step_drafted`` once the request ends. Rejected drafts
are then counts only (``drafted`` None), never guessed. ``make_step`` labels every
token with its kind (``provenance.kinds_for_step``) and its text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine_adapter.engine.token_text import IncrementalText, draft_text
from engine_adapter.provenance import kinds_for_step, steps_from_counts
from engine_adapter.records import RelaxedDraft, Step, Token

if TYPE_CHECKING:  # transformers loads with the tokenizer, after the engine is spawned
    from transformers import PreTrainedTokenizerBase

TAP_GRACE_S = 5.0  # how long to wait for the tap's last step after the HTTP stream ends


@dataclass
class HttpState:
    """What the HTTP stream of one request has delivered so far."""

    chunks: list[list[int]] = field(default_factory=list)  # token ids per SSE chunk
    metrics: dict[str, Any] | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    t_first: float | None = None
    done: bool = False
    error: str | None = None


def make_step(
    tokenizer: PreTrainedTokenizerBase,
    index: int,
    t: float,
    wall_s: float,
    batch_size: int,
    k: int,
    drafted: list[int] | None,
    num_drafted: int,
    accepted: int,
    emitted: list[int],
    text: IncrementalText,
    finish_reason: str | None = None,
    drafter_idle: bool = False,
    caught_up: int = 0,
    relaxed: list[list] | None = None,
    rule: str = "lossless",
) -> Step:
    """One request's step as a ``Step``, its tokens and rejected drafts labelled (``provenance``);
    ``relaxed`` is the tap's [[position, target's token, p(draft), p(target's token)], ...]."""
    kept = [
        RelaxedDraft(int(pos), int(tid), float(pd), float(pt), draft_text(tokenizer, int(tid)))
        for pos, tid, pd, pt in relaxed or []
    ]
    by_pos = {r.position: r for r in kept}
    kinds = kinds_for_step(index, num_drafted, accepted, len(emitted), by_pos)
    tokens = [
        Token(
            id=tid,
            text=text.push(tid),
            kind=kind,
            step=index,
            draft_pos=(j + 1) if kind in ("accepted", "relaxed") else None,
            k=k,
            batch_size=batch_size,
            draft_id=drafted[j] if drafted is not None and j < len(drafted) else None,
            relaxed=by_pos.get(j + 1) if kind == "relaxed" else None,
        )
        for j, (tid, kind) in enumerate(zip(emitted, kinds))
    ]
    rejected = [
        Token(
            id=did,
            text=draft_text(tokenizer, did),
            kind="rejected",
            step=index,
            draft_pos=accepted + j + 1,
            k=k,
            batch_size=batch_size,
            draft_id=did,
        )
        for j, did in enumerate((drafted or [])[accepted:])
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
        relaxed=kept,
        rule=rule,
    )


async def steps_from_tap(
    tokenizer: PreTrainedTokenizerBase, wake: asyncio.Queue, state: HttpState, text: IncrementalText
) -> AsyncIterator[Step]:
    index = 0
    seen = 0
    finished = False
    while True:
        if state.done and (state.error or finished or seen >= sum(map(len, state.chunks))):
            return
        try:
            item = await asyncio.wait_for(wake.get(), TAP_GRACE_S if state.done else None)
        except TimeoutError:
            return  # the tap never delivered the rest; generate() reports it
        if not isinstance(item[0], str):
            tstep, r = item
            if not r.emitted and not r.num_drafted:
                continue  # a prefill chunk that produced no token yet
            yield make_step(
                tokenizer,
                index,
                tstep.t,
                tstep.wall_s,
                tstep.batch_size,
                tstep.k,
                None if r.drafted is None else list(r.drafted),  # None: the tap knew the count only
                r.num_drafted,
                r.accepted,
                list(r.emitted),
                text,
                r.finish_reason,
                r.drafter_idle,
                r.caught_up,
                list(r.relaxed),
                tstep.rule,
            )
            index += 1
            seen += len(r.emitted)
            finished = finished or r.finish_reason is not None


async def steps_from_chunks(
    tokenizer: PreTrainedTokenizerBase, k_hint: int, wake: asyncio.Queue, text: IncrementalText
) -> AsyncIterator[Step]:
    # Live view without the tap: one chunk ~ one step; exact counts at the end. vLLM's
    # RequestOutputCollector merges the deltas of steps the API server has not sent yet, so under
    # load one chunk can carry several steps: reconcile_counts replaces these steps at the end.
    index = 0
    while True:
        kind, ids = await wake.get()
        if kind == "done":
            return
        n = len(ids)
        yield make_step(
            tokenizer,
            index,
            time.monotonic(),
            0.0,
            0,
            k_hint,
            None,
            0 if index == 0 else k_hint,
            0 if index == 0 else n - 1,
            ids,
            text,
        )
        index += 1


def reconcile_counts(tokenizer: PreTrainedTokenizerBase, state: HttpState, live: list[Step]) -> list[Step]:
    """Rebuild attach-mode steps from vLLM's exact per-step counts."""
    m = state.metrics or {}
    plan, _exact = steps_from_counts(
        [len(c) for c in state.chunks], m.get("per_step_accepted", []), m.get("per_step_drafted", [])
    )
    ids = [i for c in state.chunks for i in c]
    k = m.get("num_spec_tokens", 0)
    text = IncrementalText(tokenizer)
    out: list[Step] = []
    pos = 0
    t_of = [s.t for s in live]
    for index, (num_drafted, accepted, n) in enumerate(plan):
        emitted = ids[pos : pos + n]
        pos += n
        t = t_of[min(index, len(t_of) - 1)] if t_of else 0.0
        out.append(make_step(tokenizer, index, t, 0.0, 0, k, None, num_drafted, accepted, emitted, text))
    return out
