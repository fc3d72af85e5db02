"""Gradio's per-session state, forgotten once its session is idle.

Contract: ``IdleSessionExpiry`` is an ASGI middleware (``launch(app_kwargs={"middleware": [...]})``).
Gradio keeps a state for every session it has served (``gradio.state_holder.SessionState``: a copy
of the page's whole config, about 200 KiB for this page, and the page's ``gr.State`` values) until
``state_session_capacity`` sessions push the oldest out; a ``gradio_client`` session never sends
the heartbeat whose end would mark it closed, and a closed one is kept for an hour anyway. At most
once every ``every_s``, on the event loop that serves Gradio's requests (so never beside Gradio's
own use of the table), the middleware forgets the state of every session Gradio has not used for
``idle_s`` (default ``SESSION_IDLE_S``, the idle time after which a session's background load stops
too). An open page uses its session at each poll of its charts (every few seconds; once a minute
in a hidden tab of Chrome; never in a frozen one), so only sessions nobody holds are forgotten; a
page that comes back after longer starts from the page's defaults, as its load did.

Gradio's table is reached in one checked place, ``SessionTable``: the names it uses are checked
when the middleware is built (a Gradio without them refuses to start, by name), and the table
itself is read from the request's ``scope["app"]`` (Starlette's app: Gradio's ``App``); an app
without a ``state_holder`` is said once on stderr (the app's log) and never swept.
"""

from __future__ import annotations

import datetime
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from engine_adapter.service.backend import SESSION_IDLE_S
from explorer.request_limits import ASGIApp, Scope

SWEEP_EVERY_S = 30.0  # the shortest time between two sweeps of Gradio's session table
NO_STATE_HOLDER = "spec-explorer: Gradio's app has no state_holder: idle sessions' state is never forgotten"
STATE_HOLDER_NAMES = ("session_data", "time_last_used", "lock")  # what SessionTable reads of Gradio's StateHolder


class SessionTable:
    """Gradio's ``StateHolder``: its sessions (``session_data``), when each was last used
    (``time_last_used``, naive local datetimes) and the lock its capacity eviction holds."""

    def __init__(self, holder: Any) -> None:
        missing = [name for name in STATE_HOLDER_NAMES if not hasattr(holder, name)]
        if missing:
            raise RuntimeError(f"Gradio's StateHolder has no {', '.join(missing)}: idle sessions cannot be forgotten")
        self.holder = holder

    def forget_idle(self, idle_s: float, now: datetime.datetime) -> int:
        """Drops every session last used more than ``idle_s`` before ``now``; returns how many."""
        cutoff = now - datetime.timedelta(seconds=idle_s)
        with self.holder.lock:
            idle = [s for s, used in self.holder.time_last_used.items() if used < cutoff]
            for session in idle:
                self.holder.session_data.pop(session, None)
                del self.holder.time_last_used[session]
        return len(idle)


class IdleSessionExpiry:
    def __init__(
        self,
        app: ASGIApp,
        idle_s: float = SESSION_IDLE_S,
        every_s: float = SWEEP_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from gradio.state_holder import StateHolder

        SessionTable(StateHolder())  # the names it reads are there, or the app does not start
        self.app = app
        self.idle_s = idle_s
        self.every_s = every_s
        self._clock = clock
        self._next_sweep = clock() + every_s
        self.forgotten = 0  # sessions forgotten since the start

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        now = self._clock()
        if scope.get("type") == "http" and now >= self._next_sweep:
            self._next_sweep = now + self.every_s
            holder = getattr(scope.get("app"), "state_holder", None)
            if holder is None:
                self._next_sweep = math.inf
                print(NO_STATE_HOLDER, file=sys.stderr, flush=True)
            else:
                self.forgotten += SessionTable(holder).forget_idle(self.idle_s, datetime.datetime.now())
        await self.app(scope, receive, send)
