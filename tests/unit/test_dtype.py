"""The engine's dtype by CPU: bfloat16 only where the CPU computes in it natively."""

from __future__ import annotations

import pytest

from engine_adapter import engine_config
from engine_adapter.engine.platform import cpu_platform
from engine_adapter.engine.server_args import server_args
from engine_adapter.engine_config import EngineConfig, cpu_dtype, resolve_dtype


@pytest.mark.parametrize(
    "flags, dtype",
    [
        ({"avx2", "fma", "avx512f", "avx512_bf16"}, "bfloat16"),  # Intel Cooper Lake and later, AMD Zen 4
        ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),  # Sapphire Rapids
        ({"avx2", "fma", "avx512f"}, "float32"),  # AVX-512 without BF16: emulated
        ({"avx", "avx2", "fma"}, "float32"),  # the project's AVX2 AMD EPYC cores
        (set(), "float32"),
    ],
)
def test_cpu_dtype(flags, dtype):
    assert cpu_dtype(frozenset(flags)) == dtype


@pytest.mark.parametrize(
    "asked, cpu_build, flags, passed",
    [
        ("auto", True, {"avx2"}, "float32"),
        ("auto", True, {"avx512_bf16"}, "bfloat16"),
        ("auto", False, {"avx2"}, "auto"),  # a GPU build: vLLM's own auto (the model's dtype)
        ("bfloat16", True, {"avx2"}, "bfloat16"),  # asked for: passed through
        ("float16", True, {"avx512_bf16"}, "float16"),
    ],
)
def test_resolve_dtype(monkeypatch, asked, cpu_build, flags, passed):
    monkeypatch.setattr(engine_config, "on_cpu_build", lambda: cpu_build)
    monkeypatch.setattr(engine_config, "cpu_flags", lambda: frozenset(flags))
    assert resolve_dtype(asked) == passed


def test_the_server_is_given_the_resolved_dtype(monkeypatch):
    monkeypatch.setattr(engine_config, "on_cpu_build", lambda: True)
    monkeypatch.setattr(engine_config, "cpu_flags", lambda: frozenset({"avx2"}))
    args = server_args(EngineConfig(method="off"), "/m", None, 8000, cpu_platform())
    assert args[args.index("--dtype") + 1] == "float32"


@pytest.mark.parametrize(
    "stored, dtype, size, loaded",
    [
        ("bfloat16", "float32", 3_000, 6_000),  # the packaged pair on an AVX2 CPU
        ("bfloat16", "bfloat16", 3_000, 3_000),
        ("float32", "float32", 4_000, 4_000),  # the tiny test models
        ("float32", "bfloat16", 4_000, 2_000),
        ("int8", "float32", 1_000, 1_000),  # unknown: as stored
    ],
)
def test_loaded_bytes(stored, dtype, size, loaded):
    from engine_adapter.engine.resources import loaded_bytes

    assert loaded_bytes(size, stored, dtype) == loaded
