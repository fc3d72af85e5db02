"""The truth pipeline on a real vLLM engine with tiny models.

Every test drives vLLM's OpenAI server started by our launcher with the
scheduler tap, and checks the provenance against vLLM's own numbers.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from engine_adapter.engine.prometheus import fetch_snapshot
from engine_adapter.engine.supervise import group_members
from engine_adapter.service.load import run_prompts
from engine_adapter.vllm_plugin.cpu_tuning.loading_cores import machine_cores, thread_affinities
from tests.support.engine_checks import PROMPTS, check_invariants, run
from tests.support.fixtures import EngineCache

MODULE_ENGINES = [("draft", "same", 3), ("draft", "random", 3), ("draft", "perturbed", 3), ("off", "same", 3)]
MODULE_ENGINES += [("ngram", "same", 3)]


@pytest_asyncio.fixture(scope="module", autouse=True)
async def module_engines(engines: EngineCache) -> None:
    """Every engine this module's tests use, started before the first with their vLLM start-ups
    overlapping (they all run until the module ends anyway)."""
    await engines.start(MODULE_ENGINES)


@pytest.mark.parametrize(
    "draft, low, high",
    [
        ("same", 1.0, 1.0),  # a draft equal to the target: every draft is kept
        ("random", 0.0, 0.1),  # an independent random init: (almost) none kept
        ("perturbed", 0.1, 0.95),  # a noisy copy: some kept
    ],
)
async def test_draft_acceptance_by_draft_quality(engines, draft, low, high):
    engine = await engines.get("draft", draft)
    rates = []
    for prompt in PROMPTS:
        r = await run(engine, prompt)
        check_invariants(r)
        assert r.provenance == "tap"
        rates.append(r.spec_decode_metrics["draft_acceptance_rate"])
    mean = sum(rates) / len(rates)
    assert low <= mean <= high, rates


@pytest.mark.parametrize(
    "method, draft", [("draft", "same"), ("draft", "random"), ("draft", "perturbed"), ("ngram", "same")]
)
async def test_greedy_speculative_text_equals_plain_text(engines, method, draft):
    plain = await engines.get("off")
    spec = await engines.get(method, draft)
    for prompt in PROMPTS:
        a = await run(plain, prompt, max_tokens=48)
        b = await run(spec, prompt, max_tokens=48)
        assert a.spec_decode_metrics is None and all(k in ("prefill", "plain") for k in a.kinds)
        check_invariants(b)
        assert b.token_ids == a.token_ids, f"speculation changed greedy output for {prompt!r}"
        assert b.text == a.text


async def test_concurrent_requests_keep_exact_provenance(engines):
    engine = await engines.get("draft", "perturbed")
    results = await run_prompts(engine.client, PROMPTS * 2, 8, max_tokens=32)
    assert len(results) == 8
    for r in results:
        check_invariants(r)
    assert max(s.batch_size for r in results for s in r.steps) > 1


async def test_no_step_waits_for_a_lost_notification(engines):
    """A guard against a lost-notification stall: tiny-model steps come milliseconds apart, and when
    the engine core waited for its worker's notification alone, each lost one cost vLLM's 5 s recheck
    (this test then failed with 5.02 s gaps). It passes with vLLM's spin too; that CPU launches use the polling
    executor is tests/unit/test_platform_launch.py's, its bound tests/unit/test_plugin_paths.py's."""
    engine = await engines.get("draft", "perturbed")
    results = await run_prompts(engine.client, PROMPTS * 2, 4, max_tokens=48)
    results += [await run(engine, prompt, max_tokens=48) for prompt in PROMPTS]
    gaps = [b.t - a.t for r in results for a, b in zip(r.steps, r.steps[1:])]  # s between one request's steps
    assert len(gaps) > 100
    assert max(gaps) < 1.0, sorted(gaps)[-5:]


def resident_kib(pid: int, min_size_kib: int) -> list[tuple[int, int]]:
    """(size, resident) in KiB of each anonymous mapping of ``pid`` at least ``min_size_kib`` large."""
    maps, current = [], None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            current = len(fields) < 6  # no path: anonymous
        elif fields[0] == "Size:" and current:
            size = int(fields[1])
        elif fields[0] == "Rss:" and current and size >= min_size_kib:
            maps.append((size, int(fields[1])))
    return maps


def _member(engine, comm: str) -> int:
    """The one process of the engine's group named ``comm`` (``VLLM::Worker``, ``VLLM::EngineCor``)."""
    (pid,) = [p for p in group_members(engine.process.pid) if Path(f"/proc/{p}/comm").read_text().strip() == comm]
    return pid


