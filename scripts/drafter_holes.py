"""Experiment: are a draft model's drafts accepted as usual after the idle drafter skipped tokens?

    .venv/bin/python scripts/drafter_holes.py [--mode catch-up|across] [--prompts FILE]
        [--category code,story] [--gaps 0,2,8,24] [--start 15] [--max-tokens 256] [--window 96]
        [--out steps.json] [--reserved-cpus 0]

Why: with the idle drafter (``engine_adapter/vllm_plugin/idle_drafter.py``) a request that
lives through a K=0 step has a hole in the draft model's KV cache. Two ways on:

- ``catch-up`` (the plugin as shipped, its default budget): when K is above 0 again the draft
  model re-runs the missed tokens in its first pass (``catch_up.py``), and the request drafts
  from the next step;
- ``across`` (the plugin as shipped with a catch-up budget of 0, what a hole longer than the
  budget gets): the request drafts across the hole, never caught up, with zeros in the draft KV
  at the skipped tokens (``idle_drafter.zero_kv_slots``).

How: the packaged pair, one request at a time, greedy, ``ignore_eos``, live K=3. Per prompt, a
reference run at K=0 throughout (the target alone: what speculation off writes), a control run
at K=3 throughout, and runs that set K=0 at step ``--start`` for ``gap`` steps, then K=3 again.
Every run must emit the reference's tokens (checked: the exit status is 1 where one differs),
and acceptance in the ``--window`` tokens after the gap is compared with the control's
acceptance at the same token positions.

Bounded: one engine on 127.0.0.1, prompts x (gaps + 1) requests of at most ``--max-tokens``
tokens, stopped at the end. Report (JSON last line): per gap, accepted / drafted after the gap
and in the control run over the same tokens, their ratio, and the tokens caught up.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_adapter.engine.live_engine import LiveEngine  # noqa: E402
from engine_adapter.engine_config import EngineConfig  # noqa: E402
from engine_adapter.records import RequestResult, Step  # noqa: E402
from engine_adapter.vllm_plugin.wire import DEFAULT_CATCH_UP_TOKENS  # noqa: E402

K = 3


async def run_one(
    engine: LiveEngine, prompt: str, gap: int, start: int, max_tokens: int
) -> tuple[list[list[int]], list[int]]:
    """One request; K=0 from step ``start`` for ``gap`` steps (0: the K set before, throughout).
    Rows: [step, token position, K, drafted, accepted, caught_up]."""
    steps: list[Step] = []
    off_at = on_at = None
    async for item in engine.client.generate(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True):
        if isinstance(item, RequestResult):
            rows, pos = [], 0
            for s in steps:
                rows.append([s.index, pos, s.k, s.num_drafted, s.accepted, s.caught_up])
                pos += len(s.emitted)
            return rows, item.token_ids
        steps.append(item)
        if gap and off_at is None and item.index >= start:
            await engine.client.set_k(0)
            off_at = item.index
        elif off_at is not None and on_at is None and sum(s.index > off_at and s.k == 0 for s in steps) >= gap:
            await engine.client.set_k(K)
            on_at = item.index
    raise RuntimeError("the request ended without a result")


def compare(runs: dict[int, list[list[int]]], window: int) -> dict[int, list[int]]:
    """gap -> [accepted after the gap, drafted after, accepted in the control, drafted in the control]."""
    out: dict[int, list[int]] = {}
    control = runs[0]
    for gap, rows in runs.items():
        zero = [r for r in rows if r[2] == 0 and r[0] > 0]
        if gap == 0 or not zero:
            continue
        lo = max(r[1] for r in zero) + 1  # first token position after the last K=0 step
        after = [r for r in rows if lo <= r[1] < lo + window and r[3]]
        ctl = [r for r in control if lo <= r[1] < lo + window and r[3]]
        out[gap] = [sum(r[4] for r in after), sum(r[3] for r in after), sum(r[4] for r in ctl), sum(r[3] for r in ctl)]
    return out


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("catch-up", "across"), default="catch-up")
    ap.add_argument("--prompts", default=str(ROOT / "prompts" / "presets.jsonl"))
    ap.add_argument("--category", default="code", help="one or more, comma-separated")
    ap.add_argument("--gaps", default="0,2,8,24")
    ap.add_argument("--start", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--window", type=int, default=96)
    ap.add_argument("--out", default=None, help="every run's steps as JSON")
    ap.add_argument("--reserved-cpus", type=int, default=None, help="cores kept free of vLLM's worker (0: all)")
    args = ap.parse_args()
    gaps = sorted({0, *(int(g) for g in args.gaps.split(","))})
    lines = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    categories = set(args.category.split(","))
    prompts = [d["prompt"] for d in lines if d.get("category") in categories]
    across = args.mode == "across"
    cfg = EngineConfig(method="draft", k=K, k_max=K, reserved_cpus=args.reserved_cpus)
    engine = await LiveEngine.launch(cfg)
    totals: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    caught: dict[int, int] = collections.defaultdict(int)
    record, same = [], True
    try:
        await engine.client.set_catch_up_tokens(0 if across else DEFAULT_CATCH_UP_TOKENS)
        for n, prompt in enumerate(prompts):
            await engine.client.set_k(0)  # the reference: the target alone, as speculation off writes
            _, ref = await run_one(engine, prompt, 0, args.start, args.max_tokens)
            runs = {}
            for gap in gaps:
                await engine.client.set_k(K)
                runs[gap], ids = await run_one(engine, prompt, gap, args.start, args.max_tokens)
                same &= ids == ref
                caught[gap] += sum(r[5] for r in runs[gap])
                record.append({"prompt": n, "gap": gap, "same_text": ids == ref, "steps": runs[gap]})
                print(f"prompt {n} gap {gap}: same text as speculation off: {ids == ref}", flush=True)
            for gap, c in compare(runs, args.window).items():
                totals[gap] = [a + b for a, b in zip(totals[gap], c)]
                print(f"prompt {n} gap {gap}: {c[0]}/{c[1]} accepted after the gap, control {c[2]}/{c[3]}", flush=True)
    finally:
        await engine.close()
    if args.out:
        Path(args.out).write_text(json.dumps(record))
    report = {
        "mode": args.mode,
        "same_text_as_speculation_off": same,
        "by_gap": [
            {
                "gap": g,
                "after_rate": round(t[0] / max(t[1], 1), 3),
                "control_rate": round(t[2] / max(t[3], 1), 3),
                "ratio": round((t[0] / max(t[1], 1)) / max(t[2] / max(t[3], 1), 1e-9), 3),
                "drafted_after": t[1],
                "drafted_control": t[3],
                "caught_up_tokens": caught[g],
            }
            for g, t in sorted(totals.items())
        ],
    }
    print(json.dumps(report))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
