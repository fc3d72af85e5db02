"""Step time against K at one batch size, measured by the profiler on one live engine.

    .venv/bin/python scripts/k_curve.py                       # the packaged pair, batch size 1, K 5..0
    .venv/bin/python scripts/k_curve.py --batch-size 4 --repeats 2
    SPEC_EXPLORER_CPU_AS=AVX2 .venv/bin/python scripts/k_curve.py   # as the AVX2 kind (docs/benchmarks.md)

Starts the draft-model engine with live K policies (num_speculative_tokens = ``--k-max``), then
runs ``profiler.profile_engine`` on a grid of one batch size and every K from ``--k-max`` down to
0 (``--repeats`` times in the same engine), on the first code presets. Prints each pass's cells
(batch size, K, tokens per step, median step seconds, steps) and the cost model fitted to them,
then a JSON last line with the machine (``platform.machine_facts``) and every pass. What it is
for: the CPU profile measures K 0, 1 and 3 (and k_max at one request) and prices the Ks between
by the fit's per-pass cost; this measures every K to see where that holds. The engine is closed
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as a script

from engine_adapter.engine.live_engine import LiveEngine  # noqa: E402
from engine_adapter.engine.platform import machine_facts  # noqa: E402
from engine_adapter.engine_config import EngineConfig  # noqa: E402
from engine_adapter.policy.profile_grid import ProfileGrid  # noqa: E402
from engine_adapter.policy.profiler import profile_engine  # noqa: E402
from engine_adapter.prompts import load_presets  # noqa: E402

MAX_NUM_SEQS = 16  # the engine's batch, at most: the largest --batch-size


async def measure(batch_size: int, k_max: int, repeats: int) -> list[dict]:
    """Every pass's cells and fit, on one engine started for it."""
    cfg = EngineConfig(method="draft", k=min(3, k_max), k_max=k_max, max_model_len=4096, max_num_seqs=MAX_NUM_SEQS)
    engine = await LiveEngine.launch(cfg)
    passes = []
    try:
        prompts = [p.prompt for p in load_presets(categories={"code"})][:2]
        grid = ProfileGrid((batch_size,), tuple(range(k_max, -1, -1)))
        for n in range(repeats):
            cost = await profile_engine(engine.client, prompts, k_max, True, grid=grid)
            cells = [[p.batch_size, p.k, p.num_tokens, round(p.step_s, 4), p.samples] for p in cost.points]
            fit = [round(cost.fit_step_s(batch_size, k), 4) for k in range(k_max + 1)]
            print(f"pass {n + 1}: cells (b, K, tokens, step s, steps) {cells}")
            print(f"         fit per K {fit}, rmse {cost.rmse_s:.4f} s")
            passes.append({"cells": cells, "fit_step_s": fit, "rmse_s": round(cost.rmse_s, 4)})
    finally:
        await engine.close()
    return passes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=1, choices=range(1, MAX_NUM_SEQS + 1), metavar="1..16")
    p.add_argument("--k-max", type=int, default=5, choices=range(1, 9), metavar="1..8")
    p.add_argument("--repeats", type=int, default=1, help="passes over the Ks in the same engine")
    args = p.parse_args(argv)
    passes = asyncio.run(measure(args.batch_size, args.k_max, args.repeats))
    facts = machine_facts()  # the CPU's own dtype, as the engine runs by default
    print(json.dumps({**facts, "batch_size": args.batch_size, "k_max": args.k_max, "passes": passes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
