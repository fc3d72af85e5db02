"""The engine service's live K-policy state: cost model, live policy, auto re-derivation.

Contract: an ``EngineService`` owns one ``LivePolicy`` and calls, on its own
event loop, ``await engine_ready(engine, config, on_progress)`` after every
(re)start and ``engine_gone()`` before every stop. Callers (through the
service) use ``apply(spec)``, ``measure(on_progress)`` and ``view()``:

- at ``engine_ready`` the cost model comes (``cost_start.CostStarter``) from the on-disk cache for
  this (models, method, machine); else from a shipped prior for this CPU kind and dtype
  (``cost_prior``), scaled to this machine by timing two cells (seconds; the cells are kept, and a
  later launch on the same machine scales the same prior by them without timing); else it is
  measured right away: ``engine_ready`` returns only when it is done, so the service says
  ready (and takes visitors' requests) only after it; ``view()`` shows the progress and the
  cells measured so far meanwhile. Whatever its source, the model then learns from the
  engine's own steps every ``learn_s`` seconds (``cost_learning``; a profile's own steps are not
  learned twice), and ``cost_note`` says where it came from and what it learned. Then the
  start policy is applied: ``default_policy`` ("auto" or "auction"; "configured" = the
  config's fixed K or K table);
- ``measure`` profiles again on demand (the caller keeps visitors out while it
  runs) and puts the policy in force back afterwards; a policy chosen meanwhile
  is applied when it ends, since profiling switches K itself;
- under ``auto`` the table is re-derived every ``rederive_s`` seconds from the
  per-position acceptance of the last ``window_s`` seconds of engine steps (the profiler's left
  out: they draft its prompts, not the visitors' text) where it measured enough, else the
  remembered (``acceptance_memory``: the launch's, kept with the cost model in the cache, then
  every window's, fading back to the launch's);
- ``start_filling()`` measures one cell traffic has not reached (``CostLearner.unreached``) with
  profiling requests of its own (``fill_left``: over a shipped prior every grid cell; under a cost
  policy, from any source, the Ks around the auto table's choices; how a cell runs and stops:
  ``idle_cells``), and the learner takes its steps; the service calls it only while nobody else
  uses the engine and ``await stop_filling()`` before anyone's request goes in: it cancels the
  cell (its requests are aborted, the policy in force is applied again) and returns once the
  engine runs none of them (``view().filling`` says which cell runs meanwhile);
- ``changes`` records every policy applied: (monotonic t, spec dict), and through ``note`` the
  service's other engine-wide switches (the acceptance rule: ``{"acceptance": rule dict}``).

Engines started without live policies (no ``k_max``, or attached) have no
controller: ``view().available`` is False and ``apply`` says why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from engine_adapter.acceptance import PositionCounts
from engine_adapter.engine.platform import Platform
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.acceptance_memory import AcceptanceMemory
from engine_adapter.policy.controller import COST_POLICIES, SLOT_POLICIES, PolicyController, PolicySpec, PolicyState
from engine_adapter.policy.cost_learning import MIN_LEARN_SAMPLES, CostLearner
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.cost_prior import find_prior, kind_shape
from engine_adapter.policy.cost_start import CostStart, CostStarter
from engine_adapter.policy.idle_cells import IdleCells
from engine_adapter.policy.k_policy import AutoTable, derive_auto_table
from engine_adapter.policy.profile_grid import ProfileGrid, config_profile_grid
from engine_adapter.policy.profiler import ProfileProgress, config_cache_path, estimate_profile_s, profile_engine
from engine_adapter.records import IDLE_MEASURE_TAG, EngineStep

MAX_PREVIEW_BATCH = 64  # batch sizes the auto-table chart shows
LEARN_S = 30.0  # seconds between two refits of the cost model from the engine's steps
START_POLICIES = ("configured", "auto", "auction")


@dataclass(frozen=True)
class CostLearning:
    """The cost model's learning: its learner, where the model it started from came from
    ("shipped", "cache", "profiled") and that in the page's words; ``stopped`` after a failure."""

    learner: CostLearner
    source: str
    note: str
    stopped: bool = False


