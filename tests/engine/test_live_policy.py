"""Live K policy switching through the tap's control channel (tiny models, under load)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_asyncio

from engine_adapter.engine.live_engine import LiveEngine, launch_overlapping
from engine_adapter.engine_config import k_for_batch_size
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.k_policy import RECENT_PEAK_S
from engine_adapter.service.load import BackgroundLoad
from engine_adapter.vllm_plugin.wire import DEFAULT_CATCH_UP_TOKENS
from tests.support.engine_checks import PROMPTS, applied, check_invariants, run
from tests.support.fixtures import tiny_config


@pytest_asyncio.fixture(scope="module")
async def live_engines(tiny):
    """The module's two live engines (the draft model, ngram), their vLLM start-ups overlapping."""
    configs = {
        "draft": tiny_config(tiny, "draft", "same", k=3, k_max=4),
        "ngram": tiny_config(tiny, "ngram", k=3, k_max=4),
    }
    engines: dict[str, LiveEngine] = {}
    try:
        await launch_overlapping(configs, engines, lambda key: None, resolve=Path)
        yield engines
    finally:
        for engine in engines.values():
            await engine.close()


@pytest_asyncio.fixture(scope="module")
async def live_engine(live_engines):
    return live_engines["draft"]


async def steps_after(engine, n: int, timeout_s: float = 30.0):
    q = engine.client.tap.watch()
    out = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(out) < n:
                out.append(await q.get())
    finally:
        engine.client.tap.unwatch(q)
    return out


@pytest.mark.parametrize(
    "table",
    [
        [[1, 64, 1]],
        [[1, 64, 0]],
        [[1, 1, 4], [2, 64, 2]],
        [[1, 64, 3]],
    ],
    ids=["k1", "k0", "table-4-then-2", "k3"],
)
async def test_a_live_switch_under_load_changes_k_within_two_steps(live_engine, table):
    def expected(batch_size: int) -> int:
        return k_for_batch_size([tuple(r) for r in table], batch_size, 4)

    # the load starts under K=1, so its requests can draft whatever case ran before (a request
    # prefilled at K=0 has an idle drafter for good, and a step of only such requests runs K=0);
    # the table must be in force before they arrive: an idle engine acknowledges it at its next
    # step, so a short request's steps say when (seen in CI: the load's requests reached the
    # scheduler before the control did, were prefilled under the previous case's K=0 and never drafted)
    await live_engine.client.set_k_table([[1, 64, 1]])
    await applied(live_engine)
    load = BackgroundLoad(live_engine.client, PROMPTS, max_tokens=400, max_seconds=120)
    load.set_concurrency(2)
    try:
        await steps_after(live_engine, 5)  # the load is flowing
        q = live_engine.client.tap.watch()
        await live_engine.client.set_k_table(table)
        n = live_engine.client.controls_sent
        # the engine acknowledges in its step messages; delivery itself takes a
        # few ms that a busy machine can stretch, so count from the acknowledgement
        steps = []
        async with asyncio.timeout(30):
            while len([s for s in steps if s.controls >= n]) < 8:
                steps.append(await q.get())
        live_engine.client.tap.unwatch(q)
        acked = [s for s in steps if s.controls >= n]
        sent_at = acked[0].seq - 1
        seen = [(s.seq, s.batch_size, s.k, s.controls) for s in steps]
        switched = [s for s in acked if s.k == expected(s.batch_size)]
        assert switched, seen
        assert switched[0].seq - sent_at <= 2, f"K changed later than two steps after the switch: {seen}"
        later = [s for s in acked if s.seq > sent_at + 2]
        assert later and all(s.k == expected(s.batch_size) for s in later), seen
        # drafts verified per request never exceed the K in force, or the previous step's: vLLM's
        # async scheduler sizes a request's draft placeholders one step ahead, so when the batch
        # size (and with it the table's K) changes, that step verifies the previous K's drafts
        by_seq = {x.seq: x for x in steps}
        for x in later:
            k_prev = by_seq[x.seq - 1].k if x.seq - 1 in by_seq else x.k
            assert x.num_drafted <= max(x.k, k_prev) * x.num_drafting, seen
    finally:
        await load.stop()


async def test_bad_tables_are_refused_and_the_engine_keeps_going(live_engine):
    with pytest.raises(ValueError, match="first row must start at batch size 1"):
        await live_engine.client.set_k_table([[2, 8, 3]])
    await live_engine.client.set_k(2)
    n = live_engine.client.controls_sent
    # the command has its own channel, beside the requests': on a busy machine a whole short
    # request can run before it lands (CI saw [3]*6), so wait for the engine's acknowledgement
    q = live_engine.client.tap.watch()
    acked = False
    try:
        async with asyncio.timeout(60):
            while not acked:
                check_invariants(await run(live_engine, PROMPTS[0], max_tokens=24))  # the engine keeps going
                while not q.empty():
                    acked |= q.get_nowait().controls >= n
    finally:
        live_engine.client.tap.unwatch(q)
    r = await run(live_engine, PROMPTS[0], max_tokens=24)
    check_invariants(r)
    assert {s.k for s in r.steps[1:]} == {2}, [s.k for s in r.steps]
    assert r.spec_decode_metrics["num_spec_tokens"] == 4  # the engine's k_max


