"""Who gets the discount: every request the engine runs, from its steps (pure).

Contract: ``ledger_rows(steps, plain_step_s, own=None)`` gives one ``LedgerRow`` per request
that ran in ``steps`` (``EngineStep.requests``; the profiler's requests left out), oldest first:
its owner (``"you"``: the request id ``own``, ``"load"``: the background load's, its task kind
from its id, ``"neighbour"``: any other visitor's), its predictability (the drafts vLLM's own
rule kept over those verified), the drafts it was granted per step, the tokens it gained per
step, and its speedup over plain decoding at the same load.

The speedup is an estimate: the time plain decoding would have taken for the request's tokens
(one token per request per step, each step costing ``plain_step_s(batch size)``, the cost
model's step time at K=0) over the time its steps took (their ``interval_s``), both over pure
decode steps only (a step with a prefill chunk costs what the prompt costs, under either).
``plain_step_s`` None: no cost model, no estimate.

``jain_index(values)`` is Jain's fairness index, 1 when all are equal, 1/n when one takes all;
``accepted_by_kind(steps, bin_s, own)`` the accepted drafts (tokens gained) per owner kind in
time bins: where the discount goes as the load changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from engine_adapter.records import EngineStep, is_profile_request, load_request_kind

Owner = Literal["you", "load", "neighbour"]
PlainStepTime = Callable[[int], float]  # batch size -> seconds of a plain (K=0) step


@dataclass(frozen=True)
class LedgerRow:
    """One request's account over the steps read: what it was granted and what it gained."""

    request_id: str  # for the server's own use: a page is never sent another visitor's id
    owner: Owner
    kind: str  # the load's task kind ("code", ...); "" where unknown (a visitor's own text)
    steps: int
    num_drafted: int
    num_accepted: int  # by vLLM's lossless rule, drafts made across a hole left out
    num_reached: int  # drafts verified, drafts made across a hole left out
    num_emitted: int
    decode_s: float  # the pure decode steps' time
    plain_s: float | None  # plain decoding's time for the same tokens (None: no cost model)
    first_t: float
    last_t: float
    batch_size: float  # mean batch size of its steps

    @property
    def predictability(self) -> float | None:
        """Drafts kept over drafts verified (None: it verified none)."""
        return self.num_accepted / self.num_reached if self.num_reached else None

    @property
    def drafts_per_step(self) -> float:
        """The drafts (slots) it was granted per step."""
        return self.num_drafted / self.steps if self.steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.num_emitted / self.steps if self.steps else 0.0

    @property
    def speedup(self) -> float | None:
        """Plain decoding's time over the measured time, for the same tokens (None: not known)."""
        if self.plain_s is None or self.decode_s <= 0:
            return None
        return self.plain_s / self.decode_s


def request_owner(request_id: str, own: str | None) -> tuple[Owner, str] | None:
    """(owner, task kind) of a request id; None for the profiler's own requests."""
    if is_profile_request(request_id):
        return None
    if own is not None and request_id == own:
        return "you", ""
    kind = load_request_kind(request_id)
    return ("load", kind) if kind is not None else ("neighbour", "")


def is_pure_decode(step: EngineStep) -> bool:
    """No prefill chunk in the step: every token it ran was a decode or a draft to verify."""
    return step.num_tokens <= sum(1 + r.num_drafted for r in step.requests)


@dataclass
class _Account:
    owner: Owner
    kind: str
    first_t: float
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: int = 0
    emitted: int = 0
    decode_s: float = 0.0
    plain_s: float = 0.0
    batch_sum: int = 0
    last_t: float = 0.0


def ledger_rows(
    steps: Iterable[EngineStep], plain_step_s: PlainStepTime | None, own: str | None = None
) -> list[LedgerRow]:
    accounts: dict[str, _Account] = {}
    for step in steps:
        pure = is_pure_decode(step)
        plain = plain_step_s(step.batch_size) if plain_step_s is not None and pure else 0.0
        for r in step.requests:
            who = accounts.get(r.request_id)
            if who is None:
                owner = request_owner(r.request_id, own)
                if owner is None:
                    continue
                who = accounts[r.request_id] = _Account(owner[0], owner[1], step.t)
            who.steps += 1
            who.drafted += r.num_drafted
            if not r.drafted_across:
                who.accepted += r.num_accepted
                who.reached += r.num_drafted
            who.emitted += r.num_emitted
            who.batch_sum += step.batch_size
            who.last_t = step.t
            if pure:
                who.decode_s += step.interval_s
                who.plain_s += r.num_emitted * plain
    return [
        LedgerRow(
            request_id=rid,
            owner=a.owner,
            kind=a.kind,
            steps=a.steps,
            num_drafted=a.drafted,
            num_accepted=a.accepted,
            num_reached=a.reached,
            num_emitted=a.emitted,
            decode_s=a.decode_s,
            plain_s=a.plain_s if plain_step_s is not None else None,
            first_t=a.first_t,
            last_t=a.last_t,
            batch_size=a.batch_sum / a.steps,
        )
        for rid, a in accounts.items()
    ]


def jain_index(values: Sequence[float]) -> float | None:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything (None: empty)."""
    if not values:
        return None
    squares = sum(x * x for x in values)
    return sum(values) ** 2 / (len(values) * squares) if squares > 0 else 1.0


def owner_kind_label(owner: Owner, kind: str) -> str:
    """The group a request's gains are counted under: "you", "neighbours", or the load's kind."""
    if owner == "you":
        return "you"
    if owner == "neighbour":
        return "neighbours"
    return kind or "load"


def accepted_by_kind(
    steps: Iterable[EngineStep], bin_s: float, own: str | None = None
) -> dict[str, list[tuple[float, int]]]:
    """Per group (``owner_kind_label``): (bin start, drafts vLLM's rule kept) in time bins of
    ``bin_s`` seconds, every group with a value in every bin that has steps (0 where none)."""
    bins: dict[float, dict[str, int]] = {}
    for step in steps:
        start = step.t - step.t % bin_s
        row = bins.setdefault(start, {})
        for r in step.requests:
            owner = request_owner(r.request_id, own)
            if owner is None:
                continue
            label = owner_kind_label(*owner)
            row[label] = row.get(label, 0) + (0 if r.drafted_across else r.num_accepted)
    labels = sorted({label for row in bins.values() for label in row})
    return {label: [(t, bins[t].get(label, 0)) for t in sorted(bins)] for label in labels}
