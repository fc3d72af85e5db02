"""A long-lived engine service for an app: one engine, restartable, with load.

Contract: ``EngineService`` owns a private asyncio loop in a thread (``service.service_loop``), where the
engine (``LiveEngine``), the tap receiver, the background load and the
history of engine steps live. Its public methods are safe to call from any
thread or event loop (the UI's):

- ``start(config)`` / ``restart(config)``: (re)launch, non-blocking; progress
  and errors show in ``status()``; ``request_restart(config)``: a restart a
  person asked for, coalesced (``service.restart_gate``: never a queue of
  restarts, a minimum interval between them);
- ``stream(prompt, ...)``: async iterator of ``Step`` then ``RequestResult``
  for the caller's loop (``service.foreground``: counted, a measurement waits for them);
- ``set_background(n, visitor)``: closed-loop background requests, shared
  fairly between sessions and visitors, for as long as the engine runs
  (``service.background``);
- ``profile_cost()``: measure the cost model again, at most every
  ``remeasure_interval_s`` (``MIN_REMEASURE_INTERVAL_S``) from the last measurement or ready;
- ``reference`` (``backend.ReferenceTwin``): the same on the speculation-off twin
  (``service.twin``: watched, relaunched, stopped when idle); ``recording`` is None;
- ``steps_since(t)``: server-wide ``EngineStep`` history (tap), and
  ``prom_history()``: ``/metrics`` snapshots once a second (works attached too).

Nothing here knows the UI; the explorer reads only records from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from engine_adapter.acceptance_rule import LOSSLESS, AcceptanceRule
from engine_adapter.engine.launcher import StartProgress
from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import FULL_VARIANT, EngineConfig
from engine_adapter.policy.controller import PolicySpec, PolicyState
from engine_adapter.policy.live_state import LivePolicy, PolicyView, config_spec
from engine_adapter.policy.profiler import ProfileProgress
from engine_adapter.prompts import Preset
from engine_adapter.records import EngineStep, PromSnapshot, RequestResult, Step
from engine_adapter.service.backend import (
    LIVE,
    LOCAL_VISITOR,
    BackgroundShare,
    LoadMix,
    Recording,
    ReferenceTwin,
    RestartTicket,
    ServiceStatus,
    StartTimes,
    State,
    TwinStatus,
    Visitor,
)
from engine_adapter.service.background import SharedBackground
from engine_adapter.service.fair_share import MAX_BACKGROUND, MAX_BACKGROUND_PER_VISITOR, SESSION_IDLE_S
from engine_adapter.service.foreground import ForegroundRequests
from engine_adapter.service.history import EngineHistory
from engine_adapter.service.idle_fill import IdleFill
from engine_adapter.service.load import LoadStats
from engine_adapter.service.quant_lens import LensView
from engine_adapter.service.restart_gate import RestartGate
from engine_adapter.service.service_loop import ServiceLoop
from engine_adapter.service.speed_desk import SpeedDesk
from engine_adapter.service.speedup_probe import ProbeEngine, SpeedSettings, SpeedupView, check_probe_args
from engine_adapter.service.twin import SpeculationOffTwin
from engine_adapter.service.watchdog import EngineGuard

GIB = 1 << 30
MIN_REMEASURE_INTERVAL_S = 120.0  # seconds from one measurement's end (or an engine's ready) to the next
JANITOR_S = 5.0  # seconds between rounds of the load's janitor


@dataclass(frozen=True)
class AttachTarget:
    """A vLLM server someone else started: its address, where its tokenizer is, the K it runs."""

    url: str
    tokenizer_dir: str | None = None
    k_hint: int = 0


@dataclass(frozen=True)
class Launch:
    """How the engine was last (re)started: a config we launch, or a server we attach to."""

    config: EngineConfig | None = None
    attach: AttachTarget | None = None


class EngineService:
    """The live ``Backend``: one vLLM engine (launched or attached), restartable, with load."""

    capabilities = LIVE

    def __init__(
        self,
        *,
        background_prompts: Sequence[str | Preset] = (),  # presets: the ledger knows each load request's kind
        max_background: int = MAX_BACKGROUND,
        background_max_tokens: int = 128,
        history_s: float = 600.0,
        policy_options: dict | None = None,
        session_idle_s: float = SESSION_IDLE_S,
        visitor_cap: int = MAX_BACKGROUND_PER_VISITOR,
        remeasure_interval_s: float = MIN_REMEASURE_INTERVAL_S,
        idle_fill_options: dict | None = None,
    ) -> None:
        self._loop = ServiceLoop()
        self._engine: LiveEngine | None = None
        self._status = ServiceStatus(
            state="idle", progress=None, error=None, config=None, url=None, attached=False, generation=0
        )
        self.guard = EngineGuard(self)  # dead or hung engine -> clear status, restart with back-off
        self._launch = Launch()  # the last (re)start, for the guard
        self._start_measuring_since: float | None = None  # when the (re)start under way began measuring
        self._lock = asyncio.Lock()  # created lazily in our loop (see _locked)
        self._bg_prompts = list(background_prompts)
        self.max_background = max_background
        # each browser session's ask; the cap is shared fairly between visitors (service/background.py)
        self.background = SharedBackground(
            self._bg_prompts,
            cap=max_background,
            visitor_cap=visitor_cap,
            idle_s=session_idle_s,
            max_tokens=background_max_tokens,
        )
        self._restarts: RestartGate[EngineConfig] = RestartGate(lambda cfg: self._restart(cfg, None))
        self._measured_at = float("-inf")  # the last measurement's end (or an engine's ready)
        self.remeasure_interval_s = remeasure_interval_s
        self.history = EngineHistory(history_s)
        self._tasks: list[asyncio.Task] = []
        self.foreground = ForegroundRequests(self._loop)  # visitors' requests in flight
        # called with each finished foreground request (the session recorder); must not block
        self.on_result = self.foreground.on_result
        # a speculation-off engine on the same target, started on first use
        self.twin = SpeculationOffTwin()
        self.reference = ReferenceTwin(status=self._twin_status, stream=self._stream_reference)
        self.recording: Recording | None = None  # a live engine: no recorded session
        self._prom_task: asyncio.Task | None = None
        self._janitor_task: asyncio.Task | None = None
        self._twin_task: asyncio.Task | None = None
        self._fill_task: asyncio.Task | None = None
        # live K policies and the measured cost model (engines started with k_max)
        profile_prompts = [p.prompt if isinstance(p, Preset) else p for p in self._bg_prompts]
        # the speedup at this load and its figures per model variant, a presenter's measurements
        self.speed = SpeedDesk([p for p in self._bg_prompts if isinstance(p, Preset)])
        self.live_policy = LivePolicy(self.steps_since, profile_prompts, **(policy_options or {}))
        # a shipped prior's cells that traffic has not reached, measured while nobody uses the engine
        self.idle_fill = IdleFill(self.live_policy, self._in_use, **(idle_fill_options or {}))
        self._submit(self._start_prom())

    # --- plumbing -----------------------------------------------------------
    def _submit(self, coro) -> Future:
        return self._loop.submit(coro)

    async def _call(self, coro) -> Any:
        """Run ``coro`` on the service loop and await it from the caller's loop."""
        return await self._loop.call(coro)

    def status(self) -> ServiceStatus:
        return replace(self._status, restart_due_in_s=self._restarts.due_in_s())

    def _set(self, **kw: Any) -> None:
        self._status = replace(self._status, **kw)

    # --- for the watchdog (the service's own recovery, service/watchdog.py) --
    def report_fault(self, *, state: State | None = None, error: str | None = None, fault: str | None = None) -> None:
        """Show an engine fault in ``status()``: the state, the message, the fault being recovered from."""
        kw: dict[str, Any] = {"error": error} if error is not None else {}
        if state is not None:
            kw["state"] = state
        if fault is not None:
            kw["fault"] = fault
        self._set(**kw)

    async def relaunch(self, expect_generation: int) -> None:
        """Start the last engine again, as it was started, unless a user's (re)start came first."""
        await self._restart(self._launch.config, self._launch.attach, expect_generation=expect_generation)

    # --- lifecycle ----------------------------------------------------------
    def start(self, config: EngineConfig) -> Future:
        return self._submit(self._restart(config, None))

    def attach(self, url: str, tokenizer_dir: str | None = None, k_hint: int = 0) -> Future:
        return self._submit(self._restart(None, AttachTarget(url, tokenizer_dir, k_hint)))

    async def restart(self, config: EngineConfig) -> None:
        await self._call(self._restart(config, None))

    async def request_restart(self, config: EngineConfig) -> RestartTicket:
        """A restart a person asked for: coalesced with any other pending one, run after a short
        settle time and at least ``MIN_RESTART_INTERVAL_S`` after the last (``service.restart_gate``)."""
        config = config.checked()

        async def ask() -> RestartTicket:
            return self._restarts.request(config)

        return await self._call(ask())

    async def _restart(
        self, config: EngineConfig | None, attach: AttachTarget | None, expect_generation: int | None = None
    ) -> None:
        async with self._lock:
            if expect_generation is not None and self._status.generation != expect_generation:
                return  # the guard's restart, overtaken by a user's
            self._launch = Launch(config, attach)
            old = self._status.config
            began, self._start_measuring_since = time.monotonic(), None
            gen = self._status.generation + 1
            self._set(
                state="starting",
                progress=StartProgress("stop", 0.0, "stopping the previous engine"),
                error=None,
                config=config,
                generation=gen,
                attached=attach is not None,
                url=None,
                fault=self._status.fault if expect_generation is not None else None,
                acceptance=LOSSLESS,
                started=None,
            )
            # the speculation-off twin survives a change of method or K
            await self._teardown(twin=config is None or old is None or config.target != old.target)
            try:
                if attach is not None:
                    self._set(progress=StartProgress("attach", 0.5, f"attaching to {attach.url}"))
                    engine = await LiveEngine.attach(
                        attach.url, tokenizer_dir=attach.tokenizer_dir, k_hint=attach.k_hint
                    )
                else:
                    engine = await LiveEngine.launch(config, progress=lambda p: self._set(progress=p))
            except Exception as e:  # shown in the page; the app stays up
                self._set(state="failed", error=str(e))
                return
            self._engine = engine
            self.history.clear()
            if engine.client.tap is not None:
                self._tasks.append(asyncio.create_task(self.history.collect(engine)))
            self._tasks.append(self.guard.watch(engine, gen))
            # with no cached cost model this measures it first: visitors' requests wait for "ready"
            try:
                await self.live_policy.engine_ready(
                    engine, None if attach is not None else config, self._measure_progress
                )
            except Exception as e:  # e.g. the control channel refused: said in the page, never a silent "starting"
                self._set(state="failed", error=f"the engine started, but its K policy could not be set: {e!r}")
                return
            # what the start loaded (tokenizer, cost model, clients) leaves the collector's generations
            # until the engine is closed (``_teardown``):
            # a full collection of the app's heap stalled every event loop of the process 0.5-0.9 s on
            # 2 cores, and the token view with it (docs/benchmarks.md, "UI latency")
            gc.freeze()
            self._measured_at = now = time.monotonic()
            since = self._start_measuring_since
            self._set(
                state="ready",
                url=engine.url,
                progress=StartProgress("ready", 1.0, "engine ready"),
                vllm_version=engine.vllm_version,
                started=StartTimes(now - began, None if since is None else now - since),
            )
            await self._apply_bg()  # the sessions' load survives a restart

    async def _teardown(self, twin: bool = True) -> None:
        """Stop the load, the twin (``twin``) and the engine; the engine goes whatever fails before it."""
        try:
            await self.background.stop()
            if twin:
                await self.twin.close()
            await self.live_policy.engine_gone()
        finally:
            await self._close_engine()

    async def _close_engine(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks.clear()
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await engine.close()
            # the closed engine's objects were frozen at its ready (below): hand them back to the
            # collector so their reference cycles are freed; the next ready freezes again
            gc.unfreeze()

    async def _start_prom(self) -> None:
        self._prom_task = asyncio.create_task(self.history.poll_metrics(lambda: self._engine))
        self._janitor_task = asyncio.create_task(self._janitor())
        self._twin_task = asyncio.create_task(self.twin.watch())
        self._fill_task = asyncio.create_task(self.idle_fill.run())

    async def _shutdown(self) -> None:
        try:
            await self._restarts.close()
            for task in (self._prom_task, self._janitor_task, self._twin_task, self._fill_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self.guard.stop()
        finally:
            await self._teardown()

    def close(self) -> None:
        """Stop everything (engine process included); safe to call twice. A step that fails is said
        on stderr (the app's log) and the engines are stopped all the same."""
        failure = self._loop.stop(self._shutdown(), timeout_s=60)
        if failure is not None:
            print(f"spec-explorer: stopping the engine service: {failure!r}", file=sys.stderr, flush=True)
        self._set(state="stopped")

    # --- history ------------------------------------------------------------
    def steps_since(self, t: float) -> list[EngineStep]:
        return self.history.steps_since(t)

    def prom_history(self) -> list[PromSnapshot]:
        return self.history.prom_history()

    # --- K policies ---------------------------------------------------------
    @property
    def policy_changes(self) -> list[tuple[float, dict]]:
        # copies: the service loop appends while the page's handler threads read
        # (iterating a deque that changes raises "deque mutated during iteration")
        return list(self.live_policy.changes)

    @property
    def load_changes(self) -> list[tuple[float, int]]:
        return self.background.changes

    async def set_policy(self, spec: PolicySpec) -> PolicyState | None:
        """Apply a K policy to the running engine, live (None: queued behind profiling); an idle-time
        cell running stops first, and none begins while the policy is sent."""
        self.idle_fill.note_claim()
        return await self._call(self._apply_policy(spec))

    async def _apply_policy(self, spec: PolicySpec) -> PolicyState | None:
        async with self.idle_fill.claimed():
            return await self.live_policy.apply(spec)

    def _measure_progress(self, p: ProfileProgress) -> None:
        if self._status.state == "starting" and self._start_measuring_since is None:
            self._start_measuring_since = time.monotonic()
        left = f", about {p.left_s:.0f} s left" if p.left_s else ""
        self._set(progress=StartProgress("measure", p.fraction, f"measuring this machine: {p.message}{left}"))

    async def profile_cost(self) -> None:
        """Measure the cost model again: visitors' requests wait (the state is "starting") from
        now until it ends; returns once it has begun (``status()`` shows the progress)."""
        await self._call(self._begin_measure())

    async def _begin_measure(self) -> None:
        self.live_policy.check_can_measure()
        if self._status.state != "ready":
            raise RuntimeError(f"the engine is not ready ({self._status.state})")
        since = time.monotonic() - self._measured_at
        if since < self.remeasure_interval_s:
            raise RuntimeError(
                f"the cost model was measured {since:.0f} s ago; measuring again is possible in "
                f"{self.remeasure_interval_s - since:.0f} s (each measurement keeps every visitor waiting)"
            )
        self._set(state="starting", progress=StartProgress("measure", 0.0, "measuring this machine: starting"))
        self._tasks.append(asyncio.create_task(self._remeasure()))

    async def _remeasure(self) -> None:
        async with self._lock:  # no restart meanwhile
            await self.idle_fill.claim()
            await self.background.stop()  # the load resumes afterwards: the sessions' asks are kept
            await self.foreground.wait_done(300.0, self._waiting_for_foreground)
            try:
                await self.live_policy.measure(self._measure_progress)
            finally:
                self._measured_at = time.monotonic()
                if self._status.state == "starting":
                    self._set(state="ready", progress=StartProgress("ready", 1.0, "engine ready"))
            await self._apply_bg()

    def _waiting_for_foreground(self, n: int) -> None:
        waiting = f"measuring this machine: waiting for {n} request(s) to finish"
        self._set(progress=StartProgress("measure", 0.0, waiting))

    def policy_view(self) -> PolicyView:
        return self.live_policy.view()

    # --- the speedup at this load (a presenter's measurement) ---------------
    def speedup_view(self) -> SpeedupView:
        return self.speed.view()

    def speed_settings(self) -> SpeedSettings | None:
        """The settings line for a speed figure measured now (None: no engine ready)."""
        engine, state, cfg = self._engine, self.live_policy.view().state, self._status.config
        if engine is None or self._status.state != "ready":
            return None
        policy = state.spec if state is not None else config_spec(cfg or EngineConfig())
        return self.speed.settings(engine, cfg, policy, self._load_in_flight())

    async def measure_speedup(self, repeats: int = 2, max_tokens: int = 64) -> SpeedupView:
        """Measure plain decoding against the policy in force on one prompt of each task kind,
        under the load as it is (``service.speed_desk``); returns once it has begun."""
        return await self._call(self._begin_probe(int(repeats), int(max_tokens)))

    async def _begin_probe(self, repeats: int, max_tokens: int) -> SpeedupView:
        check_probe_args(repeats, max_tokens)  # before the claim: bad arguments stop no idle-time cell
        engine = await self._ready_engine()
        probe_engine = ProbeEngine(
            engine.client,
            lambda: self._engine is engine,
            self.live_policy.apply,
            lambda control: self.history.acknowledged(control, idle=lambda: engine.client.in_flight == 0),
        )
        view, load = self.live_policy.view(), self._load_in_flight()
        run = self.speed.start(probe_engine, engine, self._status.config, view, load, repeats, max_tokens)
        self._tasks.append(asyncio.create_task(run))
        return self.speed.view()

    def quant_lens(self) -> LensView:
        """The speedup measurements per model variant and load, side by side (``service.quant_lens``)."""
        cfg = self._status.config
        return self.speed.lens_view(cfg.variant if cfg else FULL_VARIANT, self._load_in_flight())

    def _load_in_flight(self) -> int:
        stats = self.background.stats()
        return stats.in_flight if stats else 0

    # --- the acceptance rule ------------------------------------------------
    async def set_acceptance(self, rule: AcceptanceRule) -> AcceptanceRule:
        """Switch the acceptance rule of the running engine, live and engine-wide."""
        return await self._call(self._set_acceptance(rule))

    async def _set_acceptance(self, rule: AcceptanceRule) -> AcceptanceRule:
        rule.check()
        st, engine = self._status, self._engine
        if engine is None or st.state != "ready":
            raise RuntimeError(f"the engine is not ready ({st.state}); try again once it is")
        if st.config is None or not st.config.acceptance_rules:
            raise RuntimeError(
                "this engine cannot switch acceptance rules: that needs speculation on, the scheduler tap "
                "and a K table (an engine this app started; not an attached server)"
            )
        await engine.client.set_acceptance(rule)
        self._set(acceptance=rule)
        self.live_policy.note({"acceptance": rule.to_dict()})
        return rule

    # --- requests -----------------------------------------------------------
    async def _get_reference(self, may_start: bool) -> LiveEngine:
        cfg = self._status.config
        if cfg is None:
            raise RuntimeError("an attached server has no speculation-off twin to compare with")
        # the main engine's KV cache is mapped at its start and committed as it fills: keep it free
        return await self.twin.get(cfg, may_start=may_start, reserve_bytes=int(cfg.kv_cache_gib * GIB))

    def _twin_status(self, may_start: bool) -> TwinStatus:
        return TwinStatus(self.twin.state, self.twin.note, may_start)

    def stream(
        self, prompt: str, *, max_tokens: int, temperature: float, request_id: str | None = None
    ) -> AsyncIterator[Step | RequestResult]:
        """A visitor's request; items cross from the service loop to the caller's."""
        return self.foreground.stream(
            self._engine_for_request,
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            request_id=request_id,
        )

    def _stream_reference(
        self, prompt: str, *, max_tokens: int, temperature: float, may_start: bool
    ) -> AsyncIterator[Step | RequestResult]:
        """The same on the speculation-off twin (``reference.stream``), for the lossless check; its
        result is not reported to ``on_result``."""

        async def twin() -> LiveEngine:
            await self._engine_for_request()
            return await self._call(self._get_reference(may_start))

        return self.foreground.stream(twin, prompt, max_tokens=max_tokens, temperature=temperature, report=False)

    async def _engine_for_request(self) -> LiveEngine:
        """``_ready_engine`` for the caller's loop: the claim is noted at once (no cell begins), and
        made on the service loop only where a cell runs."""
        self.idle_fill.note_claim()
        if self.live_policy.filling_now():
            return await self._call(self._ready_engine())
        return self._engine_if_ready()

    async def _ready_engine(self) -> LiveEngine:
        """The engine for someone's request (on the service loop): ready, and no idle-time cell in it."""
        await self.idle_fill.claim()
        return self._engine_if_ready()  # after the claim: a restart may have come meanwhile

    def _serving_engine(self) -> LiveEngine | None:
        """The engine while it serves visitors (state "ready"), else None."""
        return self._engine if self._status.state == "ready" else None

    def _engine_if_ready(self) -> LiveEngine:
        engine = self._serving_engine()
        if engine is None:
            raise RuntimeError(f"the engine is not ready ({self._status.state})")
        return engine

    def _in_use(self) -> bool:
        """Whether anyone uses the engine or is about to (``IdleFill`` measures only while nobody does)."""
        load = self.background.stats()
        return (
            self._status.state != "ready"
            or self._lock.locked()
            or self.foreground.in_flight > 0
            or self.background.granted_total() > 0
            or (load is not None and load.in_flight > 0)
            or self.speed.running
            or self.twin.state == "starting"
        )

    # --- background load ----------------------------------------------------
    def _serving_client(self):
        """The engine's client while it serves visitors, else None (the load waits)."""
        engine = self._serving_engine()
        return None if engine is None else engine.client

    async def _apply_bg(self) -> int:
        """Run the sessions' granted total as real requests (marked on the charts)."""
        await self._claim_for_load()
        return await self.background.apply(self._serving_client())

    async def _claim_for_load(self) -> None:
        """Before the load may start requests: no idle-time cell beside them."""
        if self.background.granted_total() > 0 and self._serving_client() is not None:
            await self.idle_fill.claim()

    async def _set_bg(self, n: int, visitor: Visitor) -> int:
        self.background.ask(visitor, n)
        await self._apply_bg()
        return self.background.share(visitor.session).granted

    async def set_background(self, n: int, visitor: Visitor = LOCAL_VISITOR) -> int:
        """This session asks for ``n`` background requests; returns how many it was granted
        (the cap ``max_background`` is shared fairly between visitors and their sessions)."""
        return await self._call(self._set_bg(n, visitor))

    async def _release(self, session: str) -> None:
        if self.background.release(session):
            await self._apply_bg()

    def release_background(self, session: str) -> None:
        """The session left (tab closed, page reloaded): its load stops."""
        self._submit(self._release(session))

    def touch_session(self, session: str) -> None:
        """The session is still there (its page polls); idle sessions lose their load."""
        self.background.touch(session)

    def background_share(self, session: str) -> BackgroundShare:
        return self.background.share(session)

    async def _janitor(self) -> None:
        while True:
            await asyncio.sleep(JANITOR_S)
            with contextlib.suppress(Exception):  # a bad round must not end the load's upkeep
                await self._claim_for_load()  # the round may start requests
                await self.background.janitor_round(self._serving_client())

    def background_stats(self) -> LoadStats | None:
        return self.background.stats()

    def background_tokens_per_second(self, window_s: float = 10.0) -> float:
        return self.background.tokens_per_second(window_s)

    def load_mix(self) -> LoadMix:
        return self.background.mix()

    async def set_load_mix(self, kinds: Sequence[str]) -> LoadMix:
        """The load's next requests come from the prompts of ``kinds`` only (every kind: all);
        raises ValueError for a kind the load has no prompt of."""

        async def choose() -> LoadMix:
            return self.background.choose_kinds(kinds)

        return await self._call(choose())
