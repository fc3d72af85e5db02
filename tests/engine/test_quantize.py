"""int8 W8A8 checkpoints of the tiny models: the converter's output, table-checked, and vLLM serving
an int8 pair with speculation (the tap's invariants hold; greedy speculative text equals the same
int8 target's text with speculation off; the agreement with the full target is reported)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine.quantize import LINEAR, QMAX, W8A8_CONFIG, quantize_int8, quantize_rows
from engine_adapter.engine.variants import parse_variants, variant_models
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


async def test_vllm_serves_an_int8_pair_with_speculation(tiny, int8_family):
    root, _ = int8_family
    off = replace(tiny_config(tiny, "off"), target=str(root / "target"))
    spec = replace(tiny_config(tiny, "draft"), target=str(root / "target"), draft=str(root / "close"))
    full = tiny_config(tiny, "off")
    texts: dict[str, list[list[int]]] = {}
    for name, config in (("int8 off", off), ("int8 draft", spec), ("full off", full)):
        engine = await LiveEngine.launch(config)
        try:
            results = [await run(engine, p, max_tokens=32) for p in PROMPTS]
        finally:
            await engine.close()
        if name == "int8 draft":
            for r in results:
                check_invariants(r)
            assert sum(r.kinds.count("accepted") for r in results) > 0  # the int8 draft's drafts were kept
        texts[name] = [r.token_ids for r in results]
    assert texts["int8 draft"] == texts["int8 off"], "speculation changed the int8 target's greedy text"
    agree = sum(a == b for a, b in zip(texts["int8 off"], texts["full off"]))
    print(f"int8 target's greedy text equals the full target's for {agree} of {len(PROMPTS)} prompts")


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
