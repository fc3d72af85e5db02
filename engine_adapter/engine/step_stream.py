"""One request's steps, assembled: from the tap's messages, or from stream chunks and counts.

Contract: ``HttpState`` is what a request's OpenAI stream has delivered (token ids per
chunk, vLLM's per-request metrics, finish reason); ``steps_from_tap`` yields one ``Step``
per engine step that named the request (exact drafts, accepted count, emitted ids, K
and batch size as the engine ran them); ``steps_from_chunks`` yields a live guess per
chunk when there is no tap, and ``reconcile_counts`` rebuilds those steps from vLLM's
exact ``per_step_accepted``/``per_step_drafted`` once the request ends. Rejected drafts
are then counts only (``drafted`` None), never guessed. ``make_step`` labels every
token with its kind and its text through ``provenance.labelled_step``, the builder the
trace reader shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine_adapter.engine.token_text import IncrementalText, draft_text
from engine_adapter.provenance import labelled_step, steps_from_counts
from engine_adapter.records import RelaxedDraft, Step
from engine_adapter.vllm_plugin.wire import RelaxedRow, TapRequestStep, TapStep

if TYPE_CHECKING:  # transformers loads with the tokenizer, after the engine is spawned
    from transformers import PreTrainedTokenizerBase

TAP_GRACE_S = 5.0  # how long to wait for the tap's last step after the HTTP stream ends


@dataclass(frozen=True, slots=True)
class TapRow:
    """A request's row of one engine step, as the tap receiver routed it."""

    step: TapStep
    row: TapRequestStep


@dataclass(frozen=True, slots=True)
class StreamTokens:
    """Token ids one chunk of the request's HTTP stream carried."""

    ids: list[int]


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The request's HTTP stream ended (or the engine failed it): nothing more comes."""


StreamEvent = TapRow | StreamTokens | StreamEnded  # what a request's queue carries


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
    text: IncrementalText,
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
    finish_reason: str | None = None,
    drafter_idle: bool = False,
    caught_up: int = 0,
    relaxed: list[RelaxedRow] | None = None,
    rule: str = "lossless",
) -> Step:
    """One request's step as a ``Step``, its tokens and rejected drafts labelled (``provenance``),
    their texts from ``text`` (the request's text so far) and ``tokenizer`` (a rejected draft's)."""
    kept = [
        RelaxedDraft(r.position, r.target_id, r.p_draft, r.p_target, draft_text(tokenizer, r.target_id))
        for r in relaxed or []
    ]
    return labelled_step(
        index=index,
        t=t,
        wall_s=wall_s,
        batch_size=batch_size,
        k=k,
        drafted=drafted,
        num_drafted=num_drafted,
        accepted=accepted,
        emitted=emitted,
        texts=[text.push(tid) for tid in emitted],
        rejected_texts=[draft_text(tokenizer, did) for did in (drafted or [])[accepted:]],
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
        if isinstance(item, TapRow):
            tstep, r = item.step, item.row
            if not r.emitted and not r.num_drafted:
                continue  # a prefill chunk that produced no token yet
            yield step_of_row(tokenizer, text, index, tstep, r)
            index += 1
            seen += len(r.emitted)
            finished = finished or r.finish_reason is not None


def step_of_row(
    tokenizer: PreTrainedTokenizerBase, text: IncrementalText, index: int, tstep: TapStep, r: TapRequestStep
) -> Step:
    """The ``Step`` of one request's row of an engine step, as the tap sent it."""
    return make_step(
        tokenizer,
        text,
        index=index,
        t=tstep.t,
        wall_s=tstep.wall_s,
        batch_size=tstep.batch_size,
        k=tstep.k,
        drafted=None if r.drafted is None else list(r.drafted),  # None: the tap knew the count only
        num_drafted=r.num_drafted,
        accepted=r.accepted,
        emitted=list(r.emitted),
        finish_reason=r.finish_reason,
        drafter_idle=r.drafter_idle,
        caught_up=r.caught_up,
        relaxed=list(r.relaxed),
        rule=tstep.rule,
    )


async def steps_from_chunks(
    tokenizer: PreTrainedTokenizerBase, k_hint: int, wake: asyncio.Queue, text: IncrementalText
) -> AsyncIterator[Step]:
    # Live view without the tap: one chunk ~ one step; exact counts at the end. vLLM's
    # RequestOutputCollector merges the deltas of steps the API server has not sent yet, so under
    # load one chunk can carry several steps: reconcile_counts replaces these steps at the end.
    index = 0
    while True:
        event = await wake.get()
        if not isinstance(event, StreamTokens):
            return
        n = len(event.ids)
        yield make_step(
            tokenizer,
            text,
            index=index,
            t=time.monotonic(),
            wall_s=0.0,
            batch_size=0,
            k=k_hint,
            drafted=None,
            num_drafted=0 if index == 0 else k_hint,
            accepted=0 if index == 0 else n - 1,
            emitted=event.ids,
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
        out.append(
            make_step(
                tokenizer,
                text,
                index=index,
                t=t,
                wall_s=0.0,
                batch_size=0,
                k=k,
                drafted=None,
                num_drafted=num_drafted,
                accepted=accepted,
                emitted=emitted,
            )
        )
    return out