async def test_output_stays_lossless_while_k_changes(live_engine, engines):
    plain = await engines.get("off")
    reference = await run(plain, PROMPTS[1], max_tokens=48)
    for k in (0, 1, 4):
        await live_engine.client.set_k(k)
        r = await run(live_engine, PROMPTS[1], max_tokens=48)
        check_invariants(r)
        assert r.token_ids == reference.token_ids, k


def auction_steps(steps):
    return [s for s in steps if s.auction_slots is not None]


@pytest.mark.parametrize(
    "cost, expect",
    [
        (CostModel(0.1, 0.0, 0), "all"),  # free verification: every slot admitted
        # purely compute-bound (cost proportional to tokens): a draft pays only if certain
        (CostModel(0.0, 10.0, 0), "none"),
    ],
    ids=["free", "proportional"],
)
async def test_the_auction_trims_drafts_before_verification(live_engine, cost, expect):
    load = BackgroundLoad(live_engine.client, PROMPTS, max_tokens=200, max_seconds=120)
    load.set_concurrency(2)
    try:
        await live_engine.client.set_auction(cost)
        n = live_engine.client.controls_sent
        q = live_engine.client.tap.watch()
        steps = []
        async with asyncio.timeout(60):
            while len(auction_steps([s for s in steps if s.controls >= n])) < 10:
                steps.append(await q.get())
        live_engine.client.tap.unwatch(q)
    finally:
        await load.stop()
    decided = auction_steps([s for s in steps if s.controls >= n])[2:]  # past the switch's placeholder lag
    seen = [(s.seq, s.batch_size, s.num_drafted, s.auction_slots) for s in decided]
    for s in decided:
        assert s.auction_slots == sum(b.admitted for b in s.bids), seen
        assert s.num_drafted <= s.auction_slots, seen  # never more verified than admitted
        assert all(0 <= b.admitted <= len(b.scores) <= 4 for b in s.bids)
        assert all(list(b.scores) == sorted(b.scores, reverse=True) for b in s.bids)
        if expect == "all":
            assert all(b.admitted == len(b.scores) for b in s.bids), seen
        else:
            assert s.auction_slots == 0 and s.num_drafted == 0, seen


async def test_equal_slots_share_the_auctions_budget_alike(live_engine):
    """Under ``equal``, each step admits the auction's number of slots, shared so that no two
    bidders differ by more than one (unless one drafted fewer), and each request verifies no
    more than it was admitted (its own row in the step)."""
    load = BackgroundLoad(live_engine.client, PROMPTS, max_tokens=200, max_seconds=120)
    load.set_concurrency(3)
    try:
        # free below 5 tokens, then 0.02 s a token: a step of 3 requests has 2 free slots
        await live_engine.client.set_auction(CostModel(0.05, 0.02, 5), allocation="equal")
        n = live_engine.client.controls_sent
        q = live_engine.client.tap.watch()
        steps = []

        def shared() -> list:  # steps under the equal auction with two bidders or more: a budget to share
            return [s for s in auction_steps([s for s in steps if s.controls >= n]) if len(s.bids) >= 2]

        async with asyncio.timeout(60):  # a busy machine can leave the load's requests between two for a while
            while len(shared()) < 12:
                steps.append(await q.get())
        live_engine.client.tap.unwatch(q)
    finally:
        await load.stop()
    decided = shared()[2:]
    seen = [(s.seq, [(b.admitted, len(b.scores)) for b in s.bids]) for s in decided]
    assert any(0 < s.auction_slots < sum(len(b.scores) for b in s.bids) for s in decided), seen  # some trimmed
    for s in decided:
        assert s.auction_slots == sum(b.admitted for b in s.bids), seen
        level = max(b.admitted for b in s.bids)
        assert all(b.admitted >= min(level - 1, len(b.scores)) for b in s.bids), seen
        verified = {r.request_id: r.num_drafted for r in s.requests}
        assert all(verified.get(b.request_id, 0) <= b.admitted for b in s.bids), (seen, verified)
    with pytest.raises(ValueError, match="allocation"):
        await live_engine.client.set_auction(CostModel(0.05, 0.02, 5), allocation="richest")


