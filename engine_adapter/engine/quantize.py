"""Quantised checkpoints made offline without calibration, in compressed-tensors' formats:
int8 W8A8 (``int-quantized``, both CPU kinds) and int4 W4A16 (``pack-quantized``, AVX-512 only).

    python -m engine_adapter.engine.quantize SRC_DIR DST_DIR [--scheme int8|int4]

Contract: ``quantize_int8(src, dst)`` writes to ``dst`` a copy of the Hugging Face checkpoint in
``src`` whose decoder linear layers (``LINEAR``: attention q/k/v/o and MLP gate/up/down
projections) hold int8 weights, rounded to nearest with one scale per output row (|w| max / 127,
``<layer>.weight_scale``, float32 [out, 1]; a row of zeros gets scale 1), and a
``quantization_config`` that vLLM's compressed-tensors loader reads: symmetric per-channel int8
weights, dynamic symmetric per-token int8 activations (``W8A8_CONFIG``). Biases, norms,
embeddings and ``lm_head`` stay as they are, in the checkpoint's dtype. Every other file
(tokenizer, generation config) is copied. Returns a ``QuantReport``: the layers quantized, the
weight bytes before and after, and the rounding error (relative root-mean-square per layer, its
mean and largest). ``dst`` is written beside and renamed into place, so a failure leaves no
half checkpoint. A source that already has a ``quantization_config`` is refused.

``quantize_int4(src, dst)`` does the same with 4-bit weights: symmetric round-to-nearest in
groups of ``INT4_GROUP`` inputs per row (scale |w| max / 7.5 per group, in the checkpoint's
dtype, ``<layer>.weight_scale`` [out, in / group]; values clamped to [-8, 7]), stored offset by
8 and packed eight to an int32 along the input dimension (``<layer>.weight_packed`` [out, in / 8];
value ``8k + i`` of a row in bits ``4i`` of word ``k``, vLLM's ``pack_quantized_values_into_int32``
order) with ``<layer>.weight_shape`` [out, in]; activations stay in the model's dtype
(``W4A16_CONFIG``). ``quantize_checkpoint(src, dst, scheme)`` picks one by name (``SCHEMES``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

LINEAR = re.compile(r"\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")
QMAX = 127
INT8 = {"num_bits": 8, "type": "int", "symmetric": True}
W8A8_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": INT8 | {"strategy": "channel", "dynamic": False},
            "input_activations": INT8 | {"strategy": "token", "dynamic": True},
            "output_activations": None,
        }
    },
    "ignore": ["lm_head"],
}
INT4_GROUP = 128
INT4_MIN, INT4_MAX = -8, 7
W4A16_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
            | {"group_size": INT4_GROUP, "dynamic": False},
            "input_activations": None,
            "output_activations": None,
        }
    },
    "ignore": ["lm_head"],
}


@dataclass(frozen=True)
class QuantReport:
    layers: int
    bytes_before: int
    bytes_after: int
    mean_rel_error: float  # per layer: ||w - dequantised|| / ||w||, averaged over the layers
    max_rel_error: float


def quantize_rows(weight):  # torch.Tensor [out, in] -> (int8 [out, in], float32 [out, 1])
    """Round-to-nearest symmetric int8 with one scale per output row."""
    import torch

    w = weight.to(torch.float32)
    scale = w.abs().amax(dim=1, keepdim=True) / QMAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(w / scale), -QMAX, QMAX).to(torch.int8)
    return q, scale


def _load_tensors(src: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors weights in {src}")
    tensors: dict = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def quantize_groups(weight, group: int = INT4_GROUP):  # [out, in] -> (int8 [out, in], scale [out, in / group])
    """Round-to-nearest symmetric 4-bit values with one scale per ``group`` inputs of a row."""
    import torch

    out, inputs = weight.shape
    if inputs % group:
        raise ValueError(f"a row of {inputs} inputs does not split into groups of {group}")
    w = weight.to(torch.float32).reshape(out, inputs // group, group)
    scale = w.abs().amax(dim=2, keepdim=True) / 7.5
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(weight.dtype)
    q = torch.clamp(torch.round(w / scale.to(torch.float32)), INT4_MIN, INT4_MAX).to(torch.int8)
    return q.reshape(out, inputs), scale.reshape(out, inputs // group)


def pack_int4(q):  # int8 [out, in] in [-8, 7] -> int32 [out, in / 8]
    """Offset by 8 (vLLM's uint4b8) and pack eight values to a word, value ``8k + i`` in bits ``4i``."""
    import torch

    u = (q.to(torch.int32) - INT4_MIN).reshape(q.shape[0], -1, 8)
    words = torch.zeros(u.shape[:2], dtype=torch.int64)
    for i in range(8):
        words |= u[..., i].to(torch.int64) << (4 * i)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _int8_layer(name: str, t) -> tuple[dict, float]:
    import torch

    q, scale = quantize_rows(t)
    w = t.to(torch.float32)
    error = float((w - q.to(torch.float32) * scale).norm() / w.norm().clamp_min(1e-30))
    return {name: q, name[: -len("weight")] + "weight_scale": scale}, error


def _int4_layer(name: str, t) -> tuple[dict, float]:
    import torch

    q, scale = quantize_groups(t)
    w = t.to(torch.float32)
    back = (q.to(torch.float32).reshape(*scale.shape, -1) * scale.to(torch.float32)[..., None]).reshape(w.shape)
    error = float((w - back).norm() / w.norm().clamp_min(1e-30))
    stem = name[: -len("weight")]
    shape = torch.tensor(list(t.shape), dtype=torch.int64)
    return {stem + "weight_packed": pack_int4(q), stem + "weight_scale": scale, stem + "weight_shape": shape}, error


def _write_quantised(src: Path, dst: Path, quantise_layer, quantization_config: dict) -> QuantReport:
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError(f"{src} is quantised already ({config['quantization_config'].get('quant_method')})")
    tensors = _load_tensors(src)
    out, errors, before, after = {}, [], 0, 0
    for name, t in tensors.items():
        before += t.numel() * t.element_size()
        if LINEAR.search(name) and t.dim() == 2:
            layer, error = quantise_layer(name, t)
            errors.append(error)
            out.update(layer)
            after += sum(v.numel() * v.element_size() for v in layer.values())
        else:
            out[name] = t.contiguous()
            after += t.numel() * t.element_size()
    if not errors:
        raise ValueError(f"no decoder linear layers found in {src} (names like {LINEAR.pattern})")
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, tmp / f.name)
    save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config | {"quantization_config": quantization_config}, indent=2) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return QuantReport(len(errors), before, after, sum(errors) / len(errors), max(errors))


def quantize_int8(src: Path, dst: Path) -> QuantReport:
    return _write_quantised(src, dst, _int8_layer, W8A8_CONFIG)


def quantize_int4(src: Path, dst: Path) -> QuantReport:
    return _write_quantised(src, dst, _int4_layer, W4A16_CONFIG)


SCHEMES = {"int8": quantize_int8, "int4": quantize_int4}


def quantize_checkpoint(src: Path, dst: Path, scheme: str) -> QuantReport:
    """``dst`` made from ``src`` in ``scheme`` (a key of ``SCHEMES``)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantisation scheme {scheme!r}: choose from {', '.join(SCHEMES)}")
    return SCHEMES[scheme](src, dst)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine_adapter.engine.quantize", description=__doc__)
    p.add_argument("src", type=Path, help="a Hugging Face checkpoint folder (safetensors)")
    p.add_argument("dst", type=Path, help="where the quantised checkpoint goes")
    p.add_argument("--scheme", choices=sorted(SCHEMES), default="int8", help="int8 W8A8 or int4 W4A16 (default int8)")
    args = p.parse_args(argv)
    try:
        report = quantize_checkpoint(args.src, args.dst, args.scheme)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"dst": str(args.dst), **asdict(report)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
