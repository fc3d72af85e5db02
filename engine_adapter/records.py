"""Engine-neutral records: the one vocabulary that crosses into the explorer.

Nothing here imports vLLM or a UI toolkit. The explorer, the recorder and the
benchmarks read only these types. Names follow vLLM's vocabulary:

- kinds of generated token: ``prefill`` (first token, computed by the prefill
  step), ``accepted`` (a draft token the target kept), ``recovered`` (the
  target's token at the first rejection), ``bonus`` (the target's extra token
  after all drafts were kept), ``plain`` (a decode step with no draft),
  ``relaxed`` (a draft kept only because a lossy acceptance rule was in force:
  vLLM's own rule rejected it; ``acceptance_rule.py``). vLLM counts a relaxed
  draft as accepted in its metrics;
- ``rejected`` draft tokens are not part of the text; each step keeps them.

Units: times in seconds (``t`` is ``time.monotonic()`` of the engine host),
rates in tokens per second.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from engine_adapter.acceptance_rule import lossless_accepted

TokenKind = Literal["prefill", "accepted", "relaxed", "recovered", "bonus", "plain"]
TOKEN_KINDS: tuple[TokenKind, ...] = ("prefill", "accepted", "relaxed", "recovered", "bonus", "plain")

# The profiler's own requests (policy/profiler.py) carry ids with this prefix, so the tap can
# count them in every step (``EngineStep.profiling_requests``). Our ids contain no "-".
PROFILE_REQUEST_PREFIX = "profile"
# The background load's requests (service/load.py) carry this prefix and their task kind.
LOAD_REQUEST_PREFIX = "load"


def profile_request_id(tag: str) -> str:
    """A profiling request's id: the prefix, a tag (letters and digits) and 8 random hex digits."""
    return f"{PROFILE_REQUEST_PREFIX}{tag}x{uuid.uuid4().hex[:8]}"


def is_profile_request(request_id: str) -> bool:
    return request_id.startswith(PROFILE_REQUEST_PREFIX)


# The profiler's requests measuring a cell in idle time (``LivePolicy.start_filling``) carry this
# tag after the prefix: the cost model learns their steps over any source, a profile's steps never.
IDLE_MEASURE_TAG = "idle"


def is_idle_measure_request(request_id: str) -> bool:
    return request_id.startswith(PROFILE_REQUEST_PREFIX + IDLE_MEASURE_TAG)


def load_request_id(kind: str) -> str:
    """A background-load request's id: the prefix, its prompt's task kind (letters; "" where
    unknown) and 12 random hex digits, so a step's rows say which kind each load request is."""
    if not kind.isalpha() and kind:
        raise ValueError(f"a task kind is letters only: {kind!r}")
    return f"{LOAD_REQUEST_PREFIX}{kind}x{uuid.uuid4().hex[:12]}"


def load_request_kind(request_id: str) -> str | None:
    """The task kind a load request's id names ("" where unknown), None for any other request."""
    if not request_id.startswith(LOAD_REQUEST_PREFIX):
        return None
    return request_id[len(LOAD_REQUEST_PREFIX) :].rpartition("x")[0]


def our_request_id(engine_request_id: str) -> str:
    """'cmpl-abc-0-1a2b3c4d' -> 'abc': the id we gave a request, from the one vLLM's engine uses
    (our ids contain no '-')."""
    rid = engine_request_id
    for prefix in ("cmpl-", "chatcmpl-"):
        if rid.startswith(prefix):
            rid = rid[len(prefix) :]
            break
    return rid.split("-", 1)[0]


def visitor_count(engine_request_ids: Iterable[str]) -> int:
    """How many of a step's requests are not the profiler's own."""
    return sum(1 for rid in engine_request_ids if not is_profile_request(our_request_id(rid)))


# Where provenance came from: the scheduler tap knows every draft id; an
# attached server without the tap only reports per-step counts.
Provenance = Literal["tap", "counts"]


@dataclass(frozen=True, slots=True)
class RelaxedDraft:
    """A draft kept only by a lossy acceptance rule, and what the target would have written."""

    position: int  # 1-based position in the step's draft
    target_id: int  # the target's own most likely token there
    p_draft: float  # the target's probability of the kept draft
    p_target: float  # the target's probability of its own token
    target_text: str = ""


@dataclass(frozen=True, slots=True)
class Token:
    """One token the request emitted (or, with ``rejected=True``, a thrown-away draft)."""

    id: int
    text: str
    kind: TokenKind | Literal["rejected"]
    step: int  # index of the request's step that produced it (0 = prefill step)
    draft_pos: int | None  # 1-based position in the step's draft; None if not a draft
    k: int  # K in force in that step (0 = no drafting)
    batch_size: int  # requests scheduled in that step
    draft_id: int | None = None  # the draft's id at this position, if known
    relaxed: RelaxedDraft | None = None  # for kind ``relaxed``: the target's own choice there


