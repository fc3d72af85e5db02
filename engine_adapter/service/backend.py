"""The one surface the explorer talks to: the ``Backend`` protocol and its records.

Contract: a backend is a live engine service (``EngineService``) or a recorded
session played back (``ReplayService``). Both implement every member below; what
one of them cannot do is said by ``capabilities`` (a field, never probed with
``getattr``) and, where a call makes no sense, by a ``RuntimeError`` whose message
a person can act on. What only one kind has is a part of its own, ``None`` on the
other: ``reference`` (a live engine's speculation-off twin, ``ReferenceTwin``) and
``recording`` (a replay's recorded session, ``Recording``). The explorer imports this
module, ``records`` and pure helpers only; it never sees an engine, a client or vLLM.
``PolicySpec`` (what a person asks the engine to run) is re-exported from the policy layer
for the same reason, and so is ``SESSION_IDLE_S`` (how long a session goes unheard before it is
gone: its background load stops, and the page forgets its state).

Units: times are ``time.monotonic()`` seconds on the app's host; rates in tokens
per second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from engine_adapter.acceptance_rule import LOSSLESS, AcceptanceRule
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.controller import POLICY_KINDS, SLOT_POLICIES, PolicyKind, PolicySpec
from engine_adapter.records import EngineStep, RequestResult, Step
from engine_adapter.service.fair_share import SESSION_IDLE_S
from engine_adapter.service.quant_lens import LensComparison, LensPoint, LensView
from engine_adapter.service.restart_gate import RestartTicket
from engine_adapter.service.speedup_probe import (
    MAX_PROBE_TOKENS,
    MAX_REPEATS,
    SpeedSettings,
    SpeedupRow,
    SpeedupView,
)

if TYPE_CHECKING:  # types only: the explorer never imports the engine or the policy layer
    from engine_adapter.engine.launcher import StartProgress
    from engine_adapter.policy.controller import PolicyState
    from engine_adapter.policy.live_state import PolicyView
    from engine_adapter.records import PromSnapshot
    from engine_adapter.service.load import LoadStats

__all__ = [
    "LIVE",
    "LOCAL_VISITOR",
    "MAX_PROBE_TOKENS",
    "MAX_REPEATS",
    "LensComparison",
    "LensPoint",
    "LensView",
    "LoadMix",
    "POLICY_KINDS",
    "REPLAY",
    "SESSION_IDLE_S",
    "SLOT_POLICIES",
    "Backend",
    "BackgroundShare",
    "Capabilities",
    "PolicyKind",
    "PolicySpec",
    "Recording",
    "RecordingStatus",
    "ReferenceTwin",
    "ReplayInfo",
    "RestartTicket",
    "ServiceStatus",
    "SpeedSettings",
    "SpeedupRow",
    "SpeedupView",
    "State",
    "TwinStatus",
    "Visitor",
]

# "restarting": the engine died or hung; the watchdog restarts it after a back-off (status.error says why)
State = Literal["idle", "starting", "ready", "failed", "restarting", "stopped"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the page shows or hides its controls by these."""

    kind: Literal["live", "replay"]
    engine_control: bool  # restart with another config, attach, set K policies, profile
    lossless_check: bool  # a speculation-off twin can run the same prompt
    background_load: bool  # the load slider starts real requests


LIVE = Capabilities("live", engine_control=True, lossless_check=True, background_load=True)
REPLAY = Capabilities("replay", engine_control=False, lossless_check=False, background_load=False)


@dataclass(frozen=True)
class Visitor:
    """Who asks: a browser session, the visitor it belongs to (the client's address, or the one a
    Space's proxy forwarded), and whether it holds the presenter's key (or no key is set)."""

    session: str
    address: str
    presenter: bool = False


# a caller in Python (a script, a test), not a page: one visitor, not held to the per-visitor cap
LOCAL_VISITOR = Visitor("local", "local", presenter=True)


@dataclass(frozen=True)
class LoadMix:
    """The background load's task kinds: those its prompts come in, and those it runs now (all of
    them, or the presenter's choice); engine-wide, so only a presenter changes it."""

    available: tuple[str, ...]  # e.g. ("code", "math", ...); () where the load has no kinds (a replay)
    chosen: tuple[str, ...]  # the kinds running now (every one of ``available`` by default)

    def describe(self) -> str:
        if not self.available:
            return "no task kinds"
        return "every task kind" if set(self.chosen) == set(self.available) else ", ".join(self.chosen) + " only"


@dataclass(frozen=True)
class BackgroundShare:
    """One session's part of the shared background load."""

    asked: int
    granted: int
    total: int  # granted to all sessions (= requests the load keeps in flight)
    sessions: int  # sessions asking for load
    cap: int
    visitors: int = 1  # visitors (addresses) asking for load
    visitor_cap: int | None = None  # the most one visitor's sessions get together (None: a presenter's)
    ended: str | None = None  # why this session's load stopped by itself (it asks again to restart it)


@dataclass(frozen=True)
class TwinStatus:
    """The speculation-off engine of the lossless check."""

    state: Literal["off", "starting", "ready", "failed"]
    note: str | None  # the last thing that happened to it, in words
    may_start: bool  # whether the asking session may start it now


