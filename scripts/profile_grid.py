"""Experiment: what every cell of a profile grid costs on this machine, step by step.

    .venv/bin/python scripts/profile_grid.py [--reserved-cpus N] [--steps 5] [--grid default|full] [--again]
        [--variant full|int8-target|...] [--shape kind|weights]

Why: the profiler (``engine_adapter/policy/profiler.py``) measures a few cells
before the app says ready, and the K policies read the curve fitted to them.
This prints every step of a grid so the cells, their spread and the fit's
error on cells it did not see can be judged (docs/k-policies.md).

How: the packaged pair (``--variant``: as it is or a quantised copy) with live K
policies (k_max 5), the app's defaults otherwise; ``profile_engine`` over ``--grid``
(``default``: the profiler's own cells; ``full``: batch sizes 1, 2, 4, 8, 16 x K 0, 1, 3, 5), every tap step
recorded beside it. Nothing is cached.

The first profile has no cost model in force, as a launch of models with no shipped
prior: until it measured two batch sizes its time left weighs the cells by a prior
shipped for this CPU kind (``--shape kind``, the app's way: ``cost_prior.kind_shape``)
or by ``profiler.cell_weight`` alone (``--shape weights``). With ``--again`` the grid
is profiled a second time, as the presenter's "measure again" does: with the first
profile's model in force, whose ``estimate_profile_s`` the page shows before it starts.
Both runs check the page's time estimates: at each cell, the "time left" the progress
said against the time the profile then took.

Bounded: one engine on 127.0.0.1, the grid's requests only, stopped at the
end. Report: the engine's start time, the profile's time, each cell's median
and steps (ms), the estimates' errors, and (JSON last line) the fitted cost
model with its cells and the estimates.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import FULL_VARIANT, MODEL_VARIANTS, EngineConfig
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.cost_prior import kind_shape
from engine_adapter.policy.profile_grid import ProfileGrid, config_profile_grid
from engine_adapter.policy.profiler import ProfileProgress, estimate_profile_s, profile_engine

FULL_CELLS = ((1, 2, 4, 8, 16), (5, 3, 1, 0))  # batch sizes, Ks
PROMPT = "Write a Python function that parses a CSV file and returns its rows as dictionaries."


async def main(args: argparse.Namespace) -> None:
    t0 = time.monotonic()
    cfg = EngineConfig(method="draft", k=3, k_max=5, reserved_cpus=args.reserved_cpus, variant=args.variant)
    engine = await LiveEngine.launch(cfg)
    up_s = time.monotonic() - t0
    print(f"engine up in {up_s:.1f} s", flush=True)
    grid = config_profile_grid(cfg, engine.process.platform)  # the profiler's own cells on this machine
    if args.grid == "full":
        grid = ProfileGrid(*FULL_CELLS, capture_sizes=grid.capture_sizes)
    steps: list[tuple[int, int, int, float]] = []  # (batch size, K, tokens, s) of every tap step
    q = engine.client.tap.watch()

    async def record() -> None:
        while True:
            s = await q.get()
            steps.append((s.batch_size, s.k, s.num_tokens, s.interval_s))

    recorder = asyncio.create_task(record())
    checks: list[dict] = []
    try:
        shape = kind_shape(cfg, engine.process.platform) if args.shape == "kind" else None
        print(f"first profile weighs its cells by {'a prior of this CPU kind' if shape else 'cell_weight'}")
        cost, profile_s, said = await timed_profile(engine, grid, args.steps, None, t0, shape)
        checks.append(estimate_errors(said, profile_s, None))
        first_run_steps = len(steps)  # the cells below list the first profile's steps only
        if args.again:
            estimate = estimate_profile_s(cost, grid, args.steps)
            _, again_s, said = await timed_profile(engine, grid, args.steps, cost, t0)
            checks.append(estimate_errors(said, again_s, estimate))
    finally:
        recorder.cancel()
        engine.client.tap.unwatch(q)
        await engine.close()
    print(f"profile took {profile_s:.1f} s")
    cells: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    for b, k, n, s in steps[:first_run_steps]:
        if n <= b * (k + 1):
            cells[(b, k)].append(round(s * 1e3))
    for p in cost.points:
        fit = cost.fit_step_s(p.batch_size, p.k)
        print(
            f"b={p.batch_size:2d} K={p.k}  median {p.step_s * 1e3:6.0f} ms  fit {fit * 1e3:6.0f} ms"
            f"  steps {cells[(p.batch_size, p.k)]}"
        )
    for run, check in enumerate(checks, 1):
        print(f"run {run}: {check}")
    out = {
        "variant": args.variant,
        "shape": args.shape,
        "engine_up_s": round(up_s, 1),
        "profile_s": round(profile_s, 1),
        "estimates": checks,
        "cost": cost.to_dict(),
    }
    print(json.dumps(out))


async def timed_profile(
    engine: LiveEngine,
    grid: ProfileGrid,
    steps: int,
    expect: CostModel | None,
    t0: float,
    shape: CostModel | None = None,
) -> tuple[CostModel, float, list[tuple[float, float | None, str]]]:
    """One profile of ``grid``; its seconds, and what its progress said: (seconds in, left_s, message)."""
    said: list[tuple[float, float | None, str]] = []
    t1 = time.monotonic()

    def progress(p: ProfileProgress) -> None:
        said.append((time.monotonic() - t1, p.left_s, p.message))
        left = f"  (about {p.left_s:.0f} s left)" if p.left_s else ""
        print(f"{time.monotonic() - t0:6.1f} s  {p.message}{left}", flush=True)

    cost = await profile_engine(
        engine.client, [PROMPT], 5, True, grid=grid, steps_per_cell=steps, progress=progress, expect=expect, shape=shape
    )
    return cost, time.monotonic() - t1, said


def estimate_errors(said: list[tuple[float, float | None, str]], took_s: float, estimate_s: float | None) -> dict:
    """Each "time left" the progress said against the time the profile then took (signed, relative:
    +0.2 said 20 % too much), and the estimate shown before it started, where there was one."""
    errors = [
        {"at_s": round(at, 1), "said_s": round(left, 1), "took_s": round(took_s - at, 1)}
        | {"error": round(left / (took_s - at) - 1, 3)}
        for at, left, _ in said
        if left and took_s - at > 0
    ]
    out: dict = {"profile_s": round(took_s, 1), "left": errors}
    if errors:
        out["worst_left_error"] = max((e["error"] for e in errors), key=abs)
    if estimate_s is not None:
        out["estimate_s"] = round(estimate_s, 1)
        out["estimate_error"] = round(estimate_s / took_s - 1, 3)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reserved-cpus", type=int, default=None, help="VLLM_CPU_NUM_OF_RESERVED_CPU (default: vLLM's)")
    ap.add_argument("--steps", type=int, default=4, help="samples per cell (the profiler's steps_per_cell)")
    ap.add_argument("--grid", choices=("default", "full"), default="default")
    ap.add_argument("--again", action="store_true", help="profile again with the first model in force")
    ap.add_argument("--variant", choices=MODEL_VARIANTS, default=FULL_VARIANT, help="the pair as it is or quantised")
    ap.add_argument("--shape", choices=("kind", "weights"), default="kind", help="what the first profile's cells weigh")
    asyncio.run(main(ap.parse_args()))
