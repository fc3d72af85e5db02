"""The idle drafter's catch-up on the worker: ``rewrite_first_pass`` builds the draft model's first
pass with the planned ranges in front (engine_adapter/vllm_plugin/idle_drafter.py).

Real ``CommonAttentionMetadata`` and torch tensors laid out as vLLM 0.32's padded drafter batch
lays them out; the input batch and the drafter are reduced to the public attributes the rewrite
reads (``req_ids``, ``token_ids_cpu``; ``max_num_tokens``, ``net_num_new_slots_per_request``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402

from engine_adapter.vllm_plugin.idle_drafter import PADDING_SLOT_ID, rewrite_first_pass  # noqa: E402

# three requests: a at positions 10-12 (a decode verifying 2 drafts), b at 20, c a prefill chunk 0-3
REQ_IDS = ["a", "b", "c"]
POSITIONS = [10, 11, 12, 20, 0, 1, 2, 3]
ROW = [0, 0, 0, 1, 2, 2, 2, 2]
QSL = [0, 3, 4, 8]
HIDDEN = 4


def token_id(row: int, pos: int) -> int:
    return 100 * (row + 1) + pos  # every id says where it belongs


@dataclass
class InputBatch:
    req_ids: list[str]
    token_ids_cpu: np.ndarray  # [max_num_reqs, max_model_len] int32, position -> id


@dataclass
class Drafter:
    max_num_tokens: int
    net_num_new_slots_per_request: int = 1


def first_pass_kwargs() -> dict:
    qsl = torch.tensor(QSL, dtype=torch.int32)
    cad = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,  # on CPU vLLM's two copies are one tensor
        seq_lens=torch.tensor([13, 21, 4], dtype=torch.int32),
        num_reqs=3,
        num_actual_tokens=8,
        max_query_len=4,
        max_seq_len=21,
        block_table_tensor=torch.arange(24, dtype=torch.int32).reshape(3, 8),
        slot_mapping=torch.arange(8, dtype=torch.int64),
    )
    return {
        "num_speculative_tokens": 3,
        "target_token_ids": torch.tensor([token_id(r, p) for r, p in zip(ROW, POSITIONS)], dtype=torch.int32),
        "target_positions": torch.tensor(POSITIONS, dtype=torch.int64),
        "target_hidden_states": torch.arange(8 * HIDDEN, dtype=torch.float32).reshape(8, HIDDEN),
        "next_token_ids": torch.tensor([13, 21, 4], dtype=torch.int32),
        "common_attn_metadata": cad,
    }


def input_batch() -> InputBatch:
    ids = np.array([[token_id(r, p) for p in range(32)] for r in range(3)], dtype=np.int32)
    return InputBatch(list(REQ_IDS), ids)


@pytest.mark.parametrize(
    "plan, room, applied, qsl, positions",
    [
        # b missed 17-19: they go in front of its segment
        ({"b": (17, 3)}, 64, {"b": 3}, [0, 3, 7, 11], [10, 11, 12, 17, 18, 19, 20, 0, 1, 2, 3]),
        # a missed 5-9 and b 17-19, both fit
        (
            {"a": (5, 5), "b": (17, 3)},
            64,
            {"a": 5, "b": 3},
            [0, 8, 12, 16],
            [5, 6, 7, 8, 9, 10, 11, 12, 17, 18, 19, 20, 0, 1, 2, 3],
        ),
        # the drafter's buffers hold 8 + 3 slots + 4 more: b's 3 fit, a's 5 do not
        ({"a": (5, 5), "b": (17, 3)}, 15, {"b": 3}, [0, 3, 7, 11], [10, 11, 12, 17, 18, 19, 20, 0, 1, 2, 3]),
        # a range that does not end just before the segment is not applied (the hole stays)
        ({"b": (16, 3)}, 64, {}, QSL, POSITIONS),
        # a request not in the batch: nothing to do
        ({"z": (0, 4)}, 64, {}, QSL, POSITIONS),
        # no room at all
        ({"b": (17, 3)}, 11, {}, QSL, POSITIONS),
    ],
)
def test_the_planned_ranges_go_in_front_of_their_segments(plan, room, applied, qsl, positions):
    kwargs = first_pass_kwargs()
    out, done = rewrite_first_pass(kwargs, plan, input_batch(), Drafter(max_num_tokens=room))
    assert done == applied
    cad = out["common_attn_metadata"]
    assert out["target_positions"].tolist() == positions
    assert cad.query_start_loc.tolist() == qsl and cad.query_start_loc_cpu.tolist() == qsl
    row_of = np.repeat(np.arange(3), np.diff(qsl))
    # every id is its own request's id at that position: no request ever gets another's tokens
    assert out["target_token_ids"].tolist() == [token_id(r, p) for r, p in zip(row_of, positions)]
    if not applied:
        assert out is kwargs
        return
    total = len(positions)
    assert cad.num_actual_tokens == total and cad.max_query_len == int(np.diff(qsl).max())
    assert out["target_token_ids"].dtype == torch.int32 and out["target_positions"].dtype == torch.int64
    assert cad.slot_mapping.tolist() == [PADDING_SLOT_ID] * total  # recomputed by vLLM from positions
    assert out["target_hidden_states"].shape == (total, HIDDEN)
    # unchanged: sequence lengths, block table, batch size, the bonus tokens
    assert cad.seq_lens.tolist() == [13, 21, 4] and cad.num_reqs == 3 and cad.max_seq_len == 21
    assert out["next_token_ids"] is kwargs["next_token_ids"]
    # the input tensors (views of the runner's buffers in vLLM) are left as they were
    assert kwargs["target_positions"].tolist() == POSITIONS
    assert kwargs["common_attn_metadata"].query_start_loc.tolist() == QSL


def test_m_rope_positions_are_left_alone():
    kwargs = first_pass_kwargs()
    kwargs["target_positions"] = torch.zeros(3, 8, dtype=torch.int64)  # [3, T]: M-RoPE
    out, done = rewrite_first_pass(kwargs, {"b": (17, 3)}, input_batch(), Drafter(64))
    assert out is kwargs and done == {}
