"""Who is asking, and how much one visitor may run at once.

Contract:
- ``Exposure(public, behind_proxy)``: how the page is reached. ``public``: the app listens on
  something other than loopback (every page is a stranger's); ``behind_proxy``: a Hugging Face
  Space (``SYSTEM=spaces``), whose proxy adds the visitor's address to ``X-Forwarded-For``.
  ``exposure_for(host)`` decides both from the bind address and the environment.
- ``address_of(headers, peer, exposure)``: a visitor's address: on a Space the rightmost
  ``X-Forwarded-For`` entry (the one the Space's proxy added; what a client put there itself
  stands to its left), elsewhere the connection's ``peer`` (uvicorn takes it from
  ``X-Forwarded-For`` only for a proxy on loopback, ``FORWARDED_ALLOW_IPS``).
- ``visitor_of(request, exposure)``: the ``Visitor`` (``service.backend``) a Gradio request comes
  from: its session and ``address_of``. Sessions are made up by the client, so every bound that
  must hold against a script counts addresses too.
- ``RunSlots(per_session, per_visitor)``: foreground runs in flight, at most ``per_session`` per
  session and ``per_visitor`` per address; ``take(visitor)`` returns None and holds a slot, or
  the refusal to show; ``give_back(visitor)`` frees it. A run that can be stopped watches
  ``stop_signal(session)`` (an ``asyncio.Event``, one per session while it runs);
  ``stop(session)``, from the event loop, sets it and says whether a run was there to stop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import gradio as gr

from engine_adapter.service.backend import Visitor

MAX_RUNS_PER_SESSION = 1  # foreground runs of one page at a time (Run, Shift+Enter, API calls together)
MAX_RUNS_PER_VISITOR = 4  # of all sessions of one address (a classroom behind one address shares it)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class Exposure:
    public: bool = False
    behind_proxy: bool = False


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def on_a_space() -> bool:
    """Hugging Face sets SYSTEM=spaces in a Space (Gradio's own ``get_space`` reads the same)."""
    return os.environ.get("SYSTEM") == "spaces"


def exposure_for(host: str) -> Exposure:
    return Exposure(public=not is_loopback(host) or on_a_space(), behind_proxy=on_a_space())


def address_of(headers: Mapping[str, str], peer: str | None, exposure: Exposure) -> str:
    if exposure.behind_proxy:
        forwarded = [a.strip() for a in (headers.get("x-forwarded-for") or "").split(",") if a.strip()]
        if forwarded:
            return forwarded[-1]
    return peer or "unknown"


def visitor_of(request: gr.Request | None, exposure: Exposure, presenter: bool = False) -> Visitor:
    if request is None:  # called from Python, not over HTTP
        return Visitor("local", "local", presenter)
    client = getattr(request, "client", None)
    address = address_of(request.headers, getattr(client, "host", None), exposure)
    return Visitor(request.session_hash or "no-session", address, presenter)


class RunSlots:
    def __init__(self, per_session: int = MAX_RUNS_PER_SESSION, per_visitor: int = MAX_RUNS_PER_VISITOR) -> None:
        self.per_session = per_session
        self.per_visitor = per_visitor
        self._sessions: Counter[str] = Counter()
        self._addresses: Counter[str] = Counter()
        self._stops: dict[str, asyncio.Event] = {}  # sessions with a run in flight that watches for Stop
        self._lock = threading.Lock()

    def take(self, visitor: Visitor) -> str | None:
        with self._lock:
            if self._sessions[visitor.session] >= self.per_session:
                return "This page already has a request running: wait for it to finish (or press Stop), then run again."
            if not visitor.presenter and self._addresses[visitor.address] >= self.per_visitor:
                return (
                    f"{self.per_visitor} requests from your address are already running (every tab and "
                    "script from one address shares this limit): wait for one to finish."
                )
            self._sessions[visitor.session] += 1
            if not visitor.presenter:  # the presenter's runs do not use up the visitors' of its address
                self._addresses[visitor.address] += 1
            return None

    def give_back(self, visitor: Visitor) -> None:
        with self._lock:
            self._sessions[visitor.session] -= 1
            if not visitor.presenter:
                self._addresses[visitor.address] -= 1
            if self._sessions[visitor.session] <= 0:
                self._stops.pop(visitor.session, None)
            self._sessions += Counter()  # drops the zeros: the tables hold only running visitors
            self._addresses += Counter()

    def stop_signal(self, session: str) -> asyncio.Event:
        with self._lock:
            return self._stops.setdefault(session, asyncio.Event())

    def stop(self, session: str) -> bool:
        with self._lock:
            signal = self._stops.get(session)
        if signal is None:
            return False
        signal.set()
        return True

    def running(self) -> int:
        with self._lock:
            return sum(self._sessions.values())
