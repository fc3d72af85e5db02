"""A long-lived engine service for an app: one engine, restartable, with load.

Contract: ``EngineService`` owns a private asyncio loop in a thread, where the
engine (``LiveEngine``), the tap receiver, the background load and the
history of engine steps live. Its public methods are safe to call from any
thread or event loop (the UI's):

- ``start(config)`` / ``restart(config)``: (re)launch, non-blocking; progress
  and errors show in ``status()``; ``request_restart(config)``: a restart a
  person asked for, coalesced (``service.restart_gate``: never a queue of
  restarts, a minimum interval between them);
- ``stream(prompt, ...)``: async iterator of ``Step`` then ``RequestResult``
  for the caller's loop;
- ``set_background(n, visitor)``: closed-loop background requests, shared
  fairly between sessions and visitors, for as long as the engine runs
  (``service.background``);
- ``profile_cost()``: measure the cost model again, at most every
  ``remeasure_interval_s`` (``MIN_REMEASURE_INTERVAL_S``) from the last measurement or ready;
- ``stream(..., reference=True)``: the same on the speculation-off twin
  (``service.twin``: watched, relaunched, stopped when idle);
- ``steps_since(t)``: server-wide ``EngineStep`` history (tap), and
  ``prom_history()``: ``/metrics`` snapshots once a second (works attached too).

Nothing here knows the UI; the explorer reads only records from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from engine_adapter.acceptance_rule import LOSSLESS, AcceptanceRule
from engine_adapter.engine.launcher import StartProgress
from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.controller import PolicySpec, PolicyState
from engine_adapter.policy.live_state import LivePolicy, PolicyView
from engine_adapter.policy.profiler import ProfileProgress
from engine_adapter.records import EngineStep, PromSnapshot, RequestResult, Step
from engine_adapter.service.backend import (
    LIVE,
    LOCAL_VISITOR,
    BackgroundShare,
    ReplayInfo,
    RestartTicket,
    ServiceStatus,
    State,
    TwinStatus,
    Visitor,
)
from engine_adapter.service.background import SharedBackground
from engine_adapter.service.fair_share import MAX_BACKGROUND, MAX_BACKGROUND_PER_VISITOR, SESSION_IDLE_S
from engine_adapter.service.history import EngineHistory
from engine_adapter.service.load import LoadStats
from engine_adapter.service.relay import relay
from engine_adapter.service.restart_gate import RestartGate
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
        background_prompts: Sequence[str] = (),
        max_background: int = MAX_BACKGROUND,
        background_max_tokens: int = 128,
        history_s: float = 600.0,
        policy_options: dict | None = None,
        session_idle_s: float = SESSION_IDLE_S,
        visitor_cap: int = MAX_BACKGROUND_PER_VISITOR,
        remeasure_interval_s: float = MIN_REMEASURE_INTERVAL_S,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="engine-service", daemon=True)
        self._thread.start()
        self._engine: LiveEngine | None = None
        self._status = ServiceStatus(
            state="idle", progress=None, error=None, config=None, url=None, attached=False, generation=0
        )
        self.guard = EngineGuard(self)  # dead or hung engine -> clear status, restart with back-off
        self._launch = Launch()  # the last (re)start, for the guard
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
        # called with each finished foreground request (the session recorder); must not block
        self.on_result: list[Callable[[RequestResult], None]] = []
        # a speculation-off engine on the same target, started on first use
        self.twin = SpeculationOffTwin()
        self._foreground = 0  # visitors' requests in flight (counted on the service loop)
        self._prom_task: asyncio.Task | None = None
        self._janitor_task: asyncio.Task | None = None
        self._twin_task: asyncio.Task | None = None
        # live K policies and the measured cost model (engines started with k_max)
        self.live_policy = LivePolicy(self.steps_since, self._bg_prompts, **(policy_options or {}))
        self._submit(self._start_prom())

    # --- plumbing -----------------------------------------------------------
    def _submit(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _call(self, coro) -> Any:
        """Run ``coro`` on the service loop and await it from the caller's loop."""
        return await asyncio.wrap_future(self._submit(coro))

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
        config.validate()

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
            self._measured_at = time.monotonic()
            self._set(
                state="ready",
                url=engine.url,
                progress=StartProgress("ready", 1.0, "engine ready"),
                vllm_version=engine.vllm_version,
            )
            await self._apply_bg()  # the sessions' load survives a restart

    async def _teardown(self, twin: bool = True) -> None:
        await self.background.stop()
        if twin:
            await self.twin.close()
        await self.live_policy.engine_gone()
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

    async def _shutdown(self) -> None:
        await self._restarts.close()
        for task in (self._prom_task, self._janitor_task, self._twin_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.guard.stop()
        await self._teardown()

    def close(self) -> None:
        """Stop everything (engine process included); safe to call twice."""
        if self._loop.is_closed():
            return
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                self._submit(self._shutdown()).result(timeout=60)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
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
        """Apply a K policy to the running engine, live (None: queued behind profiling)."""
        return await self._call(self.live_policy.apply(spec))

    def _measure_progress(self, p: ProfileProgress) -> None:
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
            await self.background.stop()  # the load resumes afterwards: the sessions' asks are kept
            await self._foreground_done()
            try:
                await self.live_policy.measure(self._measure_progress)
            finally:
                self._measured_at = time.monotonic()
                if self._status.state == "starting":
                    self._set(state="ready", progress=StartProgress("ready", 1.0, "engine ready"))
            await self._apply_bg()

    async def _foreground_done(self, timeout_s: float = 300.0) -> None:
        """Wait for the visitors' requests in flight to end (each is bounded by its max_tokens)."""
        deadline = time.monotonic() + timeout_s
        while self._foreground and time.monotonic() < deadline:
            self._set(
                progress=StartProgress(
                    "measure", 0.0, f"measuring this machine: waiting for {self._foreground} request(s) to finish"
                )
            )
            await asyncio.sleep(0.2)

    def policy_view(self) -> PolicyView:
        return self.live_policy.view()

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

    def twin_status(self, may_start: bool) -> TwinStatus:
        return TwinStatus(self.twin.state, self.twin.note, may_start)

    async def stream(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float,
        reference: bool = False,
        request_id: str | None = None,
        may_start_reference: bool = True,
    ) -> AsyncIterator[Step | RequestResult]:
        """Foreground request; items cross from the service loop to the caller's.

        ``reference=True`` runs it on a speculation-off engine with the same
        target (started on first use if ``may_start_reference``, ~30 s), for the lossless check.
        """
        engine = self._engine
        if engine is None or self._status.state != "ready":
            raise RuntimeError(f"the engine is not ready ({self._status.state})")
        if reference:
            engine = await self._call(self._get_reference(may_start_reference))

        async def counted() -> AsyncIterator[Step | RequestResult]:
            self._foreground += 1  # on the service loop: the measurement waits for these
            try:
                async with contextlib.aclosing(
                    engine.client.generate(
                        prompt, max_tokens=max_tokens, temperature=temperature, request_id=request_id, first=True
                    )
                ) as items:
                    async for item in items:
                        yield item
            finally:
                self._foreground -= 1

        # closing this (Stop, a closed page) closes the stream at once and vLLM aborts the request
        async with contextlib.aclosing(relay(self._loop, counted())) as items:
            async for item in items:
                if isinstance(item, RequestResult) and not reference:
                    for callback in self.on_result:
                        callback(item)
                yield item

    # --- background load ----------------------------------------------------
    def _serving_client(self):
        """The engine's client while it serves visitors, else None (the load waits)."""
        if self._engine is None or self._status.state != "ready":
            return None
        return self._engine.client

    async def _apply_bg(self) -> int:
        """Run the sessions' granted total as real requests (marked on the charts)."""
        return await self.background.apply(self._serving_client())

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
                await self.background.janitor_round(self._serving_client())

    # --- replay (none: this is a live engine) ---------------------------------
    @property
    def replay_info(self) -> ReplayInfo | None:
        return None

    def replay_prompt(self, prompt: str) -> str:
        return prompt

    def recorded_requests(self) -> list[RequestResult]:
        return []

    def background_stats(self) -> LoadStats | None:
        return self.background.stats()

    def background_tokens_per_second(self, window_s: float = 10.0) -> float:
        return self.background.tokens_per_second(window_s)
