"""Profile a live engine's step time into a cost model (``cost_model.CostModel``).

Contract: ``await profile_engine(client, prompts, k_max, drafter_runs_model)``
drives the running engine through a grid of (batch size, K): for each K it
switches the engine live (``client.set_k``), runs ``b`` concurrent requests
and keeps the tap's pure-decode steps of exactly ``b`` requests under that K;
the median seconds per step of each cell become a ``CostPoint`` and the cells
are fitted. The engine's previous policy is NOT restored: the caller applies
the policy it wants afterwards.

Seconds per step are the tap's ``interval_s`` (end of one step to the end of
the next): under continuous load that is the engine's step period, including
vLLM's own scheduling and, for the draft-model method, the drafter's passes.

Results are cached per (models, method, machine) in
``~/.cache/spec-explorer/cost/`` so a restart does not profile again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path

from engine_adapter.engine.models import default_cache_dir
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model, points_from_steps
from engine_adapter.records import EngineStep

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)


def default_ks(k_max: int) -> list[int]:
    return sorted({0, 1, min(3, k_max), k_max})


def cache_path(key: dict) -> Path:
    """One file per (models, method, dtype, machine, vLLM version)."""
    key = key | {"cpus": os.cpu_count(), "machine": platform.machine(), "processor": _cpu_name()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return default_cache_dir() / "cost" / f"{digest}.json"


def config_cache_path(config) -> Path:
    """The cache file for an ``EngineConfig``'s cost model (the app and the sweep share it)."""
    return cache_path(
        {
            "target": config.target,
            "draft": config.draft if config.method == "draft" else None,
            "method": config.method,
            "dtype": config.dtype,
            "k_max": config.k_max,
            "reserved_cpus": config.reserved_cpus,
            "vllm": "0.32.0",
            "idle_drafter": config.drafter_idles,
        }
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_cached(path: Path, drafter_runs_model: bool) -> CostModel | None:
    """The measured cells kept at ``path``, fitted again (the fit may have changed, not the data)."""
    try:
        points = CostModel.from_dict(json.loads(path.read_text())).points
        return fit_cost_model(points, drafter_runs_model=drafter_runs_model) if points else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save_cached(path: Path, model: CostModel) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(model.to_dict(), indent=1))
    tmp.replace(path)


async def profile_engine(
    client,  # engine_adapter.engine.client.EngineClient with live policies
    prompts: Sequence[str],
    k_max: int,
    drafter_runs_model: bool,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    ks: Sequence[int] | None = None,
    steps_per_cell: int = 8,
    progress: Callable[[float, str], None] | None = None,
    cell_timeout_s: float = 120.0,
) -> CostModel:
    if client.tap is None or not client.live_policies:
        raise RuntimeError("profiling needs the scheduler tap and live K policies (EngineConfig.k_max)")
    ks = list(ks if ks is not None else default_ks(k_max))
    cells = [(k, b) for k in ks for b in batch_sizes]
    observed: list[tuple[int, int, int, float]] = []
    q = client.tap.watch()
    try:
        for n, (k, b) in enumerate(cells):
            if progress:
                progress(n / len(cells), f"profiling step time: {b} requests x K={k}")
            await client.set_k(k)
            sent = client.controls_sent
            # long enough for steps_per_cell full-batch steps even if every draft is kept
            max_tokens = (steps_per_cell + 3) * (k + 1)
            while not q.empty():
                q.get_nowait()
            tasks = [asyncio.create_task(_drain(client, prompts[i % len(prompts)], max_tokens)) for i in range(b)]
            try:
                await asyncio.wait_for(asyncio.gather(*tasks), cell_timeout_s)
            except TimeoutError:
                pass  # whatever steps arrived still count
            finally:
                for t in tasks:
                    t.cancel()
            await asyncio.sleep(0.05)  # the tap's last messages
            while not q.empty():
                s: EngineStep = q.get_nowait()
                if s.controls >= sent and s.k == k:
                    observed.append((s.batch_size, s.k, s.num_tokens, s.interval_s))
    finally:
        client.tap.unwatch(q)
    if progress:
        progress(1.0, "fitting the cost model")
    points = points_from_steps(observed, min_samples=3)
    return fit_cost_model(points, drafter_runs_model=drafter_runs_model)


async def _drain(client, prompt: str, max_tokens: int) -> None:
    async with contextlib.aclosing(
        client.generate(prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ) as items:
        async for _ in items:  # closed at once if the profile is cancelled
            pass


def observed_points(steps: Sequence[EngineStep], since: float = 0.0) -> list[CostPoint]:
    """Cells from live traffic (any policy), for the step-time picture's live layer."""
    return points_from_steps(
        [(s.batch_size, s.k, s.num_tokens, s.interval_s) for s in steps if s.t > since], min_samples=3
    )
