"""int8 W8A8 checkpoints, made offline without calibration (compressed-tensors' int-quantized format).

    python -m engine_adapter.engine.quantize SRC_DIR DST_DIR

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


def quantize_int8(src: Path, dst: Path) -> QuantReport:
    import torch
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
            q, scale = quantize_rows(t)
            w = t.to(torch.float32)
            errors.append(float((w - q.to(torch.float32) * scale).norm() / w.norm().clamp_min(1e-30)))
            out[name], out[name[: -len("weight")] + "weight_scale"] = q, scale
            after += q.numel() + scale.numel() * 4
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
    (tmp / "config.json").write_text(json.dumps(config | {"quantization_config": W8A8_CONFIG}, indent=2) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return QuantReport(len(errors), before, after, sum(errors) / len(errors), max(errors))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine_adapter.engine.quantize", description=__doc__)
    p.add_argument("src", type=Path, help="a Hugging Face checkpoint folder (safetensors)")
    p.add_argument("dst", type=Path, help="where the int8 W8A8 checkpoint goes")
    args = p.parse_args(argv)
    try:
        report = quantize_int8(args.src, args.dst)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"dst": str(args.dst), **asdict(report)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
