"""Quantised checkpoints of the tiny models (int8 W8A8; int4 W4A16 on AVX-512): the converter's
output, table-checked, and vLLM serving a quantised pair with speculation (the tap's invariants
hold; greedy speculative text equals the same quantised target's text with speculation off). The
agreement with the full target's text is the sweep's (``tests/engine/test_sweep_cli.py``,
``--variants``)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from engine_adapter.engine.live_engine import LiveEngine, launch_overlapping
from engine_adapter.engine.quantize import (
    INT4_GROUP,
    LINEAR,
    QMAX,
    W4A16_CONFIG,
    W8A8_CONFIG,
    pack_int4,
    quantize_groups,
    quantize_int4,
    quantize_int8,
    quantize_rows,
)
from engine_adapter.engine.variants import parse_variants, variant_models
from engine_adapter.engine_config import available_variants
from tests.support.engine_checks import PROMPTS, check_invariants, run
from tests.support.fixtures import tiny_config


@pytest.mark.parametrize(
    ("rows", "scales"),
    [
        ([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]], [2.0 / QMAX, 1.0]),  # a zero row gets scale 1, not 0
        ([[-127.0, 63.5, 1.0]], [1.0]),
        ([[1e-3, -1e-3, 5e-4]], [1e-3 / QMAX]),
    ],
)
def test_rows_are_rounded_to_int8_with_one_scale_each(rows, scales):
    w = torch.tensor(rows)
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (len(rows), 1)
    assert scale.flatten().tolist() == pytest.approx(scales)
    assert int(q.abs().max()) <= QMAX
    assert (q.float() * scale - w).abs().max() <= scale.max() / 2 + 1e-9  # round to nearest


@pytest.mark.parametrize(
    ("row", "scales", "values"),
    [
        ([7.5] + [1.0] * 3 + [0.0] * 4, [1.0], [7, 1, 1, 1, 0, 0, 0, 0]),  # the largest clamps to 7
        ([-7.5, 3.75, 0.0, 0.0, 3.75, -1.0, 1.0, 0.0], [1.0, 0.5], [-8, 4, 0, 0, 7, -2, 2, 0]),
        ([0.0] * 8, [1.0, 1.0], [0] * 8),  # a group of zeros gets scale 1, not 0
    ],
)
def test_groups_are_rounded_to_int4_with_one_scale_each(row, scales, values):
    w = torch.tensor([row])
    q, scale = quantize_groups(w, group=len(row) // len(scales))
    assert q.dtype == torch.int8 and scale.shape == (1, len(scales)) and scale.dtype == w.dtype
    assert scale.flatten().tolist() == pytest.approx(scales) and q.flatten().tolist() == values


def test_int4_values_pack_in_the_order_vllm_unpacks():
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    q = torch.randint(-8, 8, (32, 256), dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (32, 32)
    assert torch.equal(unpack_quantized_values_into_int32(packed, scalar_types.uint4b8, 1) - 8, q.to(torch.int32))
    word = pack_int4(torch.tensor([[-8, -7, 0, 1, 2, 3, 4, 7]], dtype=torch.int8)).item()
    nibbles = [0, 1, 8, 9, 10, 11, 12, 15]  # offset by 8; value i in bits 4i, the word's sign from the last
    assert word == sum(n << 4 * i for i, n in enumerate(nibbles)) - 2**32


@pytest.fixture(scope="module")
def int8_family(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    reports = {name: quantize_int8(getattr(tiny, name), root / name) for name in ("target", "close")}
    return root, reports


def test_the_checkpoint_holds_int8_layers_and_keeps_the_rest(tiny, int8_family):
    root, reports = int8_family
    full, q = load_file(str(tiny.target / "model.safetensors")), load_file(str(root / "target" / "model.safetensors"))
    linear = [n for n in full if LINEAR.search(n)]
    assert linear and reports["target"].layers == len(linear)
    for name in linear:
        assert q[name].dtype == torch.int8 and q[name].shape == full[name].shape
        scale = q[name[: -len("weight")] + "weight_scale"]
        assert scale.shape == (full[name].shape[0], 1) and scale.dtype == torch.float32
        back = q[name].float() * scale
        assert (back - full[name]).abs().max() <= scale.max() / 2 + 1e-6
    kept = [n for n in full if not LINEAR.search(n)]  # biases, norms, embeddings, as they were
    assert all(torch.equal(q[n], full[n]) for n in kept)
    assert not [n for n in q if n.endswith("lm_head.weight") and q[n].dtype == torch.int8]
    config = json.loads((root / "target" / "config.json").read_text())
    assert config["quantization_config"] == W8A8_CONFIG
    assert (root / "target" / "tokenizer.json").is_file() and (root / "target" / "generation_config.json").is_file()
    assert reports["target"].bytes_after < reports["target"].bytes_before
    assert 0 < reports["target"].mean_rel_error <= reports["target"].max_rel_error < 0.02
    with pytest.raises(ValueError, match="quantised already"):
        quantize_int8(root / "target", root / "again")


def test_the_int4_checkpoint_holds_packed_groups_and_keeps_the_rest(tiny, tmp_path):
    report = quantize_int4(tiny.target, tmp_path / "int4")
    full, q = load_file(str(tiny.target / "model.safetensors")), load_file(str(tmp_path / "int4" / "model.safetensors"))
    linear = [n for n in full if LINEAR.search(n)]
    assert linear and report.layers == len(linear)
    for name in linear:
        stem, (out, inputs) = name[: -len("weight")], full[name].shape
        assert name not in q and q[stem + "weight_packed"].shape == (out, inputs // 8)
        assert q[stem + "weight_scale"].shape == (out, inputs // INT4_GROUP)
        assert q[stem + "weight_shape"].tolist() == [out, inputs]
    assert all(torch.equal(q[n], full[n]) for n in full if not LINEAR.search(n))
    assert json.loads((tmp_path / "int4" / "config.json").read_text())["quantization_config"] == W4A16_CONFIG
    assert report.bytes_after < report.bytes_before / 4  # float32 weights: about an eighth, plus scales
    assert 0 < report.mean_rel_error <= report.max_rel_error < 0.2


@pytest.mark.skipif("int4-pair" not in available_variants(), reason="int4 W4A16 runs in bfloat16 only (AVX-512 BF16)")
async def test_vllm_serves_an_int4_pair_with_speculation(tiny, tmp_path):
    for name in ("target", "close"):
        quantize_int4(getattr(tiny, name), tmp_path / name)
    await _serves_with_speculation(tiny, tmp_path, dtype="bfloat16")


async def test_vllm_serves_an_int8_pair_with_speculation(tiny, int8_family):
    await _serves_with_speculation(tiny, int8_family[0])


async def _serves_with_speculation(tiny, root, dtype: str = "float32"):
    off = replace(tiny_config(tiny, "off"), target=str(root / "target"), dtype=dtype)
    spec = replace(tiny_config(tiny, "draft"), target=str(root / "target"), draft=str(root / "close"), dtype=dtype)
    texts: dict[str, list[list[int]]] = {}
    engines: dict[str, LiveEngine] = {}
    try:
        await launch_overlapping({"quantised off": off, "quantised draft": spec}, engines, lambda name: None)
        for name, engine in engines.items():
            results = [await run(engine, p, max_tokens=32) for p in PROMPTS]
            if name == "quantised draft":
                for r in results:
                    check_invariants(r)
                assert sum(r.kinds.count("accepted") for r in results) > 0  # the quantised draft's drafts were kept
            texts[name] = [r.token_ids for r in results]
    finally:
        for engine in engines.values():
            await engine.close()
    assert texts["quantised draft"] == texts["quantised off"], "speculation changed the quantised target's text"


def test_a_variant_makes_its_int8_copy_once_and_again_when_the_source_changes(tiny, tmp_path):
    source = tmp_path / "target"
    shutil.copytree(tiny.target, source)
    target, draft = variant_models("int8-target", source, tiny.close, tmp_path / "cache")
    assert draft == tiny.close  # the full draft, as it is
    assert target == tmp_path / "cache" / "target-int8"
    assert "quantization_config" in json.loads((target / "config.json").read_text())
    made = (target / "model.safetensors").stat().st_mtime_ns
    assert variant_models("int8-target", source, tiny.close, tmp_path / "cache")[0] == target
    assert (target / "model.safetensors").stat().st_mtime_ns == made  # kept, not made again
    weights = source / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # the source changed
    variant_models("int8-target", source, tiny.close, tmp_path / "cache")
    assert (target / "model.safetensors").stat().st_mtime_ns != made
    assert variant_models("full", source, tiny.close, tmp_path / "cache") == (source, tiny.close)
    with pytest.raises(ValueError, match="unknown model variant int4"):
        parse_variants("full,int4")
