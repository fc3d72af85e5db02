"""The idle drafter blanks what it skips: at a K=0 step the draft model's KV at the step's slots is
written with zeros (``idle_drafter.zero_kv_slots``), so a hole never exposes the draft KV another
request left in a reused block.

A real vLLM attention layer (the CPU backend, its ISA set by vLLM's own metadata builder) over a
real KV cache tensor, written by the layer's own KV writer; only the drafter around the layer is
reduced to the attribute the worker reads (``model``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers.attention.attention import Attention  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadataBuilder  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

from engine_adapter.vllm_plugin.idle_drafter import (  # noqa: E402
    StepCatchUp,
    draft_attention_layers,
    skip_at_zero,
    zero_kv_slots,
)

HEADS, HEAD_SIZE, BLOCK, BLOCKS = 2, 32, 16, 4
PER_SLOT = HEADS * HEAD_SIZE * 2  # elements a slot holds: keys and values


@pytest.fixture(scope="module")
def draft_model(tiny):
    """A one-layer stand-in draft model whose attention layer is vLLM's own, bound to a KV cache of ones."""
    config = VllmConfig(model_config=ModelConfig(model=str(tiny.target), dtype="float32"))
    names = [f"draft.layers.{i}.self_attn.attn" for i in range(2)]
    with set_current_vllm_config(config):
        layers = [
            Attention(num_heads=HEADS, head_size=HEAD_SIZE, scale=HEAD_SIZE**-0.5, num_kv_heads=HEADS, prefix=n)
            for n in names
        ]
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float32)
        # sets each layer's kernel ISA
        CPUAttentionMetadataBuilder(
            kv_cache_spec=spec, layer_names=names, vllm_config=config, device=torch.device("cpu")
        )
    return SimpleNamespace(model=torch.nn.ModuleList(layers))


@pytest.mark.parametrize(
    "slots, zeros_per_block",
    [
        ([0, 5, 17], [2, 1, 0, 0]),  # slot = block * 16 + offset
        ([63], [0, 0, 0, 1]),
        ([16, -1, 31], [0, 2, 0, 0]),  # -1 (padding) is left alone by vLLM's writer
        ([], [0, 0, 0, 0]),
    ],
)
def test_the_skipped_slots_and_only_they_hold_zeros(draft_model, slots, zeros_per_block):
    layers = draft_attention_layers(draft_model)
    assert len(layers) == 2
    for layer in layers:  # the cache as another request left it
        layer.kv_cache = torch.ones(BLOCKS, HEADS, BLOCK, 2 * HEAD_SIZE)  # the CPU backend's layout
    assert zero_kv_slots(layers, torch.tensor(slots, dtype=torch.int64), torch.float32) is True
    for layer in layers:
        per_block = (layer.kv_cache == 0).reshape(BLOCKS, -1).sum(dim=1).tolist()
        assert per_block == [n * PER_SLOT for n in zeros_per_block]


def test_without_layers_nothing_is_blanked():
    """A drafter with no attention layer of its own to write (none found): the scheduler hears
    nothing, and keeps such holes undrafted."""
    assert zero_kv_slots([], torch.tensor([0, 1]), torch.float32) is False
    assert draft_attention_layers(SimpleNamespace(model=torch.nn.Linear(2, 2))) == []


class _Drafter:
    """The drafter's attributes the wrapper reads; ``propose`` records that vLLM's pass ran."""

    def __init__(self, model) -> None:
        self.model = model
        self.num_speculative_tokens = 3
        self.passes = 0

    def propose(self, **kwargs):
        self.passes += 1
        return torch.zeros(kwargs["common_attn_metadata"].num_reqs, kwargs["num_speculative_tokens"])


def _first_pass_metadata(slots: list[int]) -> CommonAttentionMetadata:
    """Two requests, one token each at K=0 (a decode step), at the given target slots (+ padding)."""
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor([6, 18], dtype=torch.int32),
        num_reqs=2,
        num_actual_tokens=2,
        max_query_len=1,
        max_seq_len=18,
        block_table_tensor=torch.tensor([[0, 1], [1, 2]], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
    )


@pytest.mark.parametrize("k, blanked", [(0, True), (3, False)])
def test_a_k0_step_skips_the_pass_and_blanks_exactly_its_tokens_slots(draft_model, k, blanked):
    """At K=0 the wrapper runs no pass and zeroes the step's slots (5 and 17; the padding slot after
    ``num_actual_tokens`` is not the step's); at K>0 vLLM's pass runs and nothing is blanked."""
    for layer in draft_attention_layers(draft_model):
        layer.kv_cache = torch.ones(BLOCKS, HEADS, BLOCK, 2 * HEAD_SIZE)
    drafter, step = _Drafter(draft_model.model), StepCatchUp()
    skip_at_zero(drafter, SimpleNamespace(input_batch=None), step)
    cad = _first_pass_metadata([5, 17, 40])
    out = drafter.propose(num_speculative_tokens=k, common_attn_metadata=cad, next_token_ids=torch.zeros(2))
    assert out.shape == (2, k) and step.proposed and step.zeroed is blanked
    assert drafter.passes == (0 if k == 0 else 1)
    for layer in draft_attention_layers(draft_model):
        per_block = (layer.kv_cache == 0).reshape(BLOCKS, -1).sum(dim=1).tolist()
        assert per_block == ([PER_SLOT, PER_SLOT, 0, 0] if blanked else [0, 0, 0, 0])