@dataclass(frozen=True)
class RecordingStatus:
    """``--record``: whether every visitor's session is being written to a file, and its trouble."""

    active: bool
    error: str | None  # why recording stopped (a write failed, the size cap was reached); the presenter's
    bytes_written: int
    max_bytes: int


@dataclass(frozen=True)
class StartTimes:
    """How long the last (re)start took from its first step to ready, and how much of it went on
    measuring this machine's step times (None: the cost model came from the cache, or none is used)."""

    total_s: float
    measuring_s: float | None


@dataclass(frozen=True, kw_only=True)
class ServiceStatus:
    state: State
    progress: StartProgress | None
    error: str | None
    config: EngineConfig | None
    url: str | None
    attached: bool
    generation: int  # bumps at every (re)start, so a UI can tell engines apart
    fault: str | None = None  # the engine fault being recovered from (a user's restart clears it)
    vllm_version: str | None = None  # the running engine's, once ready
    # the acceptance rule in force, engine-wide (every (re)start begins with vLLM's lossless rule)
    acceptance: AcceptanceRule = LOSSLESS
    restart_due_in_s: float | None = None  # a restart someone asked for starts in this many seconds
    started: StartTimes | None = None  # the last (re)start's times, once it is ready


@dataclass(frozen=True)
class ReplayInfo:
    """Where a replay stands: what ``Recording.info()`` gives."""

    path: str
    speed: float
    duration_s: float
    position_s: float  # recorded seconds into the trace
    loop: int  # 0 on the first pass
    header: dict[str, Any]
    num_steps: int
    num_requests: int
    load: int  # recorded background load at the position
    note: str | None  # why the last control did nothing, for a while

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True)
class ReferenceTwin:
    """A live engine's speculation-off twin, for the lossless check (``Backend.reference``).

    ``status(may_start)``: where it stands, for a session that may or may not start it;
    ``stream(prompt, *, max_tokens, temperature, may_start)``: the prompt on the twin (started on
    first use if ``may_start``, about half a minute), as ``Backend.stream`` yields it."""

    status: Callable[[bool], TwinStatus]
    stream: Callable[..., AsyncIterator[Step | RequestResult]]


@dataclass(frozen=True)
class Recording:
    """A replay's recorded session (``Backend.recording``): ``info()`` where the replay stands,
    ``prompt_for(prompt)`` the recorded prompt Run plays for it (itself if recorded, else the next
    recorded one), ``requests()`` the recorded foreground requests, in order."""

    info: Callable[[], ReplayInfo]
    prompt_for: Callable[[str], str]
    requests: Callable[[], list[RequestResult]]


@runtime_checkable
class Backend(Protocol):
    """What the explorer may call; ``EngineService`` and ``ReplayService`` implement it."""

    capabilities: Capabilities
    max_background: int
    on_result: list[Callable[[RequestResult], None]]  # each finished foreground request; must not block
    reference: ReferenceTwin | None  # a live engine's speculation-off twin; None on a replay
    recording: Recording | None  # a replay's recorded session; None on a live engine

    # --- lifecycle
    def status(self) -> ServiceStatus: ...
    def start(self, config: EngineConfig) -> Future: ...
    async def request_restart(self, config: EngineConfig) -> RestartTicket: ...
    def attach(self, url: str, tokenizer_dir: str | None = None, k_hint: int = 0) -> Future: ...
    async def restart(self, config: EngineConfig) -> None: ...
    def close(self) -> None: ...

    # --- requests
    def stream(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float,
        request_id: str | None = None,
    ) -> AsyncIterator[Step | RequestResult]: ...

    # --- history (server-wide, for the live charts)
    def steps_since(self, t: float) -> list[EngineStep]: ...
    def prom_history(self) -> Sequence[PromSnapshot]: ...
    @property
    def load_changes(self) -> Sequence[tuple[float, int]]: ...
    @property
    def policy_changes(self) -> Sequence[tuple[float, dict]]: ...

    # --- background load, shared fairly between browser sessions
    async def set_background(self, n: int, visitor: Visitor = LOCAL_VISITOR) -> int: ...
    def release_background(self, session: str) -> None: ...
    def touch_session(self, session: str) -> None: ...
    def background_share(self, session: str) -> BackgroundShare: ...
    def background_stats(self) -> LoadStats | None: ...
    def background_tokens_per_second(self, window_s: float = 10.0) -> float: ...
    def load_mix(self) -> LoadMix: ...
    async def set_load_mix(self, kinds: Sequence[str]) -> LoadMix: ...

    # --- K policies
    async def set_policy(self, spec: PolicySpec) -> PolicyState | None: ...
    async def profile_cost(self) -> None: ...
    def policy_view(self) -> PolicyView: ...

    # --- the speedup at this load (a presenter's measurement: K switches for everyone meanwhile)
    async def measure_speedup(self, repeats: int = 2, max_tokens: int = 64) -> SpeedupView: ...
    def speedup_view(self) -> SpeedupView: ...
    def speed_settings(self) -> SpeedSettings | None: ...  # what a speed figure measured now depends on
    def quant_lens(self) -> LensView: ...  # those measurements per model variant (service.quant_lens)

    # --- the acceptance rule (engine-wide; status().acceptance is the one in force)
    async def set_acceptance(self, rule: AcceptanceRule) -> AcceptanceRule: ...