async def test_the_auction_is_lossless(live_engine, engines):
    plain = await engines.get("off")
    reference = await run(plain, PROMPTS[2], max_tokens=48)
    await live_engine.client.set_auction(CostModel(0.1, 0.02, 2))
    r = await run(live_engine, PROMPTS[2], max_tokens=48)
    check_invariants(r)
    assert r.token_ids == reference.token_ids


@pytest_asyncio.fixture(scope="module")
async def live_ngram(live_engines):
    return live_engines["ngram"]


async def test_the_auction_runs_on_the_sync_ngram_drafter(live_ngram, engines):
    """ngram runs vLLM's synchronous scheduler: the drafts are real ids when trimmed."""
    plain = await engines.get("off")
    prompt = "one two three four one two three four one two three four one two"
    reference = await run(plain, prompt, max_tokens=40)
    q = live_ngram.client.tap.watch()
    await live_ngram.client.set_auction(CostModel(0.1, 0.0, 0))
    r = await run(live_ngram, prompt, max_tokens=40)
    live_ngram.client.tap.unwatch(q)
    check_invariants(r)
    assert r.token_ids == reference.token_ids
    steps = []
    while not q.empty():
        steps.append(q.get_nowait())
    assert auction_steps(steps), "no step ran under the auction"


# --- the idle drafter: no draft-model pass at K=0, a hole in the draft KV after it, caught up later


async def _steps_of(engine, prompt: str, max_tokens: int):
    r = await run(engine, prompt, max_tokens=max_tokens)
    check_invariants(r)
    return r


def _seen(r) -> list[tuple]:
    return [(s.index, s.batch_size, s.k, s.num_drafted, s.accepted, s.drafter_idle, s.caught_up) for s in r.steps]


def _check_caught_up_once(r, opened_at: int) -> int:
    """The hole opened at step ``opened_at`` is caught up in one step, exactly over the positions
    between (a decode step moves the segment start by the tokens it emits; the prefill, by the
    prompt); no drafts until then; drafts from the next step on, all kept (the draft model is the
    target). Returns the catch-up step."""
    catch = [s for s in r.steps if s.caught_up]
    assert len(catch) == 1, _seen(r)
    at = catch[0].index
    assert at > opened_at, _seen(r)
    prefill = r.num_prompt_tokens - 1 if opened_at == 0 else 0  # step 0 computed the prompt, emitted 1
    assert catch[0].caught_up == prefill + sum(len(s.emitted) for s in r.steps if opened_at <= s.index < at), _seen(r)
    holed = [s for s in r.steps if opened_at <= s.index < at]
    # the step the hole opened at may verify drafts proposed before it (when the request ran a
    # step alone before the other arrived); none are made while the hole is open
    assert all(s.drafter_idle for s in holed) and not any(s.num_drafted for s in holed[1:]), _seen(r)
    after = [s for s in r.steps if s.index > at]
    assert after and not any(s.drafter_idle for s in after), _seen(r)
    drafted, accepted = sum(s.num_drafted for s in after), sum(s.accepted for s in after)
    # a wrong draft KV after the catch-up would show here: the same model then guesses wrong
    assert drafted > 0 and accepted >= 0.95 * drafted, (drafted, accepted, _seen(r))
    return at


@pytest.mark.parametrize("catch_up_tokens", [DEFAULT_CATCH_UP_TOKENS, 0])
async def test_an_idle_drafter_skips_k0_steps_and_catches_up_after(live_engine, engines, catch_up_tokens):
    """K=0 while two requests run, K=4 when one is left: the long one's draft model skipped the
    shared steps; it catches them up and drafts again, or, with no catch-up budget, drafts across
    the hole (blanked with zeros at the K=0 steps) without ever catching it up."""
    assert live_engine.process.config.drafter_idles
    plain = await engines.get("off")
    long_ref = await run(plain, PROMPTS[0], max_tokens=400)
    short_ref = await run(plain, PROMPTS[1], max_tokens=8)
    await live_engine.client.set_catch_up_tokens(catch_up_tokens)
    await live_engine.client.set_k_table([[1, 1, 4], [2, 64, 0]])
    long, short = await asyncio.gather(_steps_of(live_engine, PROMPTS[0], 400), _steps_of(live_engine, PROMPTS[1], 8))
    assert long.token_ids == long_ref.token_ids and short.token_ids == short_ref.token_ids  # lossless
    shared = [s for s in long.steps if s.batch_size >= 2]
    assert shared and all(s.k == 0 for s in shared)
    opened_at = next(s.index for s in long.steps if s.drafter_idle)
    assert opened_at <= shared[0].index + 1
    if catch_up_tokens:
        assert _check_caught_up_once(long, opened_at) > shared[-1].index
    else:
        alone_after = [s for s in long.steps if s.index > shared[-1].index + 1 and s.batch_size == 1]
        assert alone_after and all(s.k == 4 and s.drafter_idle for s in alone_after), _seen(long)
        assert sum(s.num_drafted for s in alone_after) > 0, _seen(long)  # across the hole
        assert not any(s.caught_up for s in long.steps)
    # a request that starts alone drafts at K=4, from a drafter cache that is whole
    fresh = await _steps_of(live_engine, PROMPTS[2], 24)
    assert not any(s.drafter_idle or s.caught_up for s in fresh.steps), _seen(fresh)
    assert sum(s.num_drafted for s in fresh.steps) > 0 and sum(s.accepted for s in fresh.steps) > 0
    log = live_engine.process.log_path.read_text(errors="replace")
    assert "skips its pass in steps with K=0" in log and "the draft model's pass is skipped" in log
    assert "a catch-up failed" not in log and "blanking a hole's draft KV failed" not in log
    await live_engine.client.set_catch_up_tokens(DEFAULT_CATCH_UP_TOKENS)