@dataclass(slots=True)
class Step:
    """One engine step of one request.

    ``drafted`` is None when the draft ids are unknown (attach mode); then
    ``num_drafted`` still holds the count. Rejected drafts are
    ``drafted[accepted:]``.
    """

    index: int
    t: float
    wall_s: float
    batch_size: int
    k: int
    drafted: list[int] | None
    num_drafted: int
    accepted: int
    emitted: list[int]
    tokens: list[Token] = field(default_factory=list)
    rejected: list[Token] = field(default_factory=list)
    finish_reason: str | None = None
    # the draft model has a hole for this request, from a K=0 step it skipped (an idle
    # drafter): no drafts until the hole is caught up, or, once it outgrew the catch-up
    # budget, drafts made across it (``provenance.drafted_across_hole``)
    drafter_idle: bool = False
    # tokens the draft model re-ran for this request in this step to fill that hole
    # (0: none); from the next step on it drafts again
    caught_up: int = 0
    # drafts among the ``accepted`` that only a lossy acceptance rule kept (vLLM's rejected them)
    relaxed: list[RelaxedDraft] = field(default_factory=list)
    rule: str = "lossless"  # the acceptance rule the step was verified under

    @property
    def lossless_accepted(self) -> int:
        """The drafts vLLM's own rule kept (``acceptance_rule.lossless_accepted``)."""
        return lossless_accepted(self.accepted, [r.position for r in self.relaxed])