@dataclass(frozen=True)
class PolicyView:
    """A snapshot for the UI."""

    available: bool
    why_not: str | None
    state: PolicyState | None
    cost: CostModel | None  # while profiling: the cells measured so far, fitted
    cost_source: str | None  # "cache" | "profiled" | "shipped" | "learned" | "measuring" | None
    profiling: str | None  # progress text while profiling
    error: str | None
    applied_seq: int | None  # first engine step that ran under the policy (tap acknowledgement)
    k_max: int
    alphas: list[float]
    # what "auto" would choose from the same measurements while another policy is in force
    # (None under auto: ``state.auto`` is the table in force)
    auto_preview: AutoTable | None = None
    # seconds a new profile would keep visitors waiting (from the cost model; None: unknown)
    profile_estimate_s: float | None = None
    # where the cost model came from (a shipped prior: how it was scaled), what it learned since
    cost_note: str | None = None
    # the cell measured in idle time now ("4 requests x K=3"), its requests in the engine's count
    filling: str | None = None


def config_spec(config: EngineConfig) -> PolicySpec:
    """The policy an engine started from ``config`` runs before any is applied: its K table, else its K."""
    return PolicySpec("table", config.k, config.k_table) if config.k_table else PolicySpec("fixed", config.k)


class LivePolicy:
    def __init__(
        self,
        steps_since: Callable[[float], list[EngineStep]],
        prompts: Sequence[str],
        *,
        window_s: float = 60.0,
        rederive_s: float = 5.0,
        learn_s: float = LEARN_S,
        profile_kwargs: dict | None = None,
        default_policy: str = "configured",
    ) -> None:
        if default_policy not in START_POLICIES:
            raise ValueError(f"default_policy must be one of {', '.join(START_POLICIES)}; got {default_policy!r}")
        self.default_policy = default_policy
        self._steps_since = steps_since
        self._prompts = list(prompts) or ["Write a short story about a robot."]
        self.window_s = window_s
        self.rederive_s = rederive_s
        self.learn_s = learn_s
        self.profile_kwargs = profile_kwargs or {}
        self.controller: PolicyController | None = None
        self.changes: collections.deque[tuple[float, dict]] = collections.deque(maxlen=200)
        self._config: EngineConfig | None = None
        self._grid: ProfileGrid | None = None  # the engine's profile cells (``profile_grid``), set at engine_ready
        self._cache_path: Path | None = None  # its cost model's cache file (``config_cache_path``)
        self._starter: CostStarter | None = None  # where its cost model comes from (``cost_start``)
        self._why_not: str | None = "no engine"
        self._cost_source: str | None = None
        self._learning: CostLearning | None = None  # replaced whole: page threads read it
        self._learned_t = 0.0
        self._profiling: str | None = None
        self._idle = IdleCells(steps_since)  # the cells measured in idle time (``start_filling``)
        self._measured: CostModel | None = None  # the cells measured so far, while profiling
        self._error: str | None = None
        self._pending: PolicySpec | None = None
        self._tasks: list[asyncio.Task] = []
        # (inputs, table, table cut for the chart) of the last auto table derived outside auto
        self._derived: tuple[tuple, AutoTable, AutoTable] | None = None
        # per draft position, the acceptance last measured (the launch's, then the windows'): a window
        # with no drafts in it (a long spell at K=0, a launch with a cached cost model) keeps it
        self._memory = AcceptanceMemory()
        self._remembered_seq = -1  # the last engine step the memory took (``remember_window``)

    # --- lifecycle (service loop) ------------------------------------------
    async def engine_ready(
        self, engine, config: EngineConfig | None, on_progress: Callable[[ProfileProgress], None] | None = None
    ) -> None:
        """Set up for a started engine; with no cached cost model, measure it first (awaited)."""
        self._config = config
        self._error = None
        client = engine.client
        if config is None or not client.live_policies or not config.live_policies:
            self.controller = None
            self._why_not = (
                "an attached server takes no live policies"
                if config is None
                else "this engine was started without live K policies (k_max)"
            )
            return
        self._why_not = None
        self._remembered_seq = -1  # a new engine counts its steps from the start
        platform = engine.process.platform  # the machine the engine was launched on
        self._grid, self._cache_path = config_profile_grid(config, platform), config_cache_path(config, platform)
        ctl = PolicyController(client, config.k_max, config.max_num_seqs)
        self.controller = ctl
        # the engine starts in table mode: a fixed K (or the configured table) is in force
        spec = config_spec(config)
        ctl.state = PolicyState(
            spec, config.k_table or [(1, config.max_num_seqs, config.k)], client.controls_sent, time.monotonic()
        )
        self.changes.append((time.monotonic(), spec.to_dict()))
        self._cost_source = None
        self._memory.start_from([])
        self._starter = CostStarter(
            client,
            config.k_max,
            config.method == "draft",
            self._prompts,
            self._grid,
            self._cache_path,
            self._steps_since,
            self._profiling_status,
            self.profile_kwargs,
        )
        await self._start_cost_model(config, platform, on_progress)
        start = spec if self.default_policy == "configured" else PolicySpec(self.default_policy, config.k)
        await self._apply_after_profile(self._pending or start, fallback=spec)
        self._tasks.append(asyncio.create_task(self._auto_loop()))

    async def engine_gone(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self.controller = None
        self._starter = None
        self._derived = None
        self._profiling = None
        self._measured = None
        self._pending = None
        self._learning = None
        self._idle.forget()
        self._why_not = "no engine"

    # --- actions ------------------------------------------------------------
    def alphas(self) -> list[float]:
        """Per draft position: the last ``window_s`` seconds' acceptance where the window measured
        enough, else the remembered (``AcceptanceMemory.alphas``)."""
        return self._memory.alphas(self._window_counts())

    def _window_steps(self) -> list[EngineStep]:
        """The window's steps, the profiler's left out: acceptance is the text's, and the text
        auto drafts for is the visitors' and the load's, not the profiler's prompts (a profile's
        drafts seed the memory instead, ``AcceptanceMemory.start_from``)."""
        return [s for s in self._steps_since(time.monotonic() - self.window_s) if not s.profiling_requests]

    def _window_counts(self) -> PositionCounts:
        counts = PositionCounts(self.controller.k_max if self.controller else 0)
        counts.add(self._window_steps())
        return counts

    def remember_window(self) -> None:
        """Keep what ``alphas`` reads now, for when the window holds no drafts, with the drafts of the
        steps not remembered before; positions the window did not refresh fade toward the launch's
        acceptance (``AcceptanceMemory.remember``)."""
        steps = self._window_steps()
        window, new = PositionCounts(self.controller.k_max), PositionCounts(self.controller.k_max)
        window.add(steps)
        new.add(s for s in steps if s.seq > self._remembered_seq)
        self._remembered_seq = max((s.seq for s in steps), default=self._remembered_seq)
        self._memory.remember(window, new)

    async def apply(self, spec: PolicySpec) -> PolicyState | None:
        """Apply now, or (while profiling) check now and apply when profiling ends."""
        ctl = self.controller
        if ctl is None:
            raise RuntimeError(f"live K policies are not available: {self._why_not}")
        if self._profiling is not None:
            if spec.kind not in COST_POLICIES:
                ctl.check(spec)
            self._pending = spec
            return None
        await self.stop_filling()  # a cell in idle time runs its own K: it gives way
        state = await ctl.apply(spec, self.alphas())
        self.changes.append((state.t, spec.to_dict()))
        return state

    def check_can_measure(self) -> None:
        if self.controller is None:
            raise RuntimeError(f"cannot profile: {self._why_not}")
        if self._profiling is not None:
            raise RuntimeError("the cost model is being measured already")

    async def measure(self, on_progress: Callable[[ProfileProgress], None] | None = None) -> None:
        """Profile again (the caller keeps visitors' requests out); the policy in force is restored."""
        self.check_can_measure()
        await self.stop_filling()
        ctl = self.controller
        restore = ctl.state.spec if ctl.state else config_spec(self._config)
        self._take(await self._starter.profiled(ctl.cost, None, on_progress))
        await self._apply_after_profile(self._pending or restore, fallback=config_spec(self._config))

    async def _start_cost_model(
        self, config: EngineConfig, platform: Platform, on_progress: Callable[[ProfileProgress], None] | None
    ) -> None:
        """The cost model a started engine runs under: the cache's, else a shipped prior scaled to
        this machine, else a profile now (``cost_start``), weighed until it measured two batch sizes
        by the step times shipped for this CPU kind for other models (``cost_prior.kind_shape``)."""
        self._take(self._starter.cached())
        if self.controller.cost is None and (prior := find_prior(config, platform)) is not None:
            self._take(await self._starter.from_prior(prior, on_progress))
        if self.controller.cost is None:
            self._take(await self._starter.profiled(None, kind_shape(config, platform), on_progress))

    def _take(self, start: CostStart) -> None:
        """Put a source's model in force (a model in force before is set aside) with the acceptance
        it measured, and let it learn; a failure is said on the page."""
        if start.error is not None:
            self._error = start.error
        if start.cost is None:
            return
        self.controller.cost, self._cost_source = start.cost, start.source
        self._start_learning(start.cost, start.source, start.note)
        self._memory.start_from(start.acceptance)

    def _profiling_status(self, text: str | None, measured: CostModel | None) -> None:
        """What a measurement says while it runs (``CostStarter.on_status``): the page's progress
        text, the cells measured so far; None when it ends."""
        self._profiling, self._measured = text, measured

    def _start_learning(self, base: CostModel, source: str, note: str) -> None:
        """From now on ``base`` (from ``source``: "shipped", "cache" or "profiled", said on the page as
        ``note``) learns from the engine's steps (``_learn``): traffic's and idle time's cells, and a
        shipped prior's timed cells; never a profile's own steps (``CostLearner.learns_from``).
        Idle time's tries start afresh with it."""
        learner = CostLearner(base, self._config.method == "draft", learns_profiling=source == "shipped")
        self._idle.forget_tries()
        self._learned_t = time.monotonic()
        self._learning = CostLearning(learner, source, note)

    async def _learn(self) -> None:
        """Refit the cost model with the cells the engine's steps measured since the last refit; a
        slot policy in force takes the new model at once (the engine holds a copy of it). Nothing
        without a learning, or after it stopped: a failure is said on the page and ends the
        learning, never the policy loop."""
        learning, ctl = self._learning, self.controller
        if learning is None or learning.stopped:
            return
        since, self._learned_t = self._learned_t, time.monotonic()
        try:
            # the window overlaps the last one: ``learn`` counts each step once
            learned = learning.learner.learn(self._steps_since(since - self.learn_s))
            if learned is None or ctl is None:
                return
            ctl.cost, self._cost_source = learned, "learned"
            if ctl.state is not None and ctl.state.spec.kind in SLOT_POLICIES:
                state = await ctl.apply(ctl.state.spec, self.alphas())
                self.changes.append((state.t, state.spec.to_dict() | {"cost_model": "learned"}))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._error = f"learning the cost model stopped: {e}"
            self._learning = replace(learning, stopped=True)

    def _cost_note(self) -> str | None:
        learning, filling = self._learning, self._idle.label  # read once: the loop may replace them
        if learning is None:
            return None
        note, learner, cells = learning.note, learning.learner, learning.learner.learned_cells
        if not cells:
            note = f"{note}; learning from the engine's steps (none complete a cell yet)"
        else:
            steps = f"{learner.learned_steps:,} engine steps"
            note = f"{note}; learned since from {steps} in {cells} cell{'s' * (cells != 1)}"
        if learning.stopped:
            note += "; learning stopped (below)"
        if filling:
            note += f"; measuring {filling} while the engine is idle (a visitor's request stops it)"
        return note

    # --- measuring in idle time (the service decides when nobody else uses the engine) ---
    def start_filling(self, still_quiet: Callable[[], bool] = lambda: True) -> bool:
        """Start measuring the first cell ``fill_left`` gives (``IdleCells.start``); False when
        there is none, or a measurement runs. The cell begins only if ``still_quiet()`` when its
        task first runs (a claim from another thread may have come in between)."""
        ctl = self.controller
        if ctl is None or ctl.state is None or self._profiling is not None or self._idle.running():
            return False
        todo = self.fill_left()
        if not todo:
            return False
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(self._idle.start(todo[0], self._measure_cell, self._after_cell, still_quiet))
        return True

    def fill_left(self) -> list[tuple[int, int]]:
        """The cells idle time may still measure, none the learner has reached or
        ``idle_cells.FILL_TRIES`` tries measured: over a shipped prior every grid cell (none of them
        measured on this machine but the timed ones); then, over any source while a policy that
        reads the cost model is in force (auto, the auction, equal slots), the cells around the Ks
        the auto table chooses at the grid's batch sizes (``ProfileGrid.cells_around``): one request
        at a time runs one K and so learns one cell, which cannot tell a dearer K from a slower
        machine; its neighbours' cells can. Bounded: each cell is reached or tried a few times, and
        the cells are the grid's batch sizes x K 0..k_max."""
        learning, grid = self._learning, self._grid
        if learning is None or learning.stopped or grid is None:
            return []
        todo = list(grid.cells) if learning.source == "shipped" else []
        todo += [cell for cell in self._cells_around_policy() if cell not in todo]
        return self._idle.untried(learning.learner.unreached(todo))

    def _cells_around_policy(self) -> list[tuple[int, int]]:
        """``ProfileGrid.cells_around`` the auto table in force, or, under a slot policy (the
        auction, equal slots), the one its cost model gives (``_derived_auto``, which the page's
        preview reads too); none under a fixed K or a K table (the cost model chooses nothing then)."""
        ctl, grid = self.controller, self._grid
        if ctl is None or ctl.cost is None or ctl.state is None or grid is None:
            return []
        if ctl.state.spec.kind not in COST_POLICIES:
            return []
        table = ctl.state.auto or self._derived_auto(ctl, self.alphas())[0]
        return grid.cells_around(table.k_by_batch, ctl.k_max)

    def filling_now(self) -> bool:
        """Whether a cell's task exists and has not ended (a plain read, from any thread)."""
        return self._idle.running()

    async def _measure_cell(self, b: int, k: int) -> None:
        """One idle-time cell: the profiler's requests, tagged ``IDLE_MEASURE_TAG`` (the learner takes
        their steps), until the learner can hold ``MIN_LEARN_SAMPLES`` of them."""
        ctl, grid = self.controller, self._grid
        await profile_engine(
            ctl.client,
            self._prompts,
            ctl.k_max,
            self._config.method == "draft",
            grid=ProfileGrid((b,), (k,), grid.capture_sizes),
            expect=ctl.cost,
            request_tag=IDLE_MEASURE_TAG,
            **(self.profile_kwargs | {"steps_per_cell": MIN_LEARN_SAMPLES}),
        )

    async def _after_cell(self, finished: bool) -> None:
        """Once a cell's requests are gone: a finished cell learned first, so the policy applied next
        (auto's table) prices with it; then the policy in force again (profiling switched K itself)."""
        if finished:
            await self._learn()
        ctl = self.controller
        if ctl is None or ctl.state is None:
            return
        try:
            state = await ctl.apply(ctl.state.spec, self.alphas())
            self.changes.append((state.t, state.spec.to_dict()))
        except Exception as e:  # the engine may run the cell's K: said on the page
            self._error = f"after measuring in idle time the policy could not be applied again: {e}"

    async def stop_filling(self) -> None:
        """Stop the cell measured in idle time, if one runs, and return once it has ended (its
        requests gone, the policy in force again: ``IdleCells.stop``)."""
        await self._idle.stop()

    async def _apply_after_profile(self, spec: PolicySpec, fallback: PolicySpec) -> None:
        self._pending = None
        ctl = self.controller
        if spec.kind in COST_POLICIES and ctl.cost is None:
            spec = fallback  # no cost model (profiling failed): the config's own K
        state = await ctl.apply(spec, self.alphas())
        self.changes.append((state.t, spec.to_dict()))

    async def _auto_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rederive_s)
            ctl = self.controller
            if ctl is None or self._profiling is not None or self._idle.label is not None or ctl.state is None:
                continue  # a measurement switches K itself: no table sent meanwhile
            self.remember_window()
            if time.monotonic() - self._learned_t >= self.learn_s:
                await self._learn()  # nothing without a learning in force
            if ctl.state.spec.kind != "auto" or self._idle.label is not None:
                continue
            with contextlib.suppress(Exception):  # a failed send is retried next round
                if await ctl.rederive(self.alphas()):
                    self.changes.append((ctl.state.t, ctl.state.spec.to_dict() | {"rederived": True}))

    # --- reading ------------------------------------------------------------
    def note(self, change: dict) -> None:
        """Record an engine-wide switch beside the policies (the session trace writes each as a line)."""
        self.changes.append((time.monotonic(), dict(change)))

    def view(self) -> PolicyView:
        ctl = self.controller
        state = ctl.state if ctl else None
        applied = None
        if state is not None:
            for s in self._steps_since(state.t - 1.0):
                if s.controls >= state.control:
                    applied = s.seq
                    break
        alphas = self.alphas() if ctl else []
        measuring = self._profiling is not None and self._measured is not None
        cost = self._measured if measuring else (ctl.cost if ctl else None)
        return PolicyView(
            available=ctl is not None,
            why_not=self._why_not,
            state=state,
            cost=cost,
            cost_source="measuring" if measuring else self._cost_source,
            profiling=self._profiling,
            error=self._error,
            applied_seq=applied,
            k_max=ctl.k_max if ctl else 0,
            alphas=alphas,
            auto_preview=self._auto_preview(ctl, alphas) if self._profiling is None else None,
            profile_estimate_s=estimate_profile_s(ctl.cost, self._grid) if ctl and ctl.cost and self._grid else None,
            cost_note=self._cost_note(),
            filling=self._idle.label,
        )

    def _auto_preview(self, ctl: PolicyController | None, alphas: list[float]) -> AutoTable | None:
        """The auto table the same measurements give, derived once per change of its inputs
        (every page's timer asks for the view each second)."""
        if ctl is None or ctl.cost is None or not alphas or (ctl.state is not None and ctl.state.auto is not None):
            return None
        return self._derived_auto(ctl, alphas)[1]

    def _derived_auto(self, ctl: PolicyController, alphas: list[float]) -> tuple[AutoTable, AutoTable]:
        """The auto table ``ctl.cost`` and ``alphas`` give over every batch size the engine takes,
        as ``auto`` would apply it, and the same cut for the chart (the larger batch sizes can hold
        K up at the smaller ones); derived once per change of its inputs."""
        # the key holds the cost model itself (not its id, which a later one may reuse)
        key = (ctl.cost, tuple(alphas), ctl.k_max, ctl.max_batch)
        derived = self._derived
        if derived is None or derived[0] != key:
            auto = derive_auto_table(ctl.cost, alphas, ctl.k_max, ctl.max_batch)
            derived = self._derived = (key, auto, auto.up_to(MAX_PREVIEW_BATCH))
        return derived[1], derived[2]
