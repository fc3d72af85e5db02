"""The KV cache mapped instead of written (engine_adapter/vllm_plugin/lazy_kv_cache.py), without vLLM's engine:
which allocations are mapped, that mapped pages read as zeros and are not resident until written,
and the mixin around a worker's ``initialize_from_config``. On a real engine:
tests/engine/test_engine_tiny.py::test_the_kv_cache_is_committed_at_first_use."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine_adapter.vllm_plugin.lazy_kv_cache import LazyKVCacheMixin, MappedZeros, backing_size, zero_pages

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
        assert int(tensor.abs().max()) == 0


def test_mapped_zeros_are_zeros_and_resident_only_once_written():
    before = resident_kib()
    pages = zero_pages(256 * MIB)
    assert (pages.dtype, pages.shape, pages.is_contiguous()) == (torch.int8, (256 * MIB,), True)
    assert resident_kib() - before < 16 * 1024  # KiB: nothing of the 256 MiB is resident yet
    pages[: 128 * MIB] = 7
    assert resident_kib() - before > 120 * 1024  # written: committed
    assert int(pages[: 128 * MIB].min()) == 7 and int(pages[128 * MIB :].abs().max()) == 0
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
    ],
)
def test_the_mixin_maps_the_cache_its_worker_allocates(allocate, mapped_log, caplog):
    worker = MappedWorker(allocate)
    before = resident_kib()
    with caplog.at_level("INFO", logger="vllm"):
        worker.initialize_from_config(SimpleNamespace(kv_cache_tensors=[SimpleNamespace(size=SIZE)] * 3))
    assert worker.kv.numel() == SIZE and int(worker.kv.abs().max()) == 0
    assert mapped_log in caplog.text
    if mapped_log == "mapped":
        assert resident_kib() - before < 16 * 1024  # reading zeros commits nothing
    assert not torch.overrides.has_torch_function_variadic()  # the mode is gone after the call
