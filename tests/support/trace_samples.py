"""Small records and session traces for the trace, recorder and replay tests."""

from __future__ import annotations

from pathlib import Path

from engine_adapter.provenance import kinds_for_step
from engine_adapter.records import EngineStep, RequestResult, Step, Token
from engine_adapter.trace.format import (
    SessionTraceWriter,
    engine_step_line,
    load_line,
    policy_line,
    session_header,
    session_request_line,
)

# the live charts' CSV columns, in order (explorer.views.live_charts)
CHART_COLUMNS = [
    "t",
    "k",
    "batch",
    "effective_k",
    "tokens_per_step",
    "accepted_per_step",
    "acceptance_rate",
    "total_tokens_per_s",
]


def engine_step(seq: int, t: float, batch: int = 2) -> EngineStep:
    return EngineStep(
        seq=seq,
        t=t,
        wall_s=0.04321,
        interval_s=0.1,
        batch_size=batch,
        k=3,
        num_tokens=8,
        num_drafted=6,
        num_accepted=3,
        num_emitted=5,
        accepted_per_pos=(2, 1, 0),
        reached_per_pos=(2, 2, 1),
        num_drafting=2,
        tap_s=0.000123,
    )


def request(t_start: float, prompt: str = "def add(a, b):", dt: float = 0.25) -> RequestResult:
    """A finished request: prefill, a step keeping 2 of 3 drafts, one keeping all 3 (4 steps)."""
    plan = [
        ([], 0, [11]),
        ([21, 22, 23], 2, [21, 22, 30]),
        ([31, 32, 33], 3, [31, 32, 33, 34]),
        ([41, 42, 43], 0, [50]),
    ]
    steps = []
    for i, (drafted, acc, emitted) in enumerate(plan):
        kinds = kinds_for_step(i, len(drafted), acc, len(emitted))
        toks = [
            Token(
                id=e,
                text=f"<{e}>",
                kind=k,
                step=i,
                draft_pos=j + 1 if k == "accepted" else None,
                k=3,
                batch_size=1,
                draft_id=drafted[j] if j < len(drafted) else None,
            )
            for j, (e, k) in enumerate(zip(emitted, kinds))
        ]
        rej = [
            Token(id=d, text=f"x{d}", kind="rejected", step=i, draft_pos=acc + j + 1, k=3, batch_size=1, draft_id=d)
            for j, d in enumerate(drafted[acc:])
        ]
        steps.append(
            Step(
                index=i,
                t=t_start + dt * (i + 1),
                wall_s=0.05,
                batch_size=1,
                k=3,
                drafted=drafted,
                num_drafted=len(drafted),
                accepted=acc,
                emitted=emitted,
                tokens=toks,
                rejected=rej,
            )
        )
    steps[-1].finish_reason = "length"
    ids = [e for s in steps for e in s.emitted]
    return RequestResult(
        request_id="r1",
        prompt=prompt,
        text="".join(t.text for s in steps for t in s.tokens),
        token_ids=ids,
        kinds=[t.kind for s in steps for t in s.tokens],
        steps=steps,
        provenance="tap",
        spec_decode_metrics={
            "mean_acceptance_length": 2.667,
            "draft_acceptance_rate": 0.556,
            "acceptance_histogram": [1, 0, 1, 1],
            "num_spec_steps": 3,
            "num_accepted_draft_tokens": 5,
            "num_draft_tokens": 9,
            "num_spec_tokens": 3,
        },
        tap_metrics=None,
        finish_reason="length",
        num_prompt_tokens=7,
        t_start=t_start,
        t_first_token=t_start + dt,
        t_end=t_start + dt * 4 + 0.01,
    )


def write_trace(path: Path, t0: float = 1000.0, n_steps: int = 40, dt: float = 0.1) -> None:
    w = SessionTraceWriter(path)
    w.write(session_header({"method": "draft", "k": 3, "target": "T", "draft": "D"}, "0.32.0"))
    for i in range(1, n_steps + 1):
        w.write(engine_step_line(engine_step(i, t0 + dt * i, batch=1 if i < n_steps / 2 else 5), t0))
    w.write(load_line(n_steps * dt / 2, 4))
    w.write(policy_line(n_steps * dt / 4, {"kind": "fixed", "k": 1}))
    w.write(session_request_line(request(t0 + 0.5), t0))
    w.write(
        {"type": "summary", "wall_s": n_steps * dt, "num_engine_steps": n_steps, "num_requests": 1, "total_tokens": 9}
    )
    w.close()
