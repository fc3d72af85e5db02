"""Who gets the discount, on the engine the app would start: the ledger under each allocation at
each background load, as the page's ledger computes it.

    .venv/bin/python scripts/ledger_snapshot.py [--policies auction,equal] [--loads 0,4,16]
        [--settle-s 30] [--max-tokens 128] [--target SPEC --draft SPEC] [--kv-cache-gib N]

Starts an ``EngineService`` on the packaged pair with live K policies (as ``app.py`` does; the
cost model measured first if none is cached), then for each load (the background load of
``app.py``'s presets, task kinds taking turns) and each policy: puts the policy in force, runs
one request of its own (the "your request" of the page) beside the load, waits ``--settle-s``
and reads the ledger over its last 10 s (``engine_adapter.ledger.ledger_rows`` with the cost
model's plain step time, as ``explorer/panels/ledger.py`` does). Reports per (load, policy):
the requests running, how many at or above 1.0x and below, the speedups' min, median and max,
Jain's index, and the speedup per task kind; a table, then JSON as the last line.
Bounded: every wait has a timeout; the load goes to 0 and the engine is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time

from engine_adapter.engine_config import EngineConfig
from engine_adapter.ledger import jain_index, ledger_rows
from engine_adapter.policy.controller import PolicySpec
from engine_adapter.prompts import load_presets
from engine_adapter.records import RequestResult
from engine_adapter.service.backend import LOCAL_VISITOR
from engine_adapter.service.engine_service import EngineService

LEDGER_WINDOW_S = 10.0
OWN_PROMPT = "def fibonacci(n):"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="auction,equal")
    p.add_argument("--loads", default="0,4,16")
    p.add_argument("--settle-s", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=512)  # ours still runs when the ledger is read
    p.add_argument("--target", default=EngineConfig.target)
    p.add_argument("--draft", default=EngineConfig.draft)
    p.add_argument("--kv-cache-gib", type=float, default=EngineConfig.kv_cache_gib)
    p.add_argument("--start-timeout-s", type=float, default=900.0)
    return p.parse_args()


def wait_ready(service: EngineService, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while service.status().state != "ready" or service.policy_view().profiling:
        if service.status().state == "failed" or time.monotonic() > deadline:
            raise SystemExit(f"the engine did not get ready: {service.status()}")
        time.sleep(1.0)


async def own_request(service: EngineService, request_id: str, max_tokens: int) -> RequestResult | None:
    async for item in service.stream(OWN_PROMPT, max_tokens=max_tokens, temperature=0.0, request_id=request_id):
        if isinstance(item, RequestResult):
            return item
    return None


def snapshot(service: EngineService, own: str) -> dict:
    cost = service.policy_view().cost
    plain = (lambda b: cost.step_s(b, 0)) if cost is not None else None
    steps = service.steps_since(time.monotonic() - LEDGER_WINDOW_S)
    newest = steps[-1].t if steps else 0.0
    rows = [r for r in ledger_rows(steps, plain, own=own) if newest - r.last_t <= 2.0]
    speedups = [r.speedup for r in rows if r.speedup is not None]
    by_kind: dict[str, list[float]] = {}
    for r in rows:
        if r.speedup is not None:
            by_kind.setdefault(r.kind or r.owner, []).append(r.speedup)
    return {
        "running": len(rows),
        "at_or_above_1x": sum(1 for s in speedups if s >= 1.0),
        "below_1x": sum(1 for s in speedups if s < 1.0),
        "speedup_min": round(min(speedups), 3) if speedups else None,
        "speedup_median": round(statistics.median(speedups), 3) if speedups else None,
        "speedup_max": round(max(speedups), 3) if speedups else None,
        "jain_index": round(jain_index(speedups) or 0.0, 3) if speedups else None,
        "by_kind": {k: round(statistics.median(v), 3) for k, v in sorted(by_kind.items())},
        "predictability": {
            (r.kind or r.owner): round(r.predictability, 3) for r in rows if r.predictability is not None
        },
    }


async def measure(service: EngineService, own: str, args: argparse.Namespace) -> dict:
    """The ledger after ``settle_s`` seconds with one request of our own running beside the load."""
    task = asyncio.create_task(own_request(service, own, args.max_tokens))
    await asyncio.sleep(args.settle_s)
    row = snapshot(service, own)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return row


def main() -> None:
    args = parse_args()
    config = EngineConfig(target=args.target, draft=args.draft, kv_cache_gib=args.kv_cache_gib, k=3, k_max=5).checked()
    service = EngineService(background_prompts=load_presets(), policy_options={"default_policy": "auto"})
    visitor = LOCAL_VISITOR
    out: list[dict] = []
    settings = None
    try:
        service.start(config)
        wait_ready(service, args.start_timeout_s)
        settings = service.speed_settings()
        for load in (int(x) for x in args.loads.split(",")):
            asyncio.run(service.set_background(load, visitor))
            for name in args.policies.split(","):
                asyncio.run(service.set_policy(PolicySpec(name)))
                own = f"ledgersnapshot{name}{load}"
                row = {"load": load, "policy": name, **asyncio.run(measure(service, own, args))}
                out.append(row)
                print(
                    f"load {load:>2} {name:<8} running {row['running']:>2}: {row['at_or_above_1x']} >= 1.0x, "
                    f"{row['below_1x']} below; speedup {row['speedup_min']}-{row['speedup_max']} "
                    f"(median {row['speedup_median']}), Jain {row['jain_index']}; by kind {row['by_kind']}",
                    flush=True,
                )
    finally:
        asyncio.run(service.set_background(0, visitor))
        service.close()
    print(json.dumps({"settings": settings.line() if settings else None, "rows": out}))


if __name__ == "__main__":
    main()
