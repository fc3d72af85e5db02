"""Experiment: do a draft model's drafts still get accepted after the idle drafter skipped tokens?

    .venv/bin/python scripts/drafter_holes.py [--prompts FILE] [--category code,story] [--gaps 0,2,8,24]
        [--start 15] [--max-tokens 256] [--window 96] [--out steps.json]

Why: with the idle drafter (``engine_adapter/vllm_plugin/idle_drafter.py``) a request that
lives through a K=0 step has holes in the draft model's KV cache, and the
scheduler tap stops drafting for it for good. This measures what that rule
gives up: the same requests are run again, once under a scheduler that lets
them draft after the gap, holes and all.

How: the packaged pair, one request at a time, greedy, ``ignore_eos``, live
K=3. Per prompt, a control run keeps K=3 throughout; each other run sets K=0
at step ``--start`` for ``gap`` steps, then K=3 again. The engine runs
``HolesTapAsyncScheduler`` below: the tap's scheduler minus the rule
that drops a request after a K=0 step. The output is greedy and lossless, so
every run emits the same tokens (checked), and acceptance in the ``--window``
tokens after the gap is compared with the control's acceptance at the same
token positions.

Bounded: one engine on 127.0.0.1, prompts x gaps requests of at most
``--max-tokens`` tokens, stopped at the end. Report (JSON last line): per gap,
accepted / drafted after the gap and in the control run over the same tokens.
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
from engine_adapter.vllm_plugin.schedulers import TapAsyncScheduler  # noqa: E402

K = 3


class HolesTapAsyncScheduler(TapAsyncScheduler):
    """The tap's scheduler, except that a request the idle drafter skipped keeps drafting."""

    def schedule(self, *args, **kwargs):
        self._drafter_lost.clear()  # no trim, and no "nobody can draft" rule
        return super().schedule(*args, **kwargs)


async def run_one(
    engine: LiveEngine, prompt: str, gap: int, start: int, max_tokens: int
) -> tuple[list[list[int]], list[int]]:
    """One request; K=0 from step ``start`` for ``gap`` steps. Rows: [step, token position, K, drafted, accepted]."""
    steps: list[Step] = []
    off_at = on_at = None
    async for item in engine.client.generate(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True):
        if isinstance(item, RequestResult):
            rows, pos = [], 0
            for s in steps:
                rows.append([s.index, pos, s.k, s.num_drafted, s.accepted])
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
    ap.add_argument("--prompts", default=str(ROOT / "prompts" / "presets.jsonl"))
    ap.add_argument("--category", default="code", help="one or more, comma-separated")
    ap.add_argument("--gaps", default="0,2,8,24")
    ap.add_argument("--start", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--window", type=int, default=96)
    ap.add_argument("--out", default=None, help="every run's steps as JSON")
    args = ap.parse_args()
    gaps = sorted({0, *(int(g) for g in args.gaps.split(","))})
    lines = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    categories = set(args.category.split(","))
    prompts = [d["prompt"] for d in lines if d.get("category") in categories]
    cfg = EngineConfig(
        method="draft",
        k=K,
        k_max=K,
        extra_args=["--scheduler-cls", f"scripts.drafter_holes.{HolesTapAsyncScheduler.__name__}"],
    )
    engine = await LiveEngine.launch(cfg)
    totals: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    record, same = [], True
    try:
        for n, prompt in enumerate(prompts):
            runs, ref = {}, None
            for gap in gaps:
                await engine.client.set_k(K)
                runs[gap], ids = await run_one(engine, prompt, gap, args.start, args.max_tokens)
                ref = ids if ref is None else ref
                same &= ids == ref
                record.append({"prompt": n, "gap": gap, "same_text": ids == ref, "steps": runs[gap]})
            for gap, c in compare(runs, args.window).items():
                totals[gap] = [a + b for a, b in zip(totals[gap], c)]
                print(f"prompt {n} gap {gap}: {c[0]}/{c[1]} accepted after the gap, control {c[2]}/{c[3]}", flush=True)
    finally:
        await engine.close()
    if args.out:
        Path(args.out).write_text(json.dumps(record))
    report = {
        "same_text_everywhere": same,
        "by_gap": [
            {
                "gap": g,
                "after_rate": round(t[0] / max(t[1], 1), 3),
                "control_rate": round(t[2] / max(t[3], 1), 3),
                "drafted_after": t[1],
                "drafted_control": t[3],
            }
            for g, t in sorted(totals.items())
        ],
    }
    print(json.dumps(report))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
