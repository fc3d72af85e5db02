"""Tap records for unit tests, built by keyword (``vllm_plugin.wire``): a request's row and a step."""

from __future__ import annotations

from engine_adapter.vllm_plugin.wire import AuctionRow, TapRequestStep, TapStep


def tap_row(
    engine_request_id: str,
    *,
    drafted: list[int],
    accepted: int,
    emitted: list[int],
    finish_reason: str | None = None,
    num_prompt_tokens: int = 4,
    **extra,
) -> TapRequestStep:
    """A request's row whose drafts are exact (``num_drafted`` is their count)."""
    return TapRequestStep(
        engine_request_id=engine_request_id,
        drafted=drafted,
        accepted=accepted,
        emitted=emitted,
        finish_reason=finish_reason,
        num_prompt_tokens=num_prompt_tokens,
        num_drafted=len(drafted),
        **extra,
    )


def tap_step(
    *,
    batch_size: int,
    k: int,
    num_tokens: int,
    reqs: list[TapRequestStep],
    seq: int = 1,
    t: float = 10.0,
    auction: AuctionRow | None = None,
    skipped: list[str] | None = None,
    rule: str = "lossless",
) -> TapStep:
    return TapStep(
        seq=seq,
        t=t,
        wall_s=0.01,
        interval_s=0.01,
        batch_size=batch_size,
        k=k,
        num_tokens=num_tokens,
        tap_s=0.0,
        dropped=0,
        reqs=reqs,
        auction=auction,
        rule=rule,
        skipped=skipped or [],
    )
