"""Sweep K policies against concurrency on live engines, in one run.

    python -m engine_adapter.sweep --concurrency 1,2,4,8,16 \\
        --policies off,k1,k3,k5,table,auto,auction --prompts FILE --max-tokens N \\
        --out sweep.csv [--method draft] [--table JSON] [--k-max 5] [--by-category] [--reserved-cpus N]
        [--window-s 20 | --window-s 0] [--repeats N] [--steps-out STEPS.jsonl]
        [--acceptance lossless,relaxed,typical [--top-k N --delta D --epsilon E --alpha A]]
        [--variants full,int8-target,int8-pair]

Policies: ``off`` (an engine started with speculation off), ``kN`` (fixed
K=N), ``table`` (vLLM's ``num_speculative_tokens_per_batch_size``, from
--table), ``auto`` (the table derived from the measured cost model and the
acceptance measured so far in this sweep), ``auction`` (the scheduler tap's
slot auction under the cost model). Every policy but ``off`` runs on ONE
engine started for live policies (num_speculative_tokens = --k-max) and is
switched through the control channel, without a restart; the cost model is
profiled once (or read from the per-machine cache, which keeps the profile as
measured), then learns from every live run's steps with ``CostLearner``, as
the app's learns from its traffic (said on stderr), so ``auto`` and
``auction`` run under the model as learned so far.

Policies are interleaved within each concurrency level (c=1: every policy,
then c=2: ...), so the ones compared at a level ran minutes apart at most,
not a whole sweep apart. For each (policy, concurrency[, category]) a closed
loop keeps C requests in flight, cycling through the prompts, and is measured
over --window-s seconds from its first completion: the level's steady state,
as the explorer's own load makes it (``run_policy_window``). With --window-s 0
it runs one wave of max(C, --min-requests) prompts instead and measures it from
the first send to the last token, ramp-up included (``run_policy``): on 2 CPUs
the wave's first request is prefilled alone, so a policy that drafts at batch
size 1 pays the draft model's prefill for it and then loses it as the wave
lands. The tap gives server-wide step counts (inside the window).
With --repeats N every policy runs N times per level, in rounds that each start
one policy later; the CSV gives the median run's tokens/s (and the min and max)
and pools the step counts of all runs.

With --acceptance (a list of rules, ``engine_adapter/acceptance_rule.py``) every live policy
runs under each rule (``off`` once), lossless first added if missing; the CSV then adds
acceptance (the rule), acceptance_rule (with its parameters), agreement (mean token agreement
with the lossless text of the same prompt at the level, once aligned), answers_compared and
answers_changed (math: the last number; qa: the first sentence; ``measure/lossy_quality.py``)
and relaxed_share (accepted drafts only the lossy rule kept). The lossless texts are the
``off`` engine's when the sweep runs it (the target's own text), else the first lossless
run's. draft_acceptance_rate counts relaxed drafts as accepted, as vLLM does;
acceptance_per_position does too.

With --variants (``engine/variants.py``: ``full``, ``int8-target``, ``int8-pair``, ``int4-target``,
``int4-pair``) the whole sweep runs once per model variant, one after another (the quantised
copies of --target and --draft are made
on first use, in the model cache), and the CSV adds ``variant`` and the columns of
``measure/variant_sweep.py``: bytes per step, plain decoding's roofline fraction (the read
bandwidth on the worker's cores is measured before any engine starts), the speedup over the
same variant's ``off`` and over the full pair's, what multiplying the two speedups would predict,
and each request's agreement with the full target's greedy text; after the table, one line per
level says how far that product overstates the measured combination. Needs ``off``.

FILE is JSONL with a "prompt" per line and optionally a "category";
--by-category measures each category on its own and adds a ``category`` column.

CSV columns: policy, concurrency, total_tokens_per_s, per_request_tokens_per_s,
mean_accepted_per_step, effective_k, draft_acceptance_rate (+ category), then
acceptance_per_position (kept/tested per draft position, space-separated,
pooled over the level's steps) and acceptance_per_position_per_text (the same
with each distinct prompt weighted once, so levels that ran the prompts a
different number of times compare the same texts), runs, total_tokens_per_s_min,
total_tokens_per_s_max, measured_s (the median run's measured seconds: the
window, or the wave's wall time), mean_batch_size, mean_step_s and mean_tap_s
(per step, pooled: requests, the step's wall seconds, the tap's own seconds in
it). A table is printed, then a JSON last line: "settings", the sweep's settings line
(``records.SweepFileSettings``: hardware, dtype, models, method, max tokens, date; copy it
into docs/sweeps/index.json with a shipped file), and "rows". --steps-out writes every measured
step of every run as a JSONL line (the session trace's ``engine_step`` fields,
``t`` from the run's first step, plus policy, concurrency, category and run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from engine_adapter.acceptance_rule import RULE_NAMES, AcceptanceRule, add_parameter_arguments, pop_parameters
from engine_adapter.engine.launcher import EngineStartError
from engine_adapter.engine.models import resolve_model
from engine_adapter.engine.platform import detect_platform, machine_facts
from engine_adapter.engine.roofline import read_bandwidth_gbs, worker_cores
from engine_adapter.engine.variants import VARIANTS, parse_variants
from engine_adapter.engine_config import FULL_VARIANT as FULL
from engine_adapter.engine_config import add_model_arguments, resolve_dtype
from engine_adapter.measure.policy_sweep import SweepSettings, sweep
from engine_adapter.measure.variant_sweep import overlap_sentences, variant_sweep
from engine_adapter.records import SweepFileSettings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m engine_adapter.sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--policies", default="off,k1,k3,k5,auto,auction")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--method", choices=["ngram", "draft", "suffix"], default="draft")
    p.add_argument("--table", default=None, help="K table for the 'table' policy (JSON)")
    p.add_argument("--k-max", type=int, default=5, help="K range for auto and auction (default 5)")
    p.add_argument("--by-category", action="store_true", help="measure each prompt category on its own")
    p.add_argument("--reprofile", action="store_true", help="profile the cost model even if cached")
    p.add_argument(
        "--standing-drafter",
        action="store_true",
        help="vLLM's own behaviour: the draft model runs its pass even at K=0 (default: it idles)",
    )
    p.add_argument("--min-requests", type=int, default=4)
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per policy and level, interleaved; the CSV gives the median run's tokens/s",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=20.0,
        help="seconds of a steady closed loop measured per run, from its first completion "
        "(default 20); 0 = one wave of max(C, --min-requests) requests, ramp-up and all",
    )
    p.add_argument(
        "--steps-out",
        type=Path,
        default=None,
        help="write every measured step of every run here (JSONL), to see where time went",
    )
    p.add_argument("--acceptance", default="lossless", help=f"acceptance rules, from {','.join(RULE_NAMES)}")
    add_parameter_arguments(p)
    add_model_arguments(p, max_model_len=False)
    p.add_argument("--variants", default=FULL, help=f"model variants, from {','.join(VARIANTS)} (default: full only)")
    p.add_argument(
        "--reserved-cpus",
        type=int,
        default=None,
        help="cores vLLM keeps free of its worker (default: vLLM's own, 1, as the app; 0 = every core)",
    )
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.policies = args.policies.split(",")
    if args.repeats < 1:
        print("error: --repeats must be at least 1", file=sys.stderr)
        return 2
    if args.window_s < 0:
        print("error: --window-s must be 0 (one wave) or a number of seconds", file=sys.stderr)
        return 2
    params = pop_parameters(vars(args))
    try:
        variants = parse_variants(args.variants)
        args.acceptance = [AcceptanceRule.from_dict({"name": name, **params}) for name in args.acceptance.split(",")]
        settings = SweepSettings(**{k: v for k, v in vars(args).items() if k != "variants"})
        df = asyncio.run(sweep(settings) if variants == [FULL] else _sweep_variants(settings, variants))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EngineStartError as e:  # said in words (no traceback): the machine, the models or vLLM
        print(f"error: an engine did not start: {e}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(df.to_string(index=False))
    if variants != [FULL]:
        print("\n".join(overlap_sentences(df)))
    rows = df.astype(object).where(df.notna(), None).to_dict(orient="records")
    print(json.dumps({"settings": asdict(file_settings(args)), "rows": rows}))
    return 0


async def _sweep_variants(settings: SweepSettings, variants: list[str]):
    """The sweep once per model variant (``measure/variant_sweep.py``), the full pair's folders resolved."""
    settings.target, settings.draft = str(resolve_model(settings.target)), str(resolve_model(settings.draft))
    cores = worker_cores(settings.reserved_cpus)
    print(f"== measuring read bandwidth on {cores} core(s)", file=sys.stderr)
    bandwidth = read_bandwidth_gbs(cores)
    print(f"   {bandwidth:.2f} GB/s", file=sys.stderr)
    return await variant_sweep(settings, variants, bandwidth, resolve_dtype(settings.dtype))


def file_settings(args: argparse.Namespace) -> SweepFileSettings:
    """This sweep's settings line (``records.SweepFileSettings``): the machine it ran on, the models by name."""
    platform = detect_platform()
    if platform.is_gpu:
        hardware = platform.device_name
    else:
        facts = machine_facts()
        hardware = f"{facts['cpu']}, {facts['cores']} cores ({facts['cpu_kind']})"
    draft = Path(args.draft).name if args.method == "draft" else args.method
    return SweepFileSettings(
        hardware=hardware,
        dtype=resolve_dtype(args.dtype, on_cpu=not platform.is_gpu),
        models=f"{Path(args.target).name} / {draft}" + ("" if args.variants == FULL else f", variants {args.variants}"),
        method=args.method,
        max_tokens=args.max_tokens,
        date=time.strftime("%Y-%m-%d"),
    )


if __name__ == "__main__":
    sys.exit(main())
