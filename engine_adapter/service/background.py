"""The background load every page shares: sessions' asks turned into real requests on the engine.

Contract (everything but the readers runs on ``EngineService``'s event loop):
``SharedBackground(prompts, ...)`` keeps the sessions' asks (``fair_share.SessionLoads``: one cap
shared fairly between visitors, a cap per visitor, idle and age limits per session) and one
``load.BackgroundLoad`` per engine. ``ask(visitor, n)`` records an ask; ``apply(client)`` runs
the granted total on the engine (``client`` None: the engine is not serving, the asks wait);
``janitor_round(client)`` expires idle and aged sessions and replaces workers that ended, so
the load lives as long as the engine; ``stop()`` ends the requests (the asks are kept for the
next engine). ``mix()`` is the task kinds the load runs, ``choose_kinds(kinds)`` narrows them
(on the loop). ``share(session)`` is one session's view (``BackgroundShare``), with why its load
stopped if it did; ``changes`` the (monotonic t, total) at each change, for the charts.
Readers (``share``, ``stats``, ``tokens_per_second``, ``changes``, ``mix``) may run on any thread.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence

from engine_adapter.engine.client import EngineClient
from engine_adapter.prompts import Preset
from engine_adapter.service.backend import BackgroundShare, LoadMix, Visitor
from engine_adapter.service.fair_share import (
    MAX_BACKGROUND,
    MAX_BACKGROUND_PER_VISITOR,
    SESSION_IDLE_S,
    SESSION_LOAD_MAX_S,
    SessionLoads,
)
from engine_adapter.service.load import BackgroundLoad, LoadStats

MARKER_MERGE_S = 2.0  # load changes closer than this are one marker on the charts (a drag)


class SharedBackground:
    def __init__(
        self,
        prompts: Sequence[str | Preset],
        *,
        cap: int = MAX_BACKGROUND,
        visitor_cap: int = MAX_BACKGROUND_PER_VISITOR,
        idle_s: float = SESSION_IDLE_S,
        max_age_s: float = SESSION_LOAD_MAX_S,
        max_tokens: int = 128,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prompts = list(prompts)
        self.all_prompts = tuple(prompts)  # what ``choose_kinds`` chooses from
        self._kinds: tuple[str, ...] = ()  # the task kinds the load runs (): all of them
        self.max_tokens = max_tokens
        self._clock = clock
        self.sessions = SessionLoads(cap=cap, idle_s=idle_s, visitor_cap=visitor_cap, max_age_s=max_age_s)
        self.load: BackgroundLoad | None = None
        self._client: EngineClient | None = None
        self._changes: collections.deque[tuple[float, int]] = collections.deque(maxlen=200)
        self._lock = threading.Lock()  # the sessions' tables: written on the loop, read by page threads
        self._granted: dict[str, int] | None = None  # the sessions' grants, until an ask changes

    def set_prompts(self, prompts: Sequence[str | Preset]) -> None:
        """The prompts the load's next requests cycle through, now and after a restart."""
        if not prompts:
            raise ValueError("background load needs at least one prompt")
        self.prompts = list(prompts)
        if self.load is not None:
            self.load.set_prompts(self.prompts)

    def mix(self) -> LoadMix:
        """The task kinds the load's presets have, and those its requests come from."""
        available = tuple(dict.fromkeys(p.category for p in self.all_prompts if isinstance(p, Preset) and p.category))
        return LoadMix(available, self._kinds or available)

    def choose_kinds(self, kinds: Sequence[str]) -> LoadMix:
        """The load's next requests come from the presets of ``kinds`` only (every kind: all);
        raises ValueError for a kind the load has no preset of."""
        available = self.mix().available
        chosen = tuple(dict.fromkeys(kinds))
        if not chosen or not set(chosen) <= set(available):
            raise ValueError(f"choose among the load's task kinds: {', '.join(available) or 'none'}; got {kinds!r}")
        self.set_prompts([p for p in self.all_prompts if isinstance(p, Preset) and p.category in chosen])
        self._kinds = () if set(chosen) == set(available) else chosen
        return self.mix()

    @property
    def cap(self) -> int:
        return self.sessions.cap

    @property
    def changes(self) -> list[tuple[float, int]]:
        return list(self._changes)

    def ask(self, visitor: Visitor, n: int) -> None:
        with self._lock:
            self.sessions.set(visitor.session, n, self._clock(), visitor.address, privileged=visitor.presenter)
            self._granted = None

    def release(self, session: str) -> bool:
        with self._lock:
            self._granted = None
            return self.sessions.release(session)

    def touch(self, session: str) -> None:
        with self._lock:
            self.sessions.touch(session, self._clock())

    async def apply(self, client: EngineClient | None) -> int:
        """Run the sessions' granted total on ``client``'s engine (None: not serving; asks wait)."""
        total = self.granted_total()
        if client is None or not self.prompts:
            return total
        if self.load is None or self._client is not client:
            await self.stop()
            self._client = client
            self.load = BackgroundLoad(client, self.prompts, max_tokens=self.max_tokens, max_concurrency=self.cap)
        before = self.load.target
        n = self.load.set_concurrency(total)
        if n != before:
            now = self._clock()
            if self._changes and now - self._changes[-1][0] < MARKER_MERGE_S:
                self._changes[-1] = (self._changes[-1][0], n)
            else:
                self._changes.append((now, n))
        return n

    async def janitor_round(self, client: EngineClient | None) -> None:
        """Expire idle and aged sessions; top the load up (a worker that ended is replaced)."""
        with self._lock:
            if self.sessions.expire(self._clock()):
                self._granted = None
        await self.apply(client)

    async def stop(self) -> None:
        """End the requests (engine going away); the sessions' asks stay for the next engine."""
        if self.load is not None:
            await self.load.stop()
        self.load, self._client = None, None

    def share(self, session: str) -> BackgroundShare:
        s = self.sessions
        with self._lock:
            granted = self._grants()
            return BackgroundShare(
                asked=s.asks.get(session, 0),
                granted=granted.get(session, 0),
                total=sum(granted.values()),
                sessions=len(s.asks),
                cap=s.cap,
                visitors=s.visitors(),
                visitor_cap=None if session in s.privileged else min(s.visitor_cap, s.cap),
                ended=s.ended.get(session),
            )

    def granted_total(self) -> int:
        """The requests the sessions' grants add up to (what ``apply`` runs)."""
        with self._lock:
            return sum(self._grants().values())

    def _grants(self) -> dict[str, int]:
        """The sessions' grants (computed again only after an ask changed); hold ``_lock``."""
        if self._granted is None:
            self._granted = self.sessions.granted()
        return self._granted

    def stats(self) -> LoadStats | None:
        return self.load.stats() if self.load else None

    def tokens_per_second(self, window_s: float = 10.0) -> float:
        return self.load.tokens_per_second(window_s) if self.load else 0.0