@dataclass(slots=True)
class SpecDecodeMetrics:
    """vLLM's per-request ``metrics.speculative_decoding`` object, same fields."""

    mean_acceptance_length: float
    draft_acceptance_rate: float
    acceptance_histogram: list[int]  # [num_spec_tokens + 1], index j = steps accepting j
    num_spec_steps: int
    num_accepted_draft_tokens: int
    num_draft_tokens: int
    num_spec_tokens: int
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpecDecodeMetrics:
        return cls(
            mean_acceptance_length=d["mean_acceptance_length"],
            draft_acceptance_rate=d["draft_acceptance_rate"],
            acceptance_histogram=list(d["acceptance_histogram"]),
            num_spec_steps=d["num_spec_steps"],
            num_accepted_draft_tokens=d["num_accepted_draft_tokens"],
            num_draft_tokens=d["num_draft_tokens"],
            num_spec_tokens=d["num_spec_tokens"],
            per_step_accepted=list(d.get("per_step_accepted", [])),
            per_step_drafted=list(d.get("per_step_drafted", [])),
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.per_step_accepted:  # vLLM omits empty per-step arrays
            del d["per_step_accepted"], d["per_step_drafted"]
        return d


@dataclass(slots=True)
class RequestResult:
    """A finished request: text, provenance and the engine's own metrics."""

    request_id: str
    prompt: str
    text: str
    token_ids: list[int]
    kinds: list[TokenKind]
    steps: list[Step]
    provenance: Provenance
    # vLLM's own object from the response, unmodified (None when method is off)
    spec_decode_metrics: dict[str, Any] | None
    # the same numbers computed from the steps we saw (must equal vLLM's)
    tap_metrics: SpecDecodeMetrics | None
    finish_reason: str | None
    num_prompt_tokens: int
    t_start: float
    t_first_token: float | None
    t_end: float

    @property
    def tokens(self) -> list[Token]:
        return [tok for s in self.steps for tok in s.tokens]

    @property
    def num_relaxed(self) -> int:
        """Accepted drafts (in vLLM's metrics) that only a lossy acceptance rule kept."""
        return sum(len(s.relaxed) for s in self.steps)

    @property
    def tokens_per_second(self) -> float:
        """Completion tokens over the request's whole wall time (prefill included)."""
        dt = self.t_end - self.t_start
        return len(self.token_ids) / dt if dt > 0 else 0.0


@dataclass(frozen=True, slots=True)
class RequestInStep:
    """One request's part of one engine step: the drafts it verified, those vLLM's own rule kept
    (the text's predictability, whatever rule was in force), the tokens it gained."""

    request_id: str  # ours (the client's), not the engine's; never shown to another visitor
    num_drafted: int
    num_accepted: int  # by vLLM's lossless rule
    num_emitted: int
    drafted_across: bool = False  # its drafts were made across a hole in the drafter's KV cache


@dataclass(frozen=True, slots=True)
class SlotBid:
    """One request's draft slots in a slot-auction step."""

    request_id: str  # ours (the client's), not the engine's
    scores: tuple[float, ...]  # survival probability of draft positions 1..L (calibrated, acceptance.SlotEstimator)
    admitted: int  # positions admitted for verification (a prefix), 0..L


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One engine step as seen server-wide (all requests), for live charts."""

    seq: int
    t: float
    wall_s: float
    interval_s: float
    batch_size: int
    k: int
    num_tokens: int
    num_drafted: int
    num_accepted: int
    num_emitted: int
    # per draft position i+1: requests whose draft there was tested (every
    # earlier draft kept) and requests whose draft there was kept, by vLLM's own
    # (lossless) rule, whatever rule was in force
    accepted_per_pos: tuple[int, ...]
    reached_per_pos: tuple[int, ...]
    num_drafting: int  # requests that verified at least one draft this step
    tap_s: float
    controls: int = 0  # control-channel commands the engine had applied by this step
    # the slot auction's decision, when that policy ran the step: slots admitted
    # in all, and every drafting request's scores (empty otherwise)
    auction_slots: int | None = None
    bids: tuple[SlotBid, ...] = ()
    auction_ceiling: int | None = None  # positions the drafter was told to propose next
    # requests of the profiler's own in this step (``is_profile_request``): a step that has any
    # must have nothing else (a profiling cell never runs a visitor's request)
    profiling_requests: int = 0
    num_relaxed: int = 0  # of ``num_accepted``, drafts only a lossy acceptance rule kept
    rule: str = "lossless"  # the acceptance rule the step was verified under
    requests: tuple[RequestInStep, ...] = ()  # every request the step ran (skipped ones left out)


NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class SweepFileSettings:
    """What a sweep file was measured with, beside the policies and levels its rows name: the
    hidden arguments of its speed figures (``python -m engine_adapter.sweep`` prints them in its
    JSON line; ``docs/sweeps/index.json`` keeps them per file as ``"settings"``)."""

    hardware: str = NOT_RECORDED  # CPU model, cores and kind, or the GPU
    dtype: str = NOT_RECORDED
    models: str = NOT_RECORDED  # "target / draft"
    method: str = NOT_RECORDED
    max_tokens: int | None = None  # per request
    date: str = NOT_RECORDED

    def line(self) -> str:
        tokens = f"{self.max_tokens} tokens per request; " if self.max_tokens else ""
        return (
            f"{self.hardware}, {self.dtype}; {self.models}; method {self.method}; {tokens}"
            f"policies and concurrency as in the table; {self.date}"
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepFileSettings:
        """From an index entry's ``"settings"`` (unknown keys ignored, missing ones not recorded)."""
        known = {k: d[k] for k in ("hardware", "dtype", "models", "method", "max_tokens", "date") if k in d}
        return cls(**known)


# The first columns of a sweep CSV (python -m engine_adapter.sweep), which the explorer's
# Sweep panel reads: the CSV is a record format that crosses into the explorer too.
SWEEP_COLUMNS: tuple[str, ...] = (
    "policy",
    "concurrency",
    "total_tokens_per_s",
    "per_request_tokens_per_s",
    "mean_accepted_per_step",
    "effective_k",
    "draft_acceptance_rate",
)


# the server-wide counters a PromSnapshot keeps (engine.prometheus reads them from vLLM's /metrics)
PROM_COUNTER_KEYS = (
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "generation_tokens",
    "prompt_tokens",
    "requests_finished",
)


@dataclass(frozen=True)
class PromSnapshot:
    t: float  # time.monotonic() when read
    counters: dict[str, float]
    accepted_per_pos: dict[int, float]
    running: float  # vllm:num_requests_running
    waiting: float  # vllm:num_requests_waiting

    def __sub__(self, earlier: PromSnapshot) -> PromDelta:
        d = {k: self.counters.get(k, 0.0) - earlier.counters.get(k, 0.0) for k in PROM_COUNTER_KEYS}
        positions = sorted(set(self.accepted_per_pos) | set(earlier.accepted_per_pos))
        per_pos = [self.accepted_per_pos.get(p, 0.0) - earlier.accepted_per_pos.get(p, 0.0) for p in positions]
        return PromDelta(seconds=self.t - earlier.t, counts=d, accepted_per_pos=per_pos, running=self.running)


@dataclass(frozen=True)
class PromDelta:
    seconds: float
    counts: dict[str, float]
    accepted_per_pos: list[float] = field(default_factory=list)
    running: float = 0.0

    @property
    def effective_k(self) -> float | None:
        drafts = self.counts["drafts"]
        return self.counts["draft_tokens"] / drafts if drafts else None

    @property
    def draft_acceptance_rate(self) -> float | None:
        n = self.counts["draft_tokens"]
        return self.counts["accepted_tokens"] / n if n else None

    @property
    def mean_acceptance_length(self) -> float | None:
        drafts = self.counts["drafts"]
        return 1.0 + self.counts["accepted_tokens"] / drafts if drafts else None

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """P(position i kept | position i reached); position 1 is reached by every draft."""
        out: list[float | None] = []
        reached = self.counts["drafts"]
        for accepted in self.accepted_per_pos:
            out.append(accepted / reached if reached else None)
            reached = accepted  # position i+1 is reached only if i was kept
        return out

    @property
    def generation_tokens_per_second(self) -> float:
        return self.counts["generation_tokens"] / self.seconds if self.seconds > 0 else 0.0