async def test_the_kv_cache_is_committed_at_first_use(engines):
    """Every CPU launch maps its KV cache instead of writing it (vllm_plugin/cpu_tuning/lazy_kv_cache.py): after
    requests ran, the worker's 1 GiB KV mapping is mostly not resident, and the outputs are right
    (the other tests of this file run on such engines)."""
    engine = await engines.get("draft", "perturbed")
    check_invariants(await run(engine, PROMPTS[0], max_tokens=32))
    assert "pages are committed at first use" in engine.process.log_path.read_text(errors="replace")
    worker = _member(engine, "VLLM::Worker")
    kv = resident_kib(worker, 900 << 10)  # the 1 GiB cache (tiny models: nothing else as large)
    assert len(kv) == 1, resident_kib(worker, 256 << 10)
    size, rss = kv[0]
    # vLLM's own cache is resident whole (written at start-up); blocks earlier tests used are resident
    assert rss < size // 2, kv


def _cores_in(pattern: str, log: str) -> set[int]:
    found = re.search(pattern, log)
    assert found, (pattern, log[-3000:])
    return {int(c) for c in found.group(1).split(",")}


async def test_the_worker_loads_on_every_core_and_serves_on_its_own(engines):
    """vllm_plugin/cpu_tuning/loading_cores.py: the models loaded on the cores vLLM divides (its engine core's);
    after a request, the worker's threads are on the cores vLLM bound it to, and on no other."""
    engine = await engines.get("draft", "perturbed")
    check_invariants(await run(engine, PROMPTS[0], max_tokens=16))
    log = engine.process.log_path.read_text(errors="replace")
    loaded = _cores_in(r"loaded on cores \[([\d, ]+)\] in [\d.]+ s", log)
    serving = _cores_in(r"loaded on cores .* serving on \[([\d, ]+)\]", log)
    bound = _cores_in(r"local_rank=0, core ids=\[([\d, ]+)\]", log)  # vLLM's OpenMP binding
    assert loaded == os.sched_getaffinity(_member(engine, "VLLM::EngineCor")) & machine_cores()
    assert serving == bound and bound <= loaded
    threads = thread_affinities(_member(engine, "VLLM::Worker"))
    assert all(cores <= bound for cores in threads.values()), threads
    assert set().union(*threads.values()) == bound


async def test_ngram_steps_without_drafts_are_plain(engines):
    engine = await engines.get("ngram")
    r = await run(engine, "ab ab ab ab ab ab ab ab", max_tokens=40)
    check_invariants(r)
    assert r.spec_decode_metrics["num_spec_tokens"] == 3


async def test_stop_cuts_the_last_step_short(engines):
    # With a draft equal to the target every step would emit K+1 = 4 tokens;
    # max_tokens=6 forces the last step to stop early. vLLM still counts the
    # drafts it accepted in that step; our metrics must agree.
    engine = await engines.get("draft", "same")
    r = await run(engine, PROMPTS[0], max_tokens=6)
    check_invariants(r)
    assert len(r.token_ids) == 6
    last = r.steps[-1]
    assert len(last.emitted) < last.accepted + 1
    assert r.finish_reason == "length"


async def test_prometheus_deltas_match_the_request(engines):
    engine = await engines.get("draft", "perturbed")
    async with httpx.AsyncClient() as http:
        before = await fetch_snapshot(http, engine.url)
        r = await run(engine, PROMPTS[1], max_tokens=40)
        await asyncio.sleep(1.5)  # vLLM publishes its counters once per logging interval
        after = await fetch_snapshot(http, engine.url)
    delta = after - before
    m = r.spec_decode_metrics
    assert delta.counts["draft_tokens"] == m["num_draft_tokens"]
    assert delta.counts["accepted_tokens"] == m["num_accepted_draft_tokens"]
    assert delta.effective_k == pytest.approx(3.0)
    assert delta.draft_acceptance_rate == pytest.approx(m["draft_acceptance_rate"])
    per_pos = delta.per_position_acceptance
    assert len(per_pos) == 3 and all(p is None or 0 <= p <= 1 for p in per_pos)
