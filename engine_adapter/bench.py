"""Benchmark: speculation against concurrency on a live engine, in one run.

    python -m engine_adapter.bench [--methods off,ngram,draft] [--concurrency 1,4,16]
                                   [--k 3] [--max-tokens 64] [--categories code,story,...]
                                   [--reserved-cpus default,0] [--modes eager,compiled]
    python -m engine_adapter.bench --tap-overhead [--rounds 3]

Default mode: for each method, start the engine (packaged pair unless
--target/--draft), and for each concurrency C run a closed loop with C
requests in flight over max(C, 4) preset prompts (ordered round-robin by
category). Reports total tokens/s, mean acceptance length and draft
acceptance rate (pooled over requests, vLLM's definitions) and the ratio to
``off`` at the same C and engine settings. Before any engine starts it measures
the machine's read bandwidth (``engine/roofline.py``) on the worker's cores and
gives each plain-decode row as a fraction of its roofline (bandwidth / the
target's bytes read per step, times C). ``--reserved-cpus`` and ``--modes``
compare vLLM's core binding and eager against compiled mode in one run (engine
start-up seconds included). Prints a table, then a JSON last line.

``--tap-overhead``: starts the draft-model engine twice, with and without the
scheduler tap, and alternates identical runs between them (A B A B ...) at
concurrency 1 and 16, so machine noise hits both alike; reports median
tokens/s of each and the tap's own time per step against the step's wall
time (measured inside the engine by the tap itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from engine_adapter.engine.launcher import EngineStartError
from engine_adapter.engine_config import add_model_arguments
from engine_adapter.measure.throughput import BenchSettings, bench, tap_overhead


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'method':8} {'cores':>5} {'mode':8} {'start s':>7} {'C':>3} {'tok/s':>8} {'x off':>6} "
        f"{'req tok/s':>9} {'mean AL':>8} {'accept':>7} {'roofline':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        mal = f"{r['mean_acceptance_length']:.3f}" if r["mean_acceptance_length"] else "-"
        dar = f"{r['draft_acceptance_rate']:.3f}" if r["draft_acceptance_rate"] is not None else "-"
        ratio = f"{r['ratio_to_off']:.2f}" if r["ratio_to_off"] else "-"
        roof = f"{r['roofline_fraction']:.2f}" if r.get("roofline_fraction") else "-"
        mode = "eager" if r["eager"] else "compiled"
        print(
            f"{r['method']:8} {r['worker_cores']:>5} {mode:8} {r['start_s']:>7} {r['concurrency']:>3} "
            f"{r['tokens_per_s']:>8.2f} {ratio:>6} {r['per_request_tokens_per_s']:>9.2f} {mal:>8} {dar:>7} {roof:>8}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m engine_adapter.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--methods", default="off,ngram,draft")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument("--categories", default="code,math,story,translation")
    add_model_arguments(p, dtype=False, max_model_len=False)
    p.add_argument(
        "--reserved-cpus",
        default="default",
        help="cores vLLM keeps free of its worker, a list compared side by side, e.g. 'default,0' "
        "(default = vLLM's, 1; 0 = the worker on every core)",
    )
    p.add_argument("--modes", default="eager", help="eager, compiled, or 'eager,compiled' side by side")
    p.add_argument("--tap-overhead", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    args.methods = args.methods.split(",")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.categories = args.categories.split(",") if args.categories else None
    args.reserved_cpus = [None if v == "default" else int(v) for v in args.reserved_cpus.split(",")]
    args.eager = [m == "eager" for m in args.modes.split(",")]
    del args.modes
    try:
        return _run(args)
    except EngineStartError as e:  # said in words (no traceback): the machine, the models or vLLM
        print(f"error: an engine did not start: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.tap_overhead:
        out = asyncio.run(tap_overhead(BenchSettings(**vars(args))))
        for c, r in out["runs"].items():
            print(
                f"c={c}: tap on {r['tokens_per_s_tap_on']:.2f} tok/s, off {r['tokens_per_s_tap_off']:.2f} "
                f"(ratio {r['ratio_on_to_off']:.3f}); tap time / step time: median "
                f"{r['tap_time_over_step_time_median']}, p99 {r['tap_time_over_step_time_p99']}"
            )
        print(json.dumps(out))
        return 0
    out = asyncio.run(bench(BenchSettings(**vars(args))))
    bw = ", ".join(f"{n} core(s) {g} GB/s" for n, g in out["machine"]["bandwidth_gbs"].items())
    m = out["machine"]
    print(
        f"read bandwidth: {bw}; target weights {m['target_weight_bytes'] / 1e9:.2f} GB, "
        f"{m['target_bytes_per_step'] / 1e9:.2f} GB read per step"
    )
    print_table(out["rows"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
