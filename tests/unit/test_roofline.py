"""The memory roofline's arithmetic and the bench rows' fraction of it (the bandwidth itself is measured
by ``python -m engine_adapter.bench``, not here: a unit test must not time the machine)."""

from __future__ import annotations

import json
import math
import os
import struct

import pytest

from engine_adapter.engine.roofline import bytes_read_per_step, roofline_tokens_per_s, weight_bytes, worker_cores
from engine_adapter.measure.throughput import add_roofline


@pytest.mark.parametrize(
    "bandwidth, step_bytes, batch, tokens_per_s",
    [
        (14.0, 3_100_000_000, 1, 4.516),  # one core and the 1.5B target in bf16 (DESIGN.md section 9)
        (28.0, 3_100_000_000, 1, 9.032),
        (28.0, 3_100_000_000, 4, 36.13),  # a batch shares one read of the weights
        (28.0, 0, 1, 0.0),
    ],
)
def test_roofline(bandwidth, step_bytes, batch, tokens_per_s):
    assert roofline_tokens_per_s(bandwidth, step_bytes, batch) == pytest.approx(tokens_per_s, rel=1e-3)


@pytest.mark.parametrize("reserved, cores", [(None, max(1, (os.cpu_count() or 1) - 1)), (0, os.cpu_count() or 1)])
def test_worker_cores(reserved, cores):
    assert worker_cores(reserved) == cores


def test_weight_bytes_are_the_safetensors_files(tmp_path):
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 300)
    (tmp_path / "model-00002.safetensors").write_bytes(b"x" * 200)
    (tmp_path / "config.json").write_text("{}")
    assert weight_bytes(tmp_path) == 500


@pytest.mark.parametrize(
    "row, fraction",
    [
        ({"method": "off", "worker_cores": 2, "concurrency": 1, "tokens_per_s": 8.0}, 0.889),
        ({"method": "off", "worker_cores": 1, "concurrency": 2, "tokens_per_s": 4.5}, 0.5),
        ({"method": "draft", "worker_cores": 1, "concurrency": 1, "tokens_per_s": 9.0}, None),  # not plain decoding
    ],
)
def test_bench_rows_get_their_roofline_fraction(row, fraction):
    machine = {
        "bandwidth_gbs": {"1": 9.0, "2": 18.0},
        "target_weight_bytes": 2_400_000_000,
        "target_bytes_per_step": 2_000_000_000,
    }
    add_roofline(row, machine)
    assert row.get("roofline_fraction") == (pytest.approx(fraction, abs=1e-3) if fraction else None)


@pytest.mark.parametrize(
    "config, stored, dtype, file_bytes, per_step",
    [
        # the packaged 1.5B target: untied, 151936 x 1536 bf16 input embedding (0.467 GB) only gathered
        (
            {"tie_word_embeddings": False, "vocab_size": 151936, "hidden_size": 1536, "torch_dtype": "bfloat16"},
            "bfloat16",
            "bfloat16",
            3_554_214_752,
            3_554_214_752 - 151936 * 1536 * 2,
        ),
        # tied (the 0.5B draft, and transformers' default): the table is read once, as the output layer
        (
            {"tie_word_embeddings": True, "vocab_size": 151936, "hidden_size": 896, "torch_dtype": "bfloat16"},
            "bfloat16",
            "bfloat16",
            988_097_824,
            988_097_824,
        ),
        ({"vocab_size": 100, "hidden_size": 10, "torch_dtype": "bfloat16"}, "bfloat16", "bfloat16", 5_000, 5_000),
        # bf16 files loaded as float32: twice the bytes, and the embedding in float32 too
        (
            {"tie_word_embeddings": False, "vocab_size": 100, "hidden_size": 10, "torch_dtype": "bfloat16"},
            "bfloat16",
            "float32",
            5_000,
            10_000 - 100 * 10 * 4,
        ),
    ],
)
def test_bytes_read_per_step_leave_out_an_untied_input_embedding(tmp_path, config, stored, dtype, file_bytes, per_step):
    with (tmp_path / "model.safetensors").open("wb") as f:
        f.truncate(file_bytes)  # a sparse file: its size, no disk
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert bytes_read_per_step(tmp_path, dtype) == per_step


def _safetensors(path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose header lists these (dtype, shape) tensors (data left as zeros)."""
    sizes = {"I8": 1, "BF16": 2, "F32": 4}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


@pytest.mark.parametrize("dtype, per_float", [("bfloat16", 2), ("float32", 4)])
def test_a_quantised_checkpoint_counts_int8_tensors_at_one_byte(tmp_path, dtype, per_float):
    """int8 weights stay one byte a value whatever the dtype; scales, norms and the head take ``dtype``;
    an untied input embedding is left out (one row per token)."""
    _safetensors(
        tmp_path / "model.safetensors",
        {
            "model.layers.0.mlp.up_proj.weight": ("I8", [64, 32]),
            "model.layers.0.mlp.up_proj.weight_scale": ("F32", [64, 1]),
            "model.norm.weight": ("BF16", [32]),
            "lm_head.weight": ("BF16", [100, 32]),
            "model.embed_tokens.weight": ("BF16", [100, 32]),
        },
    )
    config = {"tie_word_embeddings": False, "vocab_size": 100, "hidden_size": 32, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config | {"quantization_config": {"format": "int-quantized"}}))
    floats = 64 + 32 + 100 * 32  # scales, norm, head
    assert bytes_read_per_step(tmp_path, dtype) == 64 * 32 + floats * per_float
