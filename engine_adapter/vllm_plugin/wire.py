"""Wire format of the scheduler tap: one msgpack message per engine step.

Contract: the tap (inside vLLM's engine-core process) calls ``encode_step``;
the adapter (in the app's process) calls ``decode_step``. Both sides import
only this module for the format, so it holds no vLLM and no UI imports.

A step message is a msgpack array (compact, ~1 us to encode for a small batch):

    [seq, t, wall_s, interval_s, batch_size, k, num_tokens, tap_s, dropped, reqs, controls, auction, rule,
     skipped]

- seq:         engine step counter (int, starts at 1, counts steps with work)
- t:           time.monotonic() at the end of the step, seconds (CLOCK_MONOTONIC
               is system-wide on Linux, so it compares across processes)
- wall_s:      seconds from the start of ``schedule()`` to the end of
               ``update_from_output()`` for this step
- interval_s:  seconds since the previous step ended (idle time included)
- batch_size:  number of requests scheduled in the step
- k:           num_spec_tokens_to_schedule, the K in force for the step
- num_tokens:  total tokens scheduled (prefill chunks + 1 + drafts per request)
- tap_s:       seconds the tap itself spent on the PREVIOUS step, send included
               (live K policies' commands and the slot auction included)
- dropped:     messages dropped so far because no reader kept up
- reqs:        list of [engine_request_id, drafted_ids, accepted, emitted_ids,
               finish_reason_or_None, num_prompt_tokens, drafter_idle, caught_up,
               drafted_across, relaxed, num_drafted]
               (drafted_ids: the ids the worker verified, exact, or None where it
               sent none (then num_drafted is all that is known; never a
               placeholder); num_drafted: vLLM's count of drafts verified);
               (drafter_idle: the draft model has a hole for this request, from a
               K=0 step it skipped: no drafts for it until caught up, or drafts
               made across the hole once it outgrew the catch-up budget;
               caught_up: tokens the draft model re-ran for it in this step to
               fill that hole, 0 otherwise; drafted_across: the drafts verified
               in this step were made across such a hole; see idle_drafter.py
               and catch_up.py);
               relaxed: the drafts kept only by a lossy acceptance rule, [[draft
               position (1-based), the target's own token, p(draft), p(target's
               token)], ...] (``lossy_sampler.py``); [] under the lossless rule
- skipped:     engine request ids scheduled in the step that vLLM's
               ``update_from_output`` did not process (aborted or finished while
               the step ran): counted in batch_size, absent from reqs (vLLM's
               metrics do not count them either)
- controls:    control messages applied so far (an acknowledgement: the step
               that first carries n was scheduled under the n-th command)
- auction:     None, or the slot auction's decision for this step:
               [slots_admitted, [[engine_request_id, [survival per position], admitted], ...],
                ceiling (positions the drafter proposes from the next step on)]
- rule:        the acceptance rule the step was verified under ("lossless", "relaxed", "typical")
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

TAP_ADDR_ENV = "SPEC_EXPLORER_TAP_ADDR"
# The control channel, adapter -> tap: msgpack dicts, e.g.
#   {"table": [[start_bs, end_bs, K], ...]}   replace the batch-size -> K table live
#   {"auction": {"cost": CostModel.to_dict(), "prior": p, "strength": m}}
#                                             the slot auction (K = k_max, trimmed per request)
#   {"catch_up": n}                           the idle drafter's catch-up budget, tokens per step
#   {"acceptance": AcceptanceRule.to_dict()}  the acceptance rule, engine-wide, from the next step on
CONTROL_ADDR_ENV = "SPEC_EXPLORER_CONTROL_ADDR"
# With the idle drafter: the most tokens per step the draft model re-runs to catch a request up
# on the tokens it skipped at K=0 (``catch_up.py``); 0 = never (a holed request drafts across its hole)
CATCH_UP_TOKENS_ENV = "SPEC_EXPLORER_CATCH_UP_TOKENS"
DEFAULT_CATCH_UP_TOKENS = 128  # a long prompt's draft prefill: about 1.3-1.9 s of the packaged 0.5B on 2 CPU cores


@dataclass(frozen=True, slots=True)
class TapRequestStep:
    engine_request_id: str
    drafted: list[int] | None  # draft ids verified this step, [K_eff]; [] = no draft; None = count only
    accepted: int  # drafts the target kept, 0..len(drafted)
    emitted: list[int]  # ids appended to the output (accepted + 1, or fewer at a stop)
    finish_reason: str | None
    num_prompt_tokens: int
    drafter_idle: bool = False
    caught_up: int = 0  # tokens the draft model re-ran for it this step (its KV hole filled)
    drafted_across: bool = False  # the drafts verified this step were made across a hole (blank tokens)
    # drafts kept only by a lossy rule: [[position (1-based), target's token, p(draft), p(target's token)]]
    relaxed: list = field(default_factory=list)
    num_drafted: int = -1  # drafts verified this step; -1 (the default) = len(drafted)

    def __post_init__(self) -> None:
        if self.num_drafted < 0:
            object.__setattr__(self, "num_drafted", len(self.drafted or ()))
        elif self.drafted is not None and len(self.drafted) != self.num_drafted:
            raise ValueError(f"{len(self.drafted)} draft ids for num_drafted={self.num_drafted}")


@dataclass(frozen=True, slots=True)
class TapStep:
    seq: int
    t: float
    wall_s: float
    interval_s: float
    batch_size: int
    k: int
    num_tokens: int
    tap_s: float
    dropped: int
    reqs: list[TapRequestStep]
    controls: int = 0
    auction: list | None = None
    rule: str = "lossless"
    skipped: tuple[str, ...] = ()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def encode_step(
    seq: int,
    t: float,
    wall_s: float,
    interval_s: float,
    batch_size: int,
    k: int,
    num_tokens: int,
    tap_s: float,
    dropped: int,
    reqs: list[list],
    controls: int = 0,
    auction: list | None = None,
    rule: str = "lossless",
    skipped: list[str] | None = None,
) -> bytes:
    fields = [seq, t, wall_s, interval_s, batch_size, k, num_tokens, tap_s, dropped, reqs, controls, auction, rule]
    return _encoder.encode([*fields, skipped or []])


def decode_step(payload: bytes) -> TapStep:
    seq, t, wall_s, interval_s, bs, k, num_tokens, tap_s, dropped, reqs, controls, auction, rule, skipped = (
        _decoder.decode(payload)
    )
    return TapStep(
        seq=seq,
        t=t,
        wall_s=wall_s,
        interval_s=interval_s,
        batch_size=bs,
        k=k,
        num_tokens=num_tokens,
        tap_s=tap_s,
        dropped=dropped,
        reqs=[TapRequestStep(*r) for r in reqs],
        controls=controls,
        auction=auction,
        rule=rule,
        skipped=tuple(skipped),
    )


def encode_control(message: dict) -> bytes:
    return _encoder.encode(message)


def decode_control(payload: bytes) -> dict:
    return _decoder.decode(payload)
