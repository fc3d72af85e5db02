"""The ledger on a real engine (tiny models, the perturbed draft): each step's rows are the
requests vLLM ran in it, no more, no fewer; a visitor's own request's account in the ledger is
exactly what its own stream says; the load's requests carry their task kind."""

from __future__ import annotations

import asyncio

from engine_adapter.ledger import ledger_rows
from engine_adapter.prompts import Preset
from engine_adapter.records import RequestResult, Step, is_profile_request, load_request_kind
from engine_adapter.service.load import BackgroundLoad

LOAD = [Preset("code", "add", "def add(a, b):"), Preset("story", "fox", "The quick brown fox")]
OWN_ID = "ledgerowntest"


def plain_s(batch_size: int) -> float:
    return 0.05 + 0.001 * batch_size


async def _own_request(engine) -> tuple[list[Step], RequestResult]:
    steps: list[Step] = []
    async for item in engine.client.generate(
        "for i in range(10):", max_tokens=48, temperature=0.0, request_id=OWN_ID, watched=True
    ):
        if isinstance(item, RequestResult):
            return steps, item
        steps.append(item)
    raise AssertionError("no result")


async def test_the_ledger_holds_every_request_vllm_runs_and_yours_as_it_streamed(engines):
    engine = await engines.get("draft", "perturbed", 3)
    load = BackgroundLoad(engine.client, LOAD, max_tokens=200, max_seconds=120)
    q = engine.client.tap.watch()
    try:
        load.set_concurrency(3)
        await asyncio.sleep(2.0)  # the load is running
        async with asyncio.timeout(120):
            _, result = await _own_request(engine)
        await asyncio.sleep(0.5)
    finally:
        engine.client.tap.unwatch(q)
        await load.stop()
    steps = []
    while not q.empty():
        steps.append(q.get_nowait())
    assert len(steps) > 10
    for s in steps:
        ids = [r.request_id for r in s.requests]
        assert len(ids) == len(set(ids)) and len(ids) <= s.batch_size, (s.seq, ids, s.batch_size)
        # the step's totals are its rows' sums: the rows are every request vLLM processed
        assert sum(r.num_drafted for r in s.requests) == s.num_drafted, s
        assert sum(r.num_emitted for r in s.requests) == s.num_emitted, s
        for rid in ids:  # only the load's requests and ours: no profiling, no stranger
            assert rid == OWN_ID or load_request_kind(rid) in ("code", "story"), rid
            assert not is_profile_request(rid)
    # while ours ran, the load ran beside it, every request of the step in its rows (the load's
    # three all at once in most runs; a busy machine can leave two of them between requests for
    # all of ours, so at least one)
    ours = [s for s in steps if any(r.request_id == OWN_ID for r in s.requests)]
    widest = max(ours, key=lambda s: s.batch_size)
    assert widest.batch_size >= 2 and len(widest.requests) == widest.batch_size, widest
    rows = {r.request_id: r for r in ledger_rows(steps, plain_s, own=OWN_ID)}
    mine = rows[OWN_ID]
    assert mine.owner == "you"
    # the ledger's account of our request is what its own stream said, step for step
    assert mine.steps == len(result.steps)
    assert mine.num_emitted == len(result.token_ids)
    assert mine.num_drafted == sum(s.num_drafted for s in result.steps)
    assert mine.num_accepted == sum(s.accepted for s in result.steps)  # lossless rule: all are vLLM's own
    assert mine.speedup is not None and mine.speedup > 0
    kinds = {r.kind for r in rows.values() if r.owner == "load"}
    assert kinds == {"code", "story"}, kinds
    assert all(r.predictability is None or 0 <= r.predictability <= 1 for r in rows.values())
