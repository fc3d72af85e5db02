"""Slow: the packaged Qwen2.5-Coder 1.5B target / 0.5B draft on vLLM (CPU)."""

from __future__ import annotations

import pytest

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig
from tests.support.engine_checks import check_invariants, run

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_cached_engines")]  # its memory, not idle tiny engines

TASK_PROMPTS = {
    "code": "Write a Python function that returns the n-th Fibonacci number.",
    "math": "What is 17 * 23? Show the steps.",
    "story": "Tell a very short story about a lighthouse keeper.",
    "translation": "Translate to French: The weather is nice today and we are going to the park.",
}


@pytest.fixture(scope="module")
def packaged_prompts():
    return TASK_PROMPTS


async def test_greedy_equality_on_the_packaged_pair():
    """Temperature 0, concurrency 1: speculative text == the target's own greedy text, token for token.

    One engine (a launch of the packaged pair is over a minute on 2 cores): the reference is the
    same engine with K=0 in force (live, through the control channel), where every token is the
    target's plain decode; the tiny-model tests compare with a separate speculation-off engine.
    """
    # reserved_cpus=0: the app's default, the worker on both cores
    config = EngineConfig(
        method="draft", k=3, k_max=3, kv_cache_gib=2, max_model_len=2048, max_num_seqs=8, reserved_cpus=0
    )
    outputs: dict[str, dict[str, list[int]]] = {"draft": {}, "plain": {}}
    engine = await LiveEngine.launch(config)
    try:
        for task, prompt in TASK_PROMPTS.items():
            r = await run(engine, prompt, max_tokens=32)
            check_invariants(r)
            outputs["draft"][task] = r.token_ids
            rate = r.spec_decode_metrics["draft_acceptance_rate"]
            assert 0.2 < rate <= 1.0, (task, rate)
        await engine.client.set_k(0)
        await run(engine, "Hello", max_tokens=1)  # a step that reads the switch
        for task, prompt in TASK_PROMPTS.items():
            r = await run(engine, prompt, max_tokens=32)
            check_invariants(r)
            assert set(r.kinds) <= {"prefill", "plain"}, (task, r.kinds)
            outputs["plain"][task] = r.token_ids
    finally:
        await engine.close()
    for task in TASK_PROMPTS:
        assert outputs["draft"][task] == outputs["plain"][task], task