async def test_the_auction_drafts_again_when_the_load_falls(live_engine, engines):
    """Drafting pays at one request, not at two (the drafter's first pass costs 0.25 s per
    request): the pair runs without drafts; the long one, left alone, catches its hole up and
    drafts again (with a budget that fits its whole hole), and a new request drafts from the start."""
    plain = await engines.get("off")
    refs = [await run(plain, p, max_tokens=n) for p, n in ((PROMPTS[0], 300), (PROMPTS[1], 100), (PROMPTS[2], 24))]
    await live_engine.client.set_catch_up_tokens(1024)
    await live_engine.client.set_auction(CostModel(0.1, 0.0, 0, first_s_per_req=0.25), prior=0.95)
    pair = await asyncio.gather(_steps_of(live_engine, PROMPTS[0], 300), _steps_of(live_engine, PROMPTS[1], 100))
    assert all(any(s.drafter_idle for s in r.steps) for r in pair), "two requests: the drafter should idle"
    long = pair[0]
    opened_at = next(s.index for s in long.steps if s.drafter_idle)
    at = _check_caught_up_once(long, opened_at)
    assert all(s.batch_size == 1 for s in long.steps if s.index >= at), _seen(long)  # once the short one ended
    alone = await _steps_of(live_engine, PROMPTS[2], 24)  # the engine is empty again
    assert not any(s.drafter_idle for s in alone.steps)
    assert sum(s.num_drafted for s in alone.steps) > 0, _seen(alone)
    assert [r.token_ids for r in (*pair, alone)] == [r.token_ids for r in refs]
    await live_engine.client.set_catch_up_tokens(DEFAULT_CATCH_UP_TOKENS)


@pytest.mark.parametrize("policy", ["table", "auction"])
async def test_a_request_right_after_a_burst_does_not_engage_the_drafter(live_engine, engines, policy):
    """Drafting pays alone, not at two requests (the table [[1,1,4],[2,64,0]], or the auction
    with a drafter first pass of 0.25 s per request): a request arriving alone right after a
    pair (whose steps are among the last RECENT_PEAK_STEPS) is not engaged, the pair's size
    being the guess for the load to come; once the pair's steps are past, its hole (its whole
    prompt and what it has written) is caught up and it drafts. One arriving after
    RECENT_PEAK_S of idle engine is engaged from its first step."""
    ref = await run(await engines.get("off"), PROMPTS[2], max_tokens=40)
    if policy == "table":
        await live_engine.client.set_k_table([[1, 1, 4], [2, 64, 0]])
    else:
        await live_engine.client.set_auction(CostModel(0.1, 0.0, 0, first_s_per_req=0.25), prior=0.95)
    await asyncio.gather(_steps_of(live_engine, PROMPTS[0], 16), _steps_of(live_engine, PROMPTS[1], 16))
    right_after = await _steps_of(live_engine, PROMPTS[2], 40)
    # its prefill ran at K=0 (the pair's steps were the last ones); how many steps more is how
    # many of the pair's steps remain among the last RECENT_PEAK_STEPS (the pair's two requests
    # start some steps apart, so it also ends with some steps of one)
    assert right_after.steps[0].k == 0 and right_after.steps[0].drafter_idle, _seen(right_after)
    assert right_after.token_ids == ref.token_ids
    _check_caught_up_once(right_after, 0)  # the hole was the whole request: its prompt and its tokens
    await asyncio.sleep(RECENT_PEAK_S + 0.5)
    later = await _steps_of(live_engine, PROMPTS[2], 40)
    assert not any(s.drafter_idle or s.caught_up for s in later.steps)
    assert sum(s.num_drafted for s in later.steps) > 0 and later.token_ids == ref.token_ids
