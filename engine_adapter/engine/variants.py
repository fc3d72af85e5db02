"""Model variants of a pair: the full checkpoints, an int8 target beside the full draft, an int8 pair.

Contract: ``VARIANTS`` (``engine_config.MODEL_VARIANTS``) names them in the order a table shows
them (the full pair first: the one the others are compared with). ``variant_models(variant,
target_dir, draft_dir, cache_dir)`` returns the (target, draft) folders a variant runs, making
each int8 copy it needs once
(``int8_checkpoint``: ``engine.quantize.quantize_int8`` into ``<cache>/<source name>-int8``,
under a file lock, so two processes never build one copy twice). A copy records its source
(``SOURCE_FILE``: the source folder and its weights' sizes and times) and is rebuilt when the
source changes. What a variant's step reads is ``engine.roofline.bytes_read_per_step``'s (int8
tensors count one byte each).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine_adapter.engine_config import MODEL_VARIANTS as VARIANTS

SOURCE_FILE = "int8_source.json"


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


def int8_checkpoint(src: Path, cache_dir: Path) -> Path:
    """The int8 W8A8 copy of the checkpoint ``src``, made on first use (about 20 s for the 1.5B target)."""
    from filelock import FileLock

    from engine_adapter.engine.quantize import quantize_int8

    src = Path(src)
    dst = Path(cache_dir) / f"{src.name}-int8"
    dst.parent.mkdir(parents=True, exist_ok=True)
    stamp = _source_stamp(src)
    with FileLock(str(dst.parent / f"{dst.name}.lock")):
        try:
            if json.loads((dst / SOURCE_FILE).read_text()) == stamp:
                return dst
        except (OSError, ValueError):
            pass
        print(f"== making the int8 copy of {src.name} (once; kept in {dst})", file=sys.stderr)
        report = quantize_int8(src, dst)
        (dst / SOURCE_FILE).write_text(json.dumps(stamp) + "\n")
        print(
            f"   {report.layers} layers, {report.bytes_before / 1e9:.2f} -> {report.bytes_after / 1e9:.2f} GB, "
            f"rounding error mean {report.mean_rel_error:.2%}, largest {report.max_rel_error:.2%}",
            file=sys.stderr,
        )
    return dst


def variant_models(variant: str, target: Path, draft: Path, cache_dir: Path) -> tuple[Path, Path]:
    """The (target, draft) folders of ``variant`` for the full pair (``target``, ``draft``)."""
    quant_target, quant_draft = VARIANTS[variant]
    return (
        int8_checkpoint(target, cache_dir) if quant_target else Path(target),
        int8_checkpoint(draft, cache_dir) if quant_draft else Path(draft),
    )
