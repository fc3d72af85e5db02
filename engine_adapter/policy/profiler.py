"""Profile a live engine's step time into a cost model (``cost_model.CostModel``).

Contract: ``await profile_engine(client, prompts, k_max, drafter_runs_model, grid=...)``
drives the running engine through a ``ProfileGrid`` of (batch size, K) cells
(``grid.cells``; default ``default_grid(k_max)``, this CPU's): for each batch size
``b`` it starts ``b`` long requests of its own (ids from
``records.profile_request_id``, so the tap counts them in
``EngineStep.profiling_requests``; ``request_tag`` after the prefix, ``records.IDLE_MEASURE_TAG``
for a cell measured in idle time) and, while they run, switches K live
(``client.set_k``) from the highest K down to 0, keeping ``steps_per_cell``
pure-decode steps of exactly ``b`` requests under each K (after the engine
acknowledged the switch and ``SETTLE_STEPS`` more), and up to twice as many
where those spread by more than ``MAX_SPREAD`` around their median. K=0 comes
last for each batch size: after a K=0 step an idle drafter's requests have a
hole in the draft KV, and a K>0 cell after it would time their catch-up. The
cells' median seconds per step become ``CostPoint``s and are fitted, their
tokens padded up to ``grid.capture_sizes`` (CUDA graphs). The engine's previous
policy is NOT restored: the caller applies the policy it wants afterwards.
Its ``progress`` reports say the time left, priced by ``expect`` (the cost model
in force) where given, else by the cells measured so far, weighed until they span two
batch sizes by ``shape`` (a prior of this CPU kind for other models) or ``cell_weight``
(``ProfileMeter``).

The grid comes from the machine (``profile_grid.config_profile_grid(config, platform)``,
whose module says how): on a CPU it is small on purpose (batch sizes 1, 4, 16 x
K 0, 1, 3: nine cells, and one request at k_max; about two minutes for the packaged pair
on 2 CPU cores, docs/benchmarks.md has the figures): the K policies read the fitted curve
scaled by each K's cells (``CostModel.step_s``), and the curve's few parameters (a hinge
in verified tokens, the drafter's passes) are pinned by these cells; K between 3 and
k_max is priced by the fit's per-pass cost. The fit to the nine was within -12..+15 % of
all 20 cells of the old grid (docs/k-policies.md). On a GPU the batch sizes grow to
``max_num_seqs`` (past the knee, hundreds of tokens per step) and sit on CUDA-graph
capture sizes.

The caller keeps everyone else's requests out while it runs (the engine service
profiles before it says ready): a step of a profiling cell must hold profiling
requests only, or its time is charged to the wrong cell and a visitor's request
runs under the K being measured.

Seconds per step are the tap's ``interval_s`` (end of one step to the end of
the next): under continuous load that is the engine's step period, including
vLLM's own scheduling and, for the draft-model method, the drafter's passes.

Results are cached in ``~/.cache/spec-explorer/cost/``, one file per
``config_cache_path(config, platform)``: models, method, dtype, k_max, reserved
cores, idle drafter, device, vLLM build, effective eager mode, max_num_seqs,
effective async scheduling, the chunked-prefill budget, and the host, so a restart
does not profile again, with the acceptance per draft position that the profile's own
drafts measured (``save_cached``/``load_cached_acceptance``): a later launch's K
policies start from that measurement, not from a guess (under a guess of 0.5 the
auto table chose K=0 at every batch size, and so never measured anything to correct
it). The cells a launch timed against a shipped prior lie beside that file
(``cost_prior.timing_cache_path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import platform as host
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from engine_adapter.acceptance import PositionCounts
from engine_adapter.engine.models import default_cache_dir, write_cache_file
from engine_adapter.engine.platform import Platform, cpu_name
from engine_adapter.engine.server_args import async_scheduling, batched_tokens, eager
from engine_adapter.engine_config import EngineConfig, resolve_dtype, variant_key
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model, points_from_steps
from engine_adapter.policy.profile_grid import DEFAULT_BATCH_SIZES as DEFAULT_BATCH_SIZES  # re-exported
from engine_adapter.policy.profile_grid import ProfileGrid, default_grid
from engine_adapter.policy.profile_grid import default_ks as default_ks  # re-exported
from engine_adapter.records import EngineStep, profile_request_id

STEPS_PER_CELL = 4  # the medians' samples: pure steps in a row under one K ...
MAX_SPREAD = 0.1  # ... and as many again while their median absolute deviation exceeds 10 % of the median
SETTLE_STEPS = 1  # steps skipped after a switch (a request's first decode); old-K proposals are filtered
# what a cell costs beyond its samples and settling steps, in its own steps (the packaged pair on 2 CPU
# cores took 7-10 steps a cell for 4 samples: docs/benchmarks.md, "the profile's time left"): the K
# switch reaches the engine a step or two late (one step in flight), and a batch's first cell
# prefills its requests
ACK_STEPS = 3
PREFILL_STEPS_PER_REQUEST = 1 / 8  # ... about 1 + b/8 steps for a batch of b short prompts
PROMPT_WORDS = 8  # profiling prompts are cut to this many words (``short_prompt``)
PROFILE_VERSION = 5  # in the cache key: older profiles are measured again (3: no acceptance; 4: no k_max cell)
ACCEPTANCE_KEY = "acceptance"  # in the cache file: {"accepted": [...], "reached": [...]} per draft position


def cell_weight(batch_size: int, k: int) -> float:
    """Relative time a cell takes where no step times are known (a step's tokens past the first cost
    about 1/8 of it on a CPU without a matrix unit: the packaged pair's batch of 16 at K=3 took 6.4
    times its single request's cell on an EPYC, docs/benchmarks.md, "the profile's time left")."""
    return 1.0 + batch_size * (k + 1) / 8.0


def cell_shares(grid: ProfileGrid, steps_per_cell: int, shape: CostModel | None) -> list[float]:
    """How a profile's time divides among ``grid.cells``, in the order measured: by ``shape``'s step
    times (``cell_estimates_s``: the cost model in force, or a prior shipped for this CPU kind for
    other models, ``cost_prior.kind_shape``), else by ``cell_weight``. The progress fraction is
    weighted by it and, with no cost model in force, the time left until the measured cells span
    two batch sizes (a batch's cost against one request's is the hardware's: 3.4 times at 16 x K=3
    on an AMX Xeon, 7.5 on an EPYC, for the same pair)."""
    if shape is not None:
        return cell_estimates_s(shape, grid, steps_per_cell)
    return [cell_weight(b, k) for b, k in grid.cells]


@dataclass(frozen=True)
class ProfileProgress:
    """What the profile has done so far, for the page (``fraction`` 0..1, ``left_s`` estimated)."""

    fraction: float
    message: str
    left_s: float | None
    points: tuple[CostPoint, ...]  # the cells measured so far


def cache_path(key: dict) -> Path:
    """One file per ``key`` and host (its cores, architecture and CPU)."""
    key = key | {"cpus": os.cpu_count(), "machine": host.machine(), "processor": cpu_name()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return default_cache_dir() / "cost" / f"{digest}.json"


def config_cache_path(config: EngineConfig, platform: Platform) -> Path:
    """The cache file for an ``EngineConfig``'s cost model on ``platform`` (the app and the sweep
    share it): everything that changes a step's time, as the engine really runs it (eager mode
    and async scheduling as the platform resolves them)."""
    return cache_path(
        variant_key(config.variant)
        | {
            "target": config.target,
            "draft": config.draft if config.method == "draft" else None,
            "method": config.method,
            "dtype": resolve_dtype(config.dtype, on_cpu=not platform.is_gpu),
            "k_max": config.k_max,
            "reserved_cpus": config.reserved_cpus,
            "idle_drafter": config.drafter_idles,
            "device": platform.device_name,
            "vllm": platform.vllm_build,
            "eager": eager(config, platform),
            "max_num_seqs": config.max_num_seqs,
            "async_scheduling": async_scheduling(config, platform),
            "max_num_batched_tokens": batched_tokens(config, platform),
            "profile": PROFILE_VERSION,
        }
    )


def load_cached(path: Path, drafter_runs_model: bool) -> CostModel | None:
    """The measured cells kept at ``path``, fitted again (the fit may have changed, not the data)
    with the capture sizes they were measured under."""
    try:
        saved = json.loads(path.read_text())
        saved.pop(ACCEPTANCE_KEY, None)
        kept = CostModel.from_dict(saved)
        if not kept.points:
            return None
        return fit_cost_model(kept.points, drafter_runs_model=drafter_runs_model, capture_sizes=kept.capture_sizes)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def acceptance_to_dict(counts: PositionCounts) -> dict[str, list[int]]:
    """Per-position acceptance as kept in a file (the cost cache, a shipped prior)."""
    return {"accepted": counts.accepted, "reached": counts.reached}


def acceptance_from_dict(saved: dict) -> PositionCounts | None:
    """``acceptance_to_dict``'s inverse (None when the two lists differ in length; a malformed
    dict raises KeyError, TypeError or ValueError)."""
    counts = PositionCounts(len(saved["reached"]))
    counts.accepted, counts.reached = [int(a) for a in saved["accepted"]], [int(r) for r in saved["reached"]]
    return counts if len(counts.accepted) == len(counts.reached) else None


def load_cached_acceptance(path: Path) -> PositionCounts | None:
    """The per-position acceptance the profile at ``path`` measured (its own drafts), or None."""
    try:
        return acceptance_from_dict(json.loads(path.read_text())[ACCEPTANCE_KEY])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def save_cached(path: Path, model: CostModel, acceptance: PositionCounts | None = None) -> None:
    """The cost model, and the acceptance per position measured with it (the app: the profile's own
    drafts; the sweep: its first pass at K = k_max), where a later launch's K policies start before
    they have measured any of their own."""
    saved = model.to_dict()
    if acceptance is not None:
        saved[ACCEPTANCE_KEY] = acceptance_to_dict(acceptance)
    write_cache_file(path, json.dumps(saved, indent=1))


def estimate_profile_s(cost: CostModel, grid: ProfileGrid, steps_per_cell: int = STEPS_PER_CELL) -> float:
    """Seconds a profile of ``grid`` takes by ``cost``'s own step times (``cell_estimates_s``):
    what re-measuring keeps visitors waiting."""
    return sum(cell_estimates_s(cost, grid, steps_per_cell))


def cell_estimates_s(cost: CostModel, grid: ProfileGrid, steps_per_cell: int = STEPS_PER_CELL) -> list[float]:
    """Seconds each of ``grid.cells`` takes by ``cost``'s step times, in the order measured: its
    samples, the settling step and the switch's own (``ACK_STEPS``) and, in each batch size's first
    cell, that batch's prefill (``PREFILL_STEPS_PER_REQUEST``)."""
    out: list[float] = []
    started: set[int] = set()
    for b, k in grid.cells:
        seconds = (steps_per_cell + SETTLE_STEPS + ACK_STEPS) * _cell_s(cost, b, k)
        if b not in started:
            started.add(b)
            seconds += (1 + b * PREFILL_STEPS_PER_REQUEST) * _cell_s(cost, b, max(grid.ks_at(b)))
        out.append(seconds)
    return out


def _cell_s(cost: CostModel, batch_size: int, k: int) -> float:
    """A cell's step time as measured last time where it was, by the fit elsewhere."""
    measured = [p.step_s for p in cost.points if (p.batch_size, p.k) == (batch_size, k)]
    return measured[0] if measured else cost.fit_step_s(batch_size, k)


def cell_max_tokens(ks: Sequence[int], steps_per_cell: int) -> int:
    """Tokens a profiling request may emit: enough for every cell of its batch size even if
    every draft is kept (K+1 per step) and the cell takes its extra samples (``is_stable``), with
    room for the settling steps and for the steps that run before the engine acknowledges a K
    switch (a tiny engine steps every 10 ms: a switch can take 20 steps to arrive)."""
    return 32 + sum((2 * steps_per_cell + SETTLE_STEPS + 24) * (k + 1) for k in ks)


async def profile_engine(
    client,  # engine_adapter.engine.client.EngineClient with live policies
    prompts: Sequence[str],
    k_max: int,
    drafter_runs_model: bool,
    *,
    grid: ProfileGrid | None = None,  # default: ``default_grid(k_max)``, this CPU's
    steps_per_cell: int = STEPS_PER_CELL,
    progress: Callable[[ProfileProgress], None] | None = None,
    cell_timeout_s: float = 240.0,  # a bound for a stuck engine; a first cell includes its batch's prefill
    expect: CostModel | None = None,  # the cost model in force: the progress's time left is priced by it
    shape: CostModel | None = None,  # with none in force, step times that weigh the cells (``cell_shares``)
    request_tag: str = "",  # letters after the ids' prefix (``records.IDLE_MEASURE_TAG``: a cell of idle time)
) -> CostModel:
    if client.tap is None or not client.live_policies:
        raise RuntimeError("profiling needs the scheduler tap and live K policies (EngineConfig.k_max)")
    grid = grid or default_grid(k_max)
    meter = ProfileMeter(grid, steps_per_cell, expect, progress, shape)
    observed: list[tuple[int, int, int, float]] = []
    q = client.tap.watch()
    try:
        for b in sorted(set(grid.batch_sizes)):
            ks = grid.ks_at(b)
            await client.set_k(ks[0])  # before the requests start: they draft from their first decode
            batch = _Batch(client, prompts, cell_max_tokens(ks, steps_per_cell), b, request_tag)
            try:
                for k in ks:
                    meter.cell_starts(b, k, observed)
                    await client.set_k(k)
                    observed += await _measure_cell(q, batch, k, client.controls_sent, steps_per_cell, cell_timeout_s)
                    meter.cell_done(b, k)
            finally:
                await batch.stop()
    finally:
        client.tap.unwatch(q)
    meter.report("fitting the cost model", observed, done=True)
    points = points_from_steps(observed, min_samples=3)
    return fit_cost_model(points, drafter_runs_model=drafter_runs_model, capture_sizes=grid.capture_sizes)


class _Batch:
    """The ``b`` profiling requests of one batch size; ``restart`` replaces them all."""

    def __init__(self, client, prompts: Sequence[str], max_tokens: int, b: int, tag: str = "") -> None:
        self._client, self._prompts, self._max_tokens, self.size = client, prompts, max_tokens, b
        self._tag = tag
        self._tasks: list[asyncio.Task] = []
        self._start()

    def _start(self) -> None:
        self._tasks = [
            asyncio.create_task(
                _drain(
                    self._client,
                    self._prompts[i % len(self._prompts)],
                    self._max_tokens,
                    f"{self._tag}b{self.size}r{i}",
                )
            )
            for i in range(self.size)
        ]

    def broken(self) -> bool:
        """Whether a request of the batch ended: no step can hold exactly ``size`` of them again.
        Raises the request's error if one failed (a dead engine): no waiting it out."""
        for t in self._tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise RuntimeError(f"a profiling request failed: {t.exception()}")
        return any(t.done() for t in self._tasks)

    async def restart(self) -> None:
        await self.stop()
        self._start()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


MAX_RESTARTS = 10  # fresh batches one cell may start before it keeps what it has (tiny engines: docs/gpu.md)


async def _measure_cell(
    q: asyncio.Queue[EngineStep], batch: _Batch, k: int, sent: int, n: int, timeout_s: float
) -> list[tuple[int, int, int, float]]:
    """``n`` (up to ``2 n``) pure-decode steps of exactly ``batch.size`` requests under K=k.
    Where a request of the batch ran out of tokens (a K switch the engine took long to
    acknowledge, under drafts that were all kept), a fresh batch finishes the cell: it starts
    under K=k, so it drafts from its first decode if K > 0."""
    deadline = time.monotonic() + timeout_s
    got = await _collect(q, batch, k, sent, n, deadline)
    for _ in range(MAX_RESTARTS):
        if len(got) >= n or not batch.broken() or time.monotonic() >= deadline:
            break
        await batch.restart()
        got += await _collect(q, batch, k, sent, n - len(got), deadline)
    return got


async def _collect(
    q: asyncio.Queue[EngineStep], batch: _Batch, k: int, sent: int, n: int, deadline: float
) -> list[tuple[int, int, int, float]]:
    """Up to ``n`` pure-decode steps of exactly ``batch.size`` requests under K=k, after the
    switch settled, and as many again while they are not ``is_stable``; stops early once the
    batch is broken (``_Batch.broken``) or at the deadline (whatever arrived still counts)."""
    b = batch.size
    out: list[tuple[int, int, int, float]] = []
    settle = SETTLE_STEPS
    while len(out) < n or (len(out) < 2 * n and not is_stable([s for *_, s in out])):
        left = deadline - time.monotonic()
        if left <= 0 or (q.empty() and batch.broken()):
            break
        try:
            s = await asyncio.wait_for(q.get(), min(left, 1.0))
        except TimeoutError:
            continue
        if s.controls < sent or s.k != k or s.batch_size != b or s.num_tokens > b * (k + 1):
            continue
        if settle > 0:
            settle -= 1
            continue
        out.append((s.batch_size, s.k, s.num_tokens, s.interval_s))
    return out


def is_stable(step_s: Sequence[float], max_spread: float = MAX_SPREAD) -> bool:
    """Whether a cell's samples agree: their median absolute deviation within ``max_spread``
    of their median (one slow step among four passes; two do not)."""
    if not step_s:
        return False
    mid = median(step_s)
    return median(abs(s - mid) for s in step_s) <= max_spread * mid


class ProfileMeter:
    """Progress over the cells, weighted by ``cell_shares`` (of ``expect``, else ``shape``). The time
    left comes from measured step times. With a cost model in force (``expect``): the remaining
    cells' ``cell_estimates_s`` by it, times the ratio of the time the cells done took to what it
    says they take (the profile's own overheads: switch acknowledgements, extra samples, fresh
    batches). Without one: the pace so far over the shares until the cells measured span two batch
    sizes; then the mean of two models fitted to them, priced the same way (``left_s`` says why
    two), and, where ``shape`` weighs the shares, the mean of that and the pace."""

    def __init__(
        self,
        grid: ProfileGrid,
        steps_per_cell: int,
        expect: CostModel | None,
        progress: Callable[[ProfileProgress], None] | None,
        shape: CostModel | None = None,
    ) -> None:
        self._grid, self._steps_per_cell = grid, steps_per_cell
        self._expect, self._progress = expect, progress
        shares = cell_shares(grid, steps_per_cell, expect if expect is not None else shape)
        self._shares = dict(zip(grid.cells, shares, strict=True))
        self._shaped = expect is None and shape is not None  # the shares are another pair's step times
        self._total = sum(self._shares.values())
        self._done = 0.0
        self._n = 0
        self._t0 = time.monotonic()

    def cell_starts(self, b: int, k: int, observed: list) -> None:
        cells = len(self._grid.cells)
        self.report(f"{b} request{'s' if b > 1 else ''} x K={k} (cell {self._n + 1} of {cells})", observed)

    def cell_done(self, b: int, k: int) -> None:
        self._done += self._shares[(b, k)]
        self._n += 1

    def report(self, message: str, observed: list, done: bool = False) -> None:
        if self._progress is None:
            return
        points = tuple(points_from_steps(observed, min_samples=3))
        left = 0.0 if done else self.left_s(points, time.monotonic() - self._t0)
        self._progress(ProfileProgress(1.0 if done else self.fraction, message, left, points))

    @property
    def fraction(self) -> float:
        """The share of the profile's time the cells done stand for (``cell_shares``)."""
        return self._done / self._total if self._total > 0 else 0.0

    def left_s(self, points: Sequence[CostPoint], elapsed_s: float) -> float | None:
        """Seconds the cells not yet done will take (None: nothing to go by yet)."""
        if self._expect is not None:
            return self._priced_left_s(self._expect, elapsed_s)
        frac = self.fraction
        by_pace = elapsed_s * (1 - frac) / frac if 0 < frac < 1 else None
        if len({p.batch_size for p in points}) < 2:
            return by_pace
        # two fits bracket a batch larger than any measured: fitted to a few cells, the drafter's
        # per-request terms stand in for the slope (too cheap); the hinge alone charges the drafter's
        # passes to the tokens (too dear). Their mean was within 7 % of six measured profiles'
        # batch of 16 (docs/benchmarks.md, "the profile's time left"), 12-36 % dear for a quantised
        # target on an AMX Xeon, where the kind's step times said 5-16 % short: with those, the mean
        fits = [fit_cost_model(points, drafter, self._grid.capture_sizes) for drafter in (True, False)]
        by_fits = sum(self._priced_left_s(fit, elapsed_s) for fit in fits) / len(fits)
        return (by_fits + by_pace) / 2 if self._shaped and by_pace is not None else by_fits

    def _priced_left_s(self, model: CostModel, elapsed_s: float) -> float:
        cells = cell_estimates_s(model, self._grid, self._steps_per_cell)
        done_s = sum(cells[: self._n])
        pace = elapsed_s / done_s if self._n and done_s > 0 else 1.0
        return pace * sum(cells[self._n :])


def short_prompt(prompt: str, words: int = PROMPT_WORDS) -> str:
    """The prompt's first words: decode steps cost the same, and each batch's prefill stays short."""
    return " ".join(prompt.split()[:words])


async def _drain(client, prompt: str, max_tokens: int, name: str) -> None:
    async with contextlib.aclosing(
        client.generate(
            short_prompt(prompt),
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            request_id=profile_request_id(name),
        )
    ) as items:
        async for _ in items:  # closed at once if the profile is cancelled
            pass


def observed_points(steps: Sequence[EngineStep], since: float = 0.0) -> list[CostPoint]:
    """Cells from live traffic (any policy), for the step-time picture's live layer."""
    return points_from_steps(
        [(s.batch_size, s.k, s.num_tokens, s.interval_s) for s in steps if s.t > since], min_samples=3
    )
