"""The check of the quantised copies: greedy text on the preset prompts against the full models.

    python -m engine_adapter.quant_check [--schemes int8,int4] [--models target,draft]
                                         [--max-tokens 64] [--categories code,story,...]
                                         [--target SPEC] [--draft SPEC] [--dtype auto]

For each scheme (int4 only where ``engine_config.available_variants`` allows it: a bfloat16
engine) and each model of the pair, makes the quantised copy if it is not in the model cache yet
and compares its greedy text with the full model's on every preset (``measure/variant_check.py``;
two speculation-off engines, one after the other). Prints one table per copy (agreement,
identical, first difference per preset), then a JSON last line with every copy's mean agreement
and identical share. The check is also kept beside each copy (``check.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from engine_adapter.engine.launcher import EngineStartError
from engine_adapter.engine.models import default_cache_dir, resolve_model
from engine_adapter.engine.quantize import SCHEMES
from engine_adapter.engine_config import (
    MODEL_VARIANTS,
    EngineConfig,
    add_model_arguments,
    available_variants,
)
from engine_adapter.measure.variant_check import CopyCheck, check_copy
from engine_adapter.prompts import load_presets


def runnable_schemes(dtype: str) -> list[str]:
    """The schemes some variant this engine dtype can run uses."""
    used = {s for v in available_variants(dtype) for s in MODEL_VARIANTS[v] if s}
    return [s for s in SCHEMES if s in used]


def print_check(check: CopyCheck) -> None:
    print(f"\n{check.model}, {check.scheme} copy, {check.max_tokens} tokens, {check.dtype}")
    print(f"{'preset':<40} {'agreement':>9} {'identical':>9} {'first difference':>16}")
    for p in check.presets:
        diff = "-" if p.first_difference is None else f"token {p.first_difference} of {p.tokens}"
        print(f"{p.label[:40]:<40} {p.agreement:>9.3f} {'yes' if p.identical else 'no':>9} {diff:>16}")
    print(f"{'mean':<40} {check.mean_agreement:>9.3f} {check.identical_share:>9.0%}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine_adapter.quant_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default="", help=f"from {','.join(SCHEMES)} (default: every one this engine runs)")
    p.add_argument("--models", default="target,draft", help="target, draft or both (default both)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--categories", default="", help="preset categories (default: all)")
    add_model_arguments(p, max_model_len=False)
    args = p.parse_args(argv)
    runnable = runnable_schemes(args.dtype)
    schemes = [s for s in args.schemes.split(",") if s] or runnable
    models = [m for m in args.models.split(",") if m]
    refused = [s for s in schemes if s not in runnable] + [m for m in models if m not in ("target", "draft")]
    if refused or not 1 <= args.max_tokens <= 1024:
        print(f"error: cannot check {', '.join(refused) or f'{args.max_tokens} tokens'} here", file=sys.stderr)
        return 2
    presets = load_presets(categories=[c for c in args.categories.split(",") if c] or None)
    base = EngineConfig(method="off", dtype=args.dtype, kv_cache_gib=args.kv_cache_gib, max_model_len=2048)
    checks = []
    for model in models:
        full_dir = resolve_model(getattr(args, model))
        for scheme in schemes:
            try:
                check = asyncio.run(check_copy(full_dir, scheme, presets, args.max_tokens, default_cache_dir(), base))
            except EngineStartError as e:  # said in words (no traceback): the machine, the models or vLLM
                print(f"error: an engine did not start: {e}", file=sys.stderr)
                return 1
            print_check(check)
            checks.append(check)
    summary = [
        {"model": c.model, "scheme": c.scheme, "mean_agreement": round(c.mean_agreement, 4)}
        | {"identical_share": round(c.identical_share, 4), "presets": len(c.presets), "max_tokens": c.max_tokens}
        for c in checks
    ]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
