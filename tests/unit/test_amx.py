"""``cpu_tuning.amx``: a float32 model's int8 layers never take vLLM's AMX kernel; the rest is vLLM's.

No engine: vLLM's own ``check_cpu_sgl_kernel`` is read through the module the plugin patches, under
the default dtype vLLM sets while it loads a model. On a CPU without AMX vLLM's check says no for
every dtype, and the patched one must agree; on one with AMX (an Intel Xeon since Sapphire Rapids)
the float32 case is the one that failed an engine's first step.
"""

from __future__ import annotations

import pytest
import torch

from engine_adapter.vllm_plugin.cpu_tuning import amx

SHAPES = [(512, 256), (64, 64), (1536, 8960)]  # (n, k): the tiny models' and the packaged target's


@pytest.fixture
def default_dtype():
    before = torch.get_default_dtype()
    yield torch.set_default_dtype
    torch.set_default_dtype(before)


@pytest.mark.parametrize("n,k", SHAPES)
def test_a_float32_model_never_takes_the_amx_int8_kernel(default_dtype, n, k):
    default_dtype(torch.float32)
    with amx.int8_kernels_for_dtype():
        assert amx.scaled_mm_cpu.check_cpu_sgl_kernel(n, k, torch.int8) is False


@pytest.mark.parametrize("model_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.int8])
@pytest.mark.parametrize("n,k", SHAPES)
def test_every_other_choice_is_vllms(default_dtype, model_dtype, weight_dtype, n, k):
    vllms = amx.scaled_mm_cpu.check_cpu_sgl_kernel
    default_dtype(model_dtype)
    expected = vllms(n, k, weight_dtype)
    with amx.int8_kernels_for_dtype():
        got = amx.scaled_mm_cpu.check_cpu_sgl_kernel(n, k, weight_dtype)
    if weight_dtype == torch.int8 and model_dtype == torch.float32:
        assert got is False
    else:
        assert got == expected
    assert amx.scaled_mm_cpu.check_cpu_sgl_kernel is vllms  # put back when the block ends


def test_the_tile_state_is_asked_for_only_where_the_cpu_has_amx():
    assert amx.request_amx_state() == torch.cpu._is_amx_tile_supported()
