"""Model variants of a pair: the full checkpoints, a quantised target beside the full draft, a
quantised pair (int8 W8A8 on both CPU kinds, int4 W4A16 on AVX-512).

Contract: ``VARIANTS`` (``engine_config.MODEL_VARIANTS``) names them in the order a table shows
them (the full pair first: the one the others are compared with) with each model's scheme.
``variant_models(variant, target_dir, draft_dir, cache_dir)`` returns the (target, draft) folders
a variant runs, making each quantised copy it needs once (``quantised_checkpoint``:
``engine.quantize.quantize_checkpoint`` into ``<cache>/<source name>-<scheme>``, under a file
lock, so two processes never build one copy twice). A copy records its source (``SOURCE_FILE``:
the source folder and its weights' sizes and times) and is rebuilt when the source changes. What
a variant's step reads is ``engine.roofline.bytes_read_per_step``'s (tensors counted at their
stored size: int8 one byte, packed int4 half a byte per weight).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine_adapter.engine_config import MODEL_VARIANTS as VARIANTS

SOURCE_FILE = "quant_source.json"


def parse_variants(text: str) -> list[str]:
    """A comma-separated list of variant names, checked (``ValueError`` names the unknown one)."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise ValueError(f"unknown model variant {', '.join(unknown) or '(none)'}: choose from {', '.join(VARIANTS)}")
    return names


def _source_stamp(src: Path) -> dict:
    files = sorted(f for f in src.iterdir() if f.suffix == ".safetensors")
    return {"source": str(src.resolve()), "weights": [[f.name, f.stat().st_size, f.stat().st_mtime] for f in files]}


def quantised_checkpoint(src: Path, cache_dir: Path, scheme: str) -> Path:
    """The ``scheme`` copy of the checkpoint ``src``, made on first use (about 20 s for the 1.5B target)."""
    from filelock import FileLock

    from engine_adapter.engine.quantize import quantize_checkpoint

    src = Path(src)
    dst = Path(cache_dir) / f"{src.name}-{scheme}"
    dst.parent.mkdir(parents=True, exist_ok=True)
    stamp = _source_stamp(src)
    with FileLock(str(dst.parent / f"{dst.name}.lock")):
        try:
            if json.loads((dst / SOURCE_FILE).read_text()) == stamp:
                return dst
        except (OSError, ValueError):
            pass
        print(f"== making the {scheme} copy of {src.name} (once; kept in {dst})", file=sys.stderr)
        report = quantize_checkpoint(src, dst, scheme)
        (dst / SOURCE_FILE).write_text(json.dumps(stamp) + "\n")
        print(
            f"   {report.layers} layers, {report.bytes_before / 1e9:.2f} -> {report.bytes_after / 1e9:.2f} GB, "
            f"rounding error mean {report.mean_rel_error:.2%}, largest {report.max_rel_error:.2%}",
            file=sys.stderr,
        )
    return dst


def variant_models(variant: str, target: Path, draft: Path, cache_dir: Path) -> tuple[Path, Path]:
    """The (target, draft) folders of ``variant`` for the full pair (``target``, ``draft``)."""
    target_scheme, draft_scheme = VARIANTS[variant]
    return (
        quantised_checkpoint(target, cache_dir, target_scheme) if target_scheme else Path(target),
        quantised_checkpoint(draft, cache_dir, draft_scheme) if draft_scheme else Path(draft),
    )
