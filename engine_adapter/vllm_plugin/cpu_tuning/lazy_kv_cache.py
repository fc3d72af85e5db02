"""The KV cache on a CPU, mapped instead of written: its pages are committed when first used.

Contract: ``LazyKVCacheMixin`` goes before vLLM's ``CPUWorker`` in every CPU worker class of the
plugin (``workers_cpu.py``). In ``initialize_from_config(kv_cache_config)`` it lets vLLM build the
KV cache as usual, except that the one backing allocation vLLM makes for it (``torch.zeros(size,
dtype=torch.int8)`` in ``vllm.v1.worker.utils.allocate_kv_cache``, ``size`` the shared size of
``kv_cache_config.kv_cache_tensors``) comes from an anonymous private memory map
(``zero_pages``): the kernel hands out zeroed pages on first touch, so the content is the same
zeros vLLM would have written, without writing them at start-up. Every other call passes through
untouched, and a vLLM that allocates differently simply gets its own zeros (logged).

Why: vLLM writes the whole KV cache (2 GiB by default, ``VLLM_CPU_KVCACHE_SPACE``) before it
serves. On the AVX-512 machine of this project (2 CPU cores, 24 GiB, a virtual machine whose
balloon returns free memory to its host) a page never written since it was freed costs about
10 s per GiB to write, so those zeros were 20-23 s of every launch (docs/benchmarks.md,
"where a launch's time goes"). Mapped, a block's pages are committed the first time a request
writes its KV there (a few MB per step at load 64, on top of steps of about a second).
The memory is the same, only taken later: vLLM's start-up check and ours
(``engine.resources``) still count the whole cache, but a machine that runs short of memory
afterwards now fails while serving rather than at start.

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

import logging
import mmap

import torch
from torch.overrides import TorchFunctionMode

logger = logging.getLogger("vllm").getChild("lazy_kv_cache")


def zero_pages(nbytes: int) -> torch.Tensor:
    """``nbytes`` int8 zeros on fresh anonymous pages, none of them written yet.

    The tensor keeps the map alive (``torch.frombuffer`` holds a reference to it)."""
    if nbytes <= 0:
        raise ValueError(f"a mapping needs a positive size, got {nbytes}")
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=torch.int8)


def _is_cpu(device: object) -> bool:
    return device is None or torch.device(device).type == "cpu"


class MappedZeros(TorchFunctionMode):
    """Serves ``torch.zeros(nbytes, dtype=torch.int8[, device=cpu])`` from ``zero_pages``, for
    exactly one size; counts how often it did (``mapped``)."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.nbytes = nbytes
        self.mapped = 0

    def matches(self, args: tuple, kwargs: dict) -> bool:
        size = args[0] if len(args) == 1 else kwargs.get("size", args if args else None)
        if isinstance(size, (tuple, list, torch.Size)):
            size = size[0] if len(size) == 1 else None
        extra = set(kwargs) - {"dtype", "device", "size"}
        return size == self.nbytes and kwargs.get("dtype") == torch.int8 and _is_cpu(kwargs.get("device")) and not extra

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.zeros and self.matches(args, kwargs):
            self.mapped += 1
            return zero_pages(self.nbytes)
        return func(*args, **kwargs)


def backing_size(kv_cache_config) -> int | None:
    """The size in bytes of vLLM's one KV backing allocation, or None where there is none (or,
    unlike vLLM 0.32, several sizes)."""
    sizes = {tensor.size for tensor in kv_cache_config.kv_cache_tensors}
    return sizes.pop() if len(sizes) == 1 else None


class LazyKVCacheMixin:
    """Worker mixin: vLLM's KV cache, on pages committed at first use (module docstring)."""

    def initialize_from_config(self, kv_cache_config) -> None:
        nbytes = backing_size(kv_cache_config)
        if nbytes is None:
            super().initialize_from_config(kv_cache_config)
            return
        mode = MappedZeros(nbytes)
        with mode:
            super().initialize_from_config(kv_cache_config)
        if mode.mapped == 1:
            logger.info("KV cache: %.2f GiB mapped; pages are committed at first use", nbytes / (1 << 30))
        elif mode.mapped == 0:
            logger.warning("KV cache: vLLM did not allocate it as expected; written by vLLM as usual")
        else:
            logger.warning("KV cache: %d allocations of its size mapped (vLLM 0.32 makes one)", mode.mapped)
