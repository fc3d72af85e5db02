"""Wire format of the scheduler tap: one msgpack message per engine step.

Contract: the tap (inside vLLM's engine-core process) calls ``encode_step``;
the adapter (in the app's process) calls ``decode_step``. Both sides import
only this module for the format, so it holds no vLLM and no UI imports.

A step message is a ``TapStep`` encoded with msgspec as a msgpack array (``array_like``: its
fields in order, trailing defaults left out; about 1 us to encode for a small batch), one
``TapRequestStep`` per request vLLM processed, each field typed and commented below. ``t`` is
``time.monotonic()`` at the end of the step (CLOCK_MONOTONIC is system-wide on Linux, so it
compares across processes); ``wall_s`` is vLLM's time for the step from the start of
``schedule()`` to the end of ``update_from_output()``, the tap's own excluded; ``tap_s`` is the
tap's time on the previous step (live K policies and the auction included); ``dropped`` counts
messages dropped because no reader kept up; ``skipped`` lists requests scheduled in the step that
vLLM's ``update_from_output`` did not process (aborted or finished meanwhile: counted in
``batch_size``, absent from ``reqs``, as vLLM's metrics leave them out); ``controls`` counts the
control messages applied so far (the step that first carries n was scheduled under the n-th
command); ``rule`` is the acceptance rule the step was verified under ("lossless", "relaxed",
"typical"). A request's ``drafted`` is None where the worker sent no ids (then ``num_drafted`` is
all that is known; never a placeholder); ``drafter_idle``, ``caught_up`` and ``drafted_across``
describe the idle draft model's holes (``idle_drafter.py``, ``catch_up.py``).
"""

from __future__ import annotations

import msgspec

from engine_adapter.acceptance_rule import lossless_accepted

TAP_ADDR_ENV = "SPEC_EXPLORER_TAP_ADDR"
# The control channel, adapter -> tap: msgpack dicts, e.g.
#   {"table": [[start_bs, end_bs, K], ...]}   replace the batch-size -> K table live
#   {"auction": {"cost": CostModel.to_dict(), "prior": p, "strength": m, "allocation": a}}
#                                             the slot auction (K = k_max, trimmed per request);
#                                             allocation "equal": its slots shared alike
#   {"catch_up": n}                           the idle drafter's catch-up budget, tokens per step
#   {"acceptance": AcceptanceRule.to_dict()}  the acceptance rule, engine-wide, from the next step on
CONTROL_ADDR_ENV = "SPEC_EXPLORER_CONTROL_ADDR"
# With the idle drafter: the most tokens per step the draft model re-runs to catch a request up
# on the tokens it skipped at K=0 (``catch_up.py``); 0 = never (a holed request drafts across its hole)
CATCH_UP_TOKENS_ENV = "SPEC_EXPLORER_CATCH_UP_TOKENS"
DEFAULT_CATCH_UP_TOKENS = 128  # a long prompt's draft prefill: about 1.3-1.9 s of the packaged 0.5B on 2 CPU cores


class RelaxedRow(msgspec.Struct, array_like=True, frozen=True):
    """A draft kept only by a lossy acceptance rule (``lossy_sampler.py``)."""

    position: int  # 1-based draft position
    target_id: int  # the target's own token there (what vLLM's rule would have emitted)
    p_draft: float  # the target's probability of the draft
    p_target: float  # the target's probability of its own token


class BidRow(msgspec.Struct, array_like=True, frozen=True):
    """One request's bid in the slot auction."""

    engine_request_id: str
    scores: list[float]  # survival per draft position
    admitted: int  # draft slots it was granted


class AuctionRow(msgspec.Struct, array_like=True, frozen=True):
    """The slot auction's decision for a step."""

    slots: int  # draft slots admitted in all
    bids: list[BidRow]
    ceiling: int  # positions the drafter proposes from the next step on


class TapRequestStep(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """One request in one engine step, as vLLM processed it."""

    engine_request_id: str
    drafted: list[int] | None  # draft ids verified this step, [K_eff]; [] = no draft; None = count only
    accepted: int  # drafts the target kept, 0..num_drafted (relaxed ones included, as vLLM counts)
    emitted: list[int]  # ids appended to the output (accepted + 1, or fewer at a stop)
    finish_reason: str | None
    num_prompt_tokens: int
    num_drafted: int  # drafts verified this step (vLLM's count)
    drafter_idle: bool = False
    caught_up: int = 0  # tokens the draft model re-ran for it this step (its KV hole filled)
    drafted_across: bool = False  # the drafts verified this step were made across a hole (blank tokens)
    relaxed: list[RelaxedRow] = []  # drafts kept only by a lossy rule, by position

    def __post_init__(self) -> None:
        if self.drafted is not None and len(self.drafted) != self.num_drafted:
            raise ValueError(f"{len(self.drafted)} draft ids for num_drafted={self.num_drafted}")

    @property
    def lossless_accepted(self) -> int:
        """Drafts vLLM's own rule kept (``acceptance_rule.lossless_accepted``)."""
        return lossless_accepted(self.accepted, [r.position for r in self.relaxed])


class TapStep(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """One engine step: the message the tap sends, as the receiver decodes it."""

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
    auction: AuctionRow | None = None
    rule: str = "lossless"
    skipped: list[str] = []


_encoder = msgspec.msgpack.Encoder()
_step_decoder = msgspec.msgpack.Decoder(TapStep)
_control_decoder = msgspec.msgpack.Decoder()


def encode_step(step: TapStep) -> bytes:
    return _encoder.encode(step)


def decode_step(payload: bytes) -> TapStep:
    """The step a message carries; ``msgspec.DecodeError`` (``ValidationError`` included) when it is not one."""
    return _step_decoder.decode(payload)


def encode_control(message: dict) -> bytes:
    return _encoder.encode(message)


def decode_control(payload: bytes) -> dict:
    return _control_decoder.decode(payload)
