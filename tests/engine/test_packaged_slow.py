"""Slow: the packaged Qwen2.5-Coder 1.5B target / 0.5B draft on vLLM (CPU)."""

from __future__ import annotations

import pytest

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig
from tests.support.engine_checks import check_invariants, run

pytestmark = pytest.mark.slow

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
    """Temperature 0, concurrency 1: speculative text == plain text, token for token."""
    base = dict(kv_cache_gib=2, max_model_len=2048, max_num_seqs=8, reserved_cpus=0)  # the app's default
    outputs: dict[str, dict[str, list[int]]] = {}
    for method in ("off", "draft"):
        engine = await LiveEngine.launch(EngineConfig(method=method, k=3, **base))
        try:
            outputs[method] = {}
            for task, prompt in TASK_PROMPTS.items():
                r = await run(engine, prompt, max_tokens=32)
                check_invariants(r)
                outputs[method][task] = r.token_ids
                if method == "draft":
                    rate = r.spec_decode_metrics["draft_acceptance_rate"]
                    assert 0.2 < rate <= 1.0, (task, rate)
        finally:
            await engine.close()
    for task in TASK_PROMPTS:
        assert outputs["draft"][task] == outputs["off"][task], task
