"""The engine service's live K-policy state: cost model, live policy, auto re-derivation.

Contract: an ``EngineService`` owns one ``LivePolicy`` and calls, on its own
event loop, ``engine_ready(engine, config)`` after every (re)start and
``engine_gone()`` before every stop. Callers (through the service) use
``apply(spec)``, ``profile()`` and ``view()``:

- at ``engine_ready`` the cost model comes from the on-disk cache for this
  (models, method, machine), or is profiled in the background right away
  (``profiling`` shows the progress); a policy chosen meanwhile is applied
  when profiling ends, since profiling switches K itself;
- under ``auto`` the table is re-derived every ``rederive_s`` seconds from the
  per-position acceptance of the last ``window_s`` seconds of engine steps;
- ``changes`` records every policy applied: (monotonic t, spec dict).

Engines started without live policies (no ``k_max``, or attached) have no
controller: ``view().available`` is False and ``apply`` says why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine_adapter.acceptance import PositionCounts
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.controller import PolicyController, PolicySpec, PolicyState
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.k_policy import AutoTable, derive_auto_table
from engine_adapter.policy.profiler import config_cache_path, load_cached, profile_engine, save_cached
from engine_adapter.records import EngineStep

MAX_PREVIEW_BATCH = 64  # batch sizes the auto-table chart shows


@dataclass(frozen=True)
class PolicyView:
    """A snapshot for the UI."""

    available: bool
    why_not: str | None
    state: PolicyState | None
    cost: CostModel | None
    cost_source: str | None  # "cache" | "profiled" | None
    profiling: str | None  # progress text while profiling
    error: str | None
    applied_seq: int | None  # first engine step that ran under the policy (tap acknowledgement)
    k_max: int
    alphas: list[float]
    # what "auto" would choose from the same measurements while another policy is in force
    # (None under auto: ``state.auto`` is the table in force)
    auto_preview: AutoTable | None = None


class LivePolicy:
    def __init__(
        self,
        steps_since: Callable[[float], list[EngineStep]],
        prompts: Sequence[str],
        *,
        window_s: float = 60.0,
        rederive_s: float = 5.0,
        profile_kwargs: dict | None = None,
    ) -> None:
        self._steps_since = steps_since
        self._prompts = list(prompts) or ["Write a short story about a robot."]
        self.window_s = window_s
        self.rederive_s = rederive_s
        self.profile_kwargs = profile_kwargs or {}
        self.controller: PolicyController | None = None
        self.changes: collections.deque[tuple[float, dict]] = collections.deque(maxlen=200)
        self._config: EngineConfig | None = None
        self._why_not: str | None = "no engine"
        self._cost_source: str | None = None
        self._profiling: str | None = None
        self._error: str | None = None
        self._pending: PolicySpec | None = None
        self._tasks: list[asyncio.Task] = []
        self._preview: tuple[tuple, AutoTable] | None = None  # (inputs, table) of the last preview

    # --- lifecycle (service loop) ------------------------------------------
    async def engine_ready(self, engine, config: EngineConfig | None) -> None:
        self._config = config
        self._error = None
        client = engine.client
        if config is None or not client.live_policies or config.k_max is None:
            self.controller = None
            self._why_not = (
                "an attached server takes no live policies"
                if config is None
                else "this engine was started without live K policies (k_max)"
            )
            return
        self._why_not = None
        ctl = PolicyController(client, config.k_max, config.max_num_seqs)
        self.controller = ctl
        # the engine starts in table mode: a fixed K (or the configured table) is in force
        spec = PolicySpec("table", config.k, config.k_table) if config.k_table else PolicySpec("fixed", config.k)
        ctl.state = PolicyState(
            spec, config.k_table or [(1, config.max_num_seqs, config.k)], client.controls_sent, time.monotonic()
        )
        self.changes.append((time.monotonic(), spec.to_dict()))
        ctl.cost = load_cached(config_cache_path(config), config.method == "draft")
        self._cost_source = "cache" if ctl.cost else None
        if ctl.cost is None:
            self._start_profile(spec)
        self._tasks.append(asyncio.create_task(self._auto_loop()))

    async def engine_gone(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self.controller = None
        self._preview = None
        self._profiling = None
        self._pending = None
        self._why_not = "no engine"

    # --- actions ------------------------------------------------------------
    def alphas(self) -> list[float]:
        counts = PositionCounts(self.controller.k_max if self.controller else 0)
        counts.add(self._steps_since(time.monotonic() - self.window_s))
        return counts.alphas()

    async def apply(self, spec: PolicySpec) -> PolicyState | None:
        """Apply now, or (while profiling) check now and apply when profiling ends."""
        ctl = self.controller
        if ctl is None:
            raise RuntimeError(f"live K policies are not available: {self._why_not}")
        if self._profiling is not None:
            if spec.kind not in ("auto", "auction"):
                ctl.check(spec)
            self._pending = spec
            return None
        state = await ctl.apply(spec, self.alphas())
        self.changes.append((state.t, spec.to_dict()))
        return state

    async def profile(self) -> None:
        """Profile again on demand (the current policy is restored afterwards)."""
        if self.controller is None:
            raise RuntimeError(f"cannot profile: {self._why_not}")
        if self._profiling is not None:
            return
        spec = self.controller.state.spec if self.controller.state else PolicySpec("fixed", 3)
        self._start_profile(spec)

    def _start_profile(self, restore: PolicySpec) -> None:
        # said before the task runs: the engine must never look ready-and-idle while
        # profiling is about to switch K under everyone's requests
        self._profiling = "profiling step time: starting"
        self._tasks.append(asyncio.create_task(self._profile(restore=restore)))

    async def _profile(self, restore: PolicySpec) -> None:
        ctl, cfg = self.controller, self._config
        try:
            cost = await profile_engine(
                ctl.client,
                self._prompts,
                ctl.k_max,
                cfg.method == "draft",
                progress=lambda f, msg: setattr(self, "_profiling", f"{msg} ({f:.0%})"),
                **self.profile_kwargs,
            )
            ctl.cost = cost
            self._cost_source = "profiled"
            save_cached(config_cache_path(cfg), cost)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # shown in the page; policies without a cost model still work
            self._error = f"profiling failed: {e}"
        finally:
            self._profiling = None
        spec = self._pending or restore
        self._pending = None
        if spec.kind in ("auto", "auction") and ctl.cost is None:
            spec = restore if restore.kind not in ("auto", "auction") else PolicySpec("fixed", cfg.k)
        state = await ctl.apply(spec, self.alphas())
        self.changes.append((state.t, spec.to_dict()))

    async def _auto_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rederive_s)
            ctl = self.controller
            if ctl is None or self._profiling is not None or ctl.state is None or ctl.state.spec.kind != "auto":
                continue
            with contextlib.suppress(Exception):  # a failed send is retried next round
                if await ctl.rederive(self.alphas()):
                    self.changes.append((ctl.state.t, ctl.state.spec.to_dict() | {"rederived": True}))

    # --- reading ------------------------------------------------------------
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
        return PolicyView(
            available=ctl is not None,
            why_not=self._why_not,
            state=state,
            cost=ctl.cost if ctl else None,
            cost_source=self._cost_source,
            profiling=self._profiling,
            error=self._error,
            applied_seq=applied,
            k_max=ctl.k_max if ctl else 0,
            alphas=alphas,
            auto_preview=self._auto_preview(ctl, alphas),
        )

    def _auto_preview(self, ctl: PolicyController | None, alphas: list[float]) -> AutoTable | None:
        """The auto table the same measurements give, derived once per change of its inputs
        (every page's timer asks for the view each second)."""
        if ctl is None or ctl.cost is None or not alphas or (ctl.state is not None and ctl.state.auto is not None):
            return None
        # the key holds the cost model itself (not its id, which a later one may reuse)
        key = (ctl.cost, tuple(alphas), ctl.k_max, ctl.max_batch)
        if self._preview is None or self._preview[0] != key:
            self._preview = (key, derive_auto_table(ctl.cost, alphas, ctl.k_max, min(ctl.max_batch, MAX_PREVIEW_BATCH)))
        return self._preview[1]
