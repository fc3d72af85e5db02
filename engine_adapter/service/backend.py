"""The one surface the explorer talks to: the ``Backend`` protocol and its records.

Contract: a backend is a live engine service (``EngineService``) or a recorded
session played back (``ReplayService``). Both implement every member below; what
one of them cannot do is said by ``capabilities`` (a field, never probed with
``getattr``) and, where a call makes no sense, by a ``RuntimeError`` whose message
a person can act on. The explorer imports this module, ``records`` and pure helpers
only; it never sees an engine, a client or vLLM. ``PolicySpec`` (what a person asks
the engine to run) is re-exported from the policy layer for the same reason.

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
from engine_adapter.policy.controller import POLICY_KINDS, PolicyKind, PolicySpec
from engine_adapter.records import EngineStep, RequestResult, Step
from engine_adapter.service.restart_gate import RestartTicket

if TYPE_CHECKING:  # types only: the explorer never imports the engine or the policy layer
    from engine_adapter.engine.launcher import StartProgress
    from engine_adapter.policy.controller import PolicyState
    from engine_adapter.policy.live_state import PolicyView
    from engine_adapter.records import PromSnapshot
    from engine_adapter.service.load import LoadStats

__all__ = [
    "LIVE",
    "LOCAL_VISITOR",
    "POLICY_KINDS",
    "REPLAY",
    "Backend",
    "BackgroundShare",
    "Capabilities",
    "PolicyKind",
    "PolicySpec",
    "RecordingStatus",
    "ReplayInfo",
    "RestartTicket",
    "ServiceStatus",
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


@dataclass(frozen=True)
class ReplayInfo:
    """Where a replay stands: what ``Backend.replay_info()`` gives on a replay."""

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


@runtime_checkable
class Backend(Protocol):
    """What the explorer may call; ``EngineService`` and ``ReplayService`` implement it."""

    capabilities: Capabilities
    max_background: int
    on_result: list[Callable[[RequestResult], None]]  # each finished foreground request; must not block

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
        reference: bool = False,
        request_id: str | None = None,
        may_start_reference: bool = True,
    ) -> AsyncIterator[Step | RequestResult]: ...
    def twin_status(self, may_start: bool) -> TwinStatus: ...

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

    # --- K policies
    async def set_policy(self, spec: PolicySpec) -> PolicyState | None: ...
    async def profile_cost(self) -> None: ...
    def policy_view(self) -> PolicyView: ...

    # --- the acceptance rule (engine-wide; status().acceptance is the one in force)
    async def set_acceptance(self, rule: AcceptanceRule) -> AcceptanceRule: ...

    # --- replay (None / the prompt itself / [] on a live engine)
    @property
    def replay_info(self) -> ReplayInfo | None: ...
    def replay_prompt(self, prompt: str) -> str: ...
    def recorded_requests(self) -> list[RequestResult]: ...
