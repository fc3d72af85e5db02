"""Where a live engine's cost model comes from: the cache, a shipped prior scaled here, or a profile.

Contract: a ``CostStarter`` holds what measuring one engine needs (its client and K range, the
profiling prompts, its ``ProfileGrid``, its cost cache file, the profiler's options, the engine's
steps) and says what runs through ``on_status(text, measured)`` (the page's progress text and
the cells measured so far, fitted; ``(None, None)`` when it ends). Each source returns a
``CostStart``: the model (None where the source has none), its source and the page's words for
it, the acceptance per draft position the K policies start from, and an ``error`` for the page:

- ``cached()``: the model measured earlier on this machine (``profiler.load_cached``) and the
  acceptance kept with it;
- ``await from_prior(prior, on_progress)``: a shipped prior (``cost_prior``) scaled by the cells an
  earlier launch on this machine timed against it (``load_timing``), else by timing
  ``timing_grid``'s two cells now (kept for the next launch); unscaled, with an error, if the
  timing fails; no model, with an error, if the prior cannot be scaled (the caller profiles); a
  factor held at ``cost_prior.SCALE_RANGE``'s bound is said in the note;
- ``await profiled(expect, shape, on_progress)``: a profile now (``profiler.profile_engine``; its
  time left priced by ``expect``, the model in force, else weighed by ``shape``,
  ``cost_prior.kind_shape``), kept in the cache with the profile's own drafts (where the cache
  cannot be written, in force all the same, with an error); no model, with an error, if it fails.

The caller (``live_state.LivePolicy``) puts the model in force and keeps visitors' requests out
while a source measures: a profiling step must hold profiling requests only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_adapter.acceptance import PositionCounts
from engine_adapter.policy.acceptance_memory import known
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.cost_prior import (
    SCALE_RANGE,
    ShippedPrior,
    covers,
    first_request_k,
    load_timing,
    save_timing,
    scale_prior,
    timing_cache_path,
    timing_grid,
)
from engine_adapter.policy.profile_grid import ProfileGrid
from engine_adapter.policy.profiler import (
    ProfileProgress,
    load_cached,
    load_cached_acceptance,
    profile_engine,
    save_cached,
)
from engine_adapter.records import EngineStep

StatusSink = Callable[[str | None, CostModel | None], None]  # (progress text, cells measured so far)
ProgressSink = Callable[[ProfileProgress], None] | None


@dataclass(frozen=True)
class CostStart:
    """A cost model's start: ``cost`` None where the source had none; ``acceptance`` per draft
    position, what the K policies start from (empty: nothing measured)."""

    cost: CostModel | None
    source: str | None = None  # "cache" | "shipped" | "profiled"
    note: str = ""  # where it came from, in the page's words
    acceptance: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class CostStarter:
    """What measuring one live engine needs (``client``: an ``engine.client.EngineClient`` with live
    policies)."""

    client: Any
    k_max: int
    drafter_runs_model: bool
    prompts: Sequence[str]
    grid: ProfileGrid
    cache_path: Path
    steps_since: Callable[[float], list[EngineStep]]
    on_status: StatusSink
    profile_kwargs: dict = field(default_factory=dict)

    def cached(self) -> CostStart:
        cost = load_cached(self.cache_path, self.drafter_runs_model)
        if cost is None:
            return CostStart(None)
        measured = load_cached_acceptance(self.cache_path)
        note = "measured earlier on this machine (cache)"
        return CostStart(cost, "cache", note, known(measured) if measured else [])

    async def profiled(self, expect: CostModel | None, shape: CostModel | None, on_progress: ProgressSink) -> CostStart:
        """Profile ``grid`` now; the model and the profile's own drafts are cached for later launches."""
        self.on_status("starting", None)
        t_start = time.monotonic()

        def progress(p: ProfileProgress) -> None:
            left = f", about {p.left_s:.0f} s left" if p.left_s else ""
            measured = None
            if len(p.points) >= 2:
                measured = fit_cost_model(p.points, self.drafter_runs_model, self.grid.capture_sizes)
            self.on_status(f"{p.message} ({p.fraction:.0%}{left})", measured)
            if on_progress is not None:
                on_progress(p)

        try:
            cost = await self._profile(self.grid, progress, expect, shape)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # shown in the page; policies without a cost model still work
            return CostStart(None, error=f"profiling failed: {e}")
        finally:
            self.on_status(None, None)
        drafts, error = PositionCounts(self.k_max), None
        try:
            drafts = self._profiler_drafts_since(t_start)  # the profile's own: what a later launch starts from
            save_cached(self.cache_path, cost, drafts)
        except Exception as e:  # in force all the same; the next launch measures again
            error = f"the cost model could not be kept for later launches ({e})"
        return CostStart(cost, "profiled", "measured on this machine by this launch", known(drafts), error)

    async def from_prior(self, prior: ShippedPrior, on_progress: ProgressSink) -> CostStart:
        """``prior`` scaled to this machine by timed cells: an earlier launch's, else timed now."""
        shipped_alphas = known(prior.acceptance) if prior.acceptance is not None else []
        timing_path = timing_cache_path(self.cache_path)
        cached = load_timing(timing_path, prior)
        grid = timing_grid(self.k_max, first_request_k(prior, shipped_alphas, self.k_max))
        error = None
        if cached is not None:
            points, drafts = cached.points, cached.acceptance
            timed_by = f"cells an earlier launch timed on this machine ({cached.date})"
        else:
            points, drafts, error = await self._time_prior(prior, grid, on_progress)
            timed_by = "timed cells on this machine"
        try:
            cost, verify, draft = scale_prior(prior.cost, points)
        except Exception as e:  # a broken prior: measured as if none were shipped
            error = f"the shipped cost model could not be used ({e}): measuring this machine instead"
            return CostStart(None, error=error)
        if cached is None and covers(points, grid):  # a timing cut short is not kept: the next launch times again
            save_timing(timing_path, prior, points, drafts)  # not written (a full disk): the next launch times
        scaled = f"scaled ×{verify:.2f} (verification) and ×{draft:.2f} (drafter)"
        note = f"{prior.label}, {scaled} by {len(points)} {timed_by}"
        if {verify, draft} & set(SCALE_RANGE):
            note += " (the scaling's limit: this machine differs more from the prior's; its own steps correct it)"
        # the prior's acceptance, else the timing's own drafts
        acceptance = shipped_alphas or (known(drafts) if drafts is not None else [])
        return CostStart(cost, "shipped", note, acceptance, error)

    async def _time_prior(
        self, prior: ShippedPrior, grid: ProfileGrid, on_progress: ProgressSink
    ) -> tuple[list[CostPoint], PositionCounts | None, str | None]:
        """Time ``grid``'s cells (``timing_grid``'s: one request at the K the prior chooses for it, then
        K=0): the cells, their drafts and no error; no cells and the error if the timing fails."""
        self.on_status("timing this machine against the shipped cost model", None)
        t_start = time.monotonic()
        try:
            timed = await self._profile(grid, on_progress, prior.cost, None)
            return list(timed.points), self._profiler_drafts_since(t_start), None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the prior unscaled is still better than no model: said on the page
            return [], None, f"timing the shipped cost model failed ({e}): it is used unscaled"
        finally:
            self.on_status(None, None)

    async def _profile(
        self, grid: ProfileGrid, progress: ProgressSink, expect: CostModel | None, shape: CostModel | None
    ) -> CostModel:
        return await profile_engine(
            self.client,
            self.prompts,
            self.k_max,
            self.drafter_runs_model,
            grid=grid,
            progress=progress,
            expect=expect,
            shape=shape,
            **self.profile_kwargs,
        )

    def _profiler_drafts_since(self, t: float) -> PositionCounts:
        """The drafts of the steps since ``t`` that carried the profiler's requests (a profile's, the
        timed cells'): the acceptance a launch starts from where nothing else measured one."""
        counts = PositionCounts(self.k_max)
        counts.add(s for s in self.steps_since(t) if s.profiling_requests)
        return counts
