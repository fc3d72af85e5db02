"""The KV cache mapped instead of written (engine_adapter/vllm_plugin/cpu_tuning/lazy_kv_cache.py),
without vLLM's engine: which allocations are mapped, that mapped pages read as zeros and are not
resident until written, and the mixin around a worker's ``initialize_from_config``. On a real engine:
tests/engine/test_engine_tiny.py::test_the_kv_cache_is_committed_at_first_use."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine_adapter.vllm_plugin.cpu_tuning.lazy_kv_cache import LazyKVCacheMixin, MappedZeros, backing_size, zero_pages

MIB = 1 << 20
SIZE = 64 * MIB


def resident_kib() -> int:
    return int(
        next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS")).split()[1]
    )


@pytest.mark.parametrize(
    "args, kwargs, mapped",
    [
        ((SIZE,), {"dtype": torch.int8, "device": torch.device("cpu")}, True),  # vLLM 0.32's call
        ((SIZE,), {"dtype": torch.int8, "device": "cpu"}, True),
        ((SIZE,), {"dtype": torch.int8}, True),
        (((SIZE,),), {"dtype": torch.int8}, True),
        ((SIZE - 1,), {"dtype": torch.int8}, False),  # another size: another tensor
        ((SIZE,), {"dtype": torch.float32}, False),
        ((SIZE,), {}, False),  # float32 by default
        ((SIZE,), {"dtype": torch.int8, "device": "meta"}, False),
        ((SIZE,), {"dtype": torch.int8, "layout": torch.strided}, False),  # anything else asked: its own
        ((2, SIZE // 2), {"dtype": torch.int8}, False),
    ],
)
def test_only_the_kv_backing_allocation_is_mapped(args, kwargs, mapped):
    with MappedZeros(SIZE) as mode:
        tensor = torch.zeros(*args, **kwargs)
    assert mode.mapped == int(mapped)
    assert tensor.dtype == kwargs.get("dtype", torch.float32)
    if tensor.device.type == "cpu":
        assert not tensor.any()


def test_mapped_zeros_are_zeros_and_resident_only_once_written():
    before = resident_kib()
    pages = zero_pages(256 * MIB)
    assert (pages.dtype, pages.shape, pages.is_contiguous()) == (torch.int8, (256 * MIB,), True)
    assert resident_kib() - before < 16 * 1024  # KiB: nothing of the 256 MiB is resident yet
    pages[: 128 * MIB] = 7
    assert resident_kib() - before > 120 * 1024  # written: committed
    assert bool((pages[: 128 * MIB] == 7).all()) and not pages[128 * MIB :].any()
    with pytest.raises(ValueError):
        zero_pages(0)


def test_the_backing_size_is_the_one_size_vllm_shares():
    def config(*sizes):
        return SimpleNamespace(kv_cache_tensors=[SimpleNamespace(size=s) for s in sizes])

    assert backing_size(config(SIZE, SIZE, SIZE)) == SIZE
    assert backing_size(config(SIZE, SIZE + 1)) is None
    assert backing_size(config()) is None


class FakeWorker:
    """Stands for vLLM's worker: allocates what its ``initialize_from_config`` is given to."""

    def __init__(self, allocate) -> None:
        self.allocate = allocate
        self.kv = None

    def initialize_from_config(self, kv_cache_config) -> None:
        self.kv = self.allocate(backing_size(kv_cache_config) or MIB)


class MappedWorker(LazyKVCacheMixin, FakeWorker):
    pass


@pytest.mark.parametrize(
    "allocate, mapped_log",
    [
        (lambda n: torch.zeros(n, dtype=torch.int8, device=torch.device("cpu")), "mapped"),
        (lambda n: torch.zeros(n, dtype=torch.uint8), "written by vLLM"),  # vLLM changed: its own zeros
        (lambda n: [torch.zeros(n, dtype=torch.int8) for _ in range(2)][0], "2 allocations"),
    ],
)
def test_the_mixin_maps_the_cache_its_worker_allocates(allocate, mapped_log, caplog):
    worker = MappedWorker(allocate)
    before = resident_kib()
    with caplog.at_level("INFO", logger="vllm"):
        worker.initialize_from_config(SimpleNamespace(kv_cache_tensors=[SimpleNamespace(size=SIZE)] * 3))
    assert worker.kv.numel() == SIZE and not worker.kv.any()
    assert mapped_log in caplog.text
    if mapped_log != "written by vLLM":
        assert resident_kib() - before < 16 * 1024  # reading zeros commits nothing
    assert not torch._C._is_torch_function_mode_enabled()  # the mode is gone after the call


def test_vllms_own_allocator_gets_one_mapped_buffer():
    """vLLM 0.32's ``allocate_kv_cache`` on a small two-layer config: its one backing buffer is the
    mapped one (a vLLM that allocates otherwise fails here before an engine shows it)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
    blocks, layers = 64, ["layer.0", "layer.1"]
    tensor = KVCacheTensor(
        size=spec.page_size_bytes * blocks * 2,
        layers=layers,
        layer_stride=spec.page_size_bytes * blocks,
        block_stride=spec.page_size_bytes,
    )
    groups = [KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)]
    config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[tensor], kv_cache_groups=groups)
    with MappedZeros(backing_size(config)) as mode:
        caches = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.LBHNC, None)
    assert mode.mapped == 1
    assert set(caches) == set(layers) and all(c.dtype == torch.float32 and not c.any() for c in caches.values())
