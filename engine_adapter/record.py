"""Recorder CLI: run prompts on a live engine and write a provenance trace.

    python -m engine_adapter.record --method {off,ngram,draft} --k K \\
        --prompts FILE --max-tokens N --concurrency C --temperature T \\
        --out TRACE.jsonl [--target SPEC] [--draft SPEC] [--attach URL] \\
        [--acceptance {lossless,relaxed,typical} --top-k N --delta D --epsilon E --alpha A]

FILE is JSONL, one {"prompt": "..."} per line (other keys are ignored).
TRACE.jsonl (format documented in docs/trace-format.md):
    {"type": "run", "format", ...config, "acceptance": {rule and parameters}, "vllm_version"}
    {"type": "request", "prompt", "text", "token_ids", "kinds", "steps",
     "spec_decode_metrics", "tokens_per_second", ...}       one per prompt
    {"type": "summary", "wall_s", "total_tokens", "tokens_per_second"}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from engine_adapter.acceptance_rule import RULE_NAMES, AcceptanceRule, add_parameter_arguments, pop_parameters
from engine_adapter.engine.launcher import EngineStartError
from engine_adapter.engine_config import add_model_arguments
from engine_adapter.measure.recording import RecordSettings, record


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engine_adapter.record",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--method", choices=["off", "ngram", "draft", "suffix"], default="draft")
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens (default 3)")
    p.add_argument(
        "--k-table", default=None, help="num_speculative_tokens_per_batch_size as JSON, e.g. '[[1,4,3],[5,64,0]]'"
    )
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--out", type=Path, required=True)
    add_model_arguments(p)
    p.add_argument("--attach", default=None, help="record from a running vLLM server at this URL")
    p.add_argument(
        "--acceptance",
        choices=list(RULE_NAMES),
        default="lossless",
        help="the acceptance rule (default lossless: vLLM's rejection sampler; the others are lossy, "
        "engine_adapter/acceptance_rule.py)",
    )
    add_parameter_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    try:
        params = pop_parameters(args)
        rule = AcceptanceRule.from_dict({"name": args.pop("acceptance"), **params})
        summary = asyncio.run(record(RecordSettings(**args, acceptance=rule)))
    except (ValueError, EngineStartError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
