"""The HTTP door: per-visitor request rates, enforced before Gradio does any work for a request.

Contract: ``VisitorGate`` is an ASGI middleware (``launch(app_kwargs={"middleware": [...]})``).
Each request counts against its visitor address (``visitors.address_of``: on a Space the
address its proxy forwarded, else the connection's) and, where it names one, its Gradio session:

- ``routes``: paths the gate answers itself, as JSON, without Gradio (the status line every page
  fetches each second: a Gradio call would build a whole session's state for it, about 10 ms);
- the page's plain polls (``/gradio_api/run/...``, and Gradio's alias ``/gradio_api/api/...``) per
  address (``POLLS``) and per session (``SESSION_POLLS``); the page's Stop (``stop``, a
  ``StopCall``) apart, per address (``STOPS``), so a page over its poll rate can still stop its run:
  ``/run/<api_name>`` (an API caller) or ``/run/predict`` with its ``fn_index`` (the page's own
  call); events joining the queue
  (``/gradio_api/queue/join``, ``/gradio_api/call/...``) per address (``EVENTS``); uploads (``UPLOADS``);
- a session the gate has not seen before, per address (``NEW_SESSIONS``): Gradio builds every
  new session's state from the page's whole config, so made-up sessions are the costly ones.

The rates hold on a public page (``exposure.public``); on loopback (one person's machine, or the
tests) the gate only answers its routes. A request over a rate is held for the time its bucket
needs (at most ``TARPIT_S``; a flood's threads then wait instead of spinning) and answered 429
with a sentence in JSON; beyond ``MAX_HELD`` held at once, at once. Everything else (the page,
its assets) passes untouched. The rates leave room for a classroom behind one address: a page
polls about twice a second.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from explorer.panels.visitors import Exposure, address_of

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


@dataclass(frozen=True)
class Rate:
    per_s: float  # tokens added per second
    burst: float  # the bucket's size


POLLS = Rate(20.0, 60.0)  # Gradio plain requests per address per second (a page makes about 0.5-1.5)
SESSION_POLLS = Rate(3.0, 10.0)  # the same per session (one page)
LINES = Rate(40.0, 80.0)  # the gate's own answers (the status line: one a second per page)
EVENTS = Rate(10.0, 40.0)  # events joining the queue per address per second (Run, a slider, a click)
STOPS = Rate(5.0, 30.0)  # Stop presses per address per second (a classroom stopping at once)
UPLOADS = Rate(1.0, 5.0)
NEW_SESSIONS = Rate(0.5, 30.0)  # sessions an address may start: 30 pages at once, then one per 2 s
TARPIT_S = 2.0  # the longest a request over its rate is held before its 429
MAX_HELD = 256  # requests held at once, at most; beyond, a 429 goes out at once
MAX_BODY = 64 << 10  # bytes of a request body read for its session (a larger one is not a poll)
MAX_TRACKED = 20_000  # buckets and known sessions kept at most; the idle ones go first

ANONYMOUS = "\0anonymous"  # a call that names no session: Gradio makes a new one for it, each time
HEARTBEAT = re.compile(r"^/gradio_api/heartbeat/([^/]+)")
PLAIN_CALLS = ("/gradio_api/run/", "/gradio_api/api/")  # Gradio's plain calls (/api/ is an alias of /run/)
SESSION_IN_BODY = (*PLAIN_CALLS, "/gradio_api/queue/join")
KINDS: tuple[tuple[str, str, Rate], ...] = (  # the first prefix a path starts with decides
    ("/gradio_api/run/", "polls", POLLS),
    ("/gradio_api/api/", "polls", POLLS),  # Gradio's alias of /run/
    ("/gradio_api/queue/join", "events", EVENTS),
    ("/gradio_api/call/", "events", EVENTS),
    ("/gradio_api/upload", "uploads", UPLOADS),
)


@dataclass(frozen=True)
class StopCall:
    """The page's Stop event, as a plain call names it: ``/run/<api_name>`` (an API caller), or
    ``/run/predict`` with ``fn_index`` ``fn_id`` in its body (the page itself)."""

    api_name: str
    fn_id: int

    def made_by(self, path: str, fn_index: int | None) -> bool:
        route = path.rstrip("/")
        name = next((route[len(p) :] for p in PLAIN_CALLS if route.startswith(p)), None)
        return name == self.api_name or (name == "predict" and fn_index == self.fn_id)


class TokenBuckets:
    """Token buckets by key; ``take(key, rate)`` is 0 when a token was there, else seconds to wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (tokens, when)

    def take(self, key: tuple[str, str], rate: Rate) -> float:
        now = self._clock()
        tokens, at = self._buckets.get(key, (rate.burst, now))
        tokens = min(rate.burst, tokens + (now - at) * rate.per_s)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            _prune(self._buckets, lambda v: v[1])
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / rate.per_s


def _prune(table: dict, when: Callable[[Any], float]) -> None:
    if len(table) > MAX_TRACKED:
        for key in sorted(table, key=lambda k: when(table[k]))[: len(table) // 2]:
            del table[key]


class VisitorGate:
    def __init__(
        self,
        app: ASGIApp,
        exposure: Exposure,
        routes: dict[str, Callable[[], Any]] | None = None,
        kinds: tuple[tuple[str, str, Rate], ...] = KINDS,
        clock: Callable[[], float] = time.monotonic,
        stop: StopCall | None = None,
    ) -> None:
        self.app = app
        self.stop = stop
        self.exposure = exposure
        self.routes = routes or {}
        self.kinds = kinds
        self._clock = clock
        self.buckets = TokenBuckets(clock)
        self.sessions: dict[str, float] = {}  # sessions seen -> when last
        self.held = 0
        self.refused: collections.Counter[str] = collections.Counter()

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        address = address_of(headers, (scope.get("client") or ("unknown", 0))[0], self.exposure)
        if path in self.routes:
            if self.exposure.public and (wait := self.buckets.take((address, "lines"), LINES)):
                return await self._refuse(send, "status requests", wait)
            return await _json(send, 200, self.routes[path]())
        if not self.exposure.public:
            return await self.app(scope, receive, send)
        kind = next(((k, rate) for prefix, k, rate in self.kinds if path.startswith(prefix)), None)
        session, fn_index, receive = await self._session_of(scope, path, receive)
        if self.stop is not None and self.stop.made_by(path, fn_index):
            kind = ("stops", STOPS)
        if session == ANONYMOUS or (session is not None and session not in self.sessions):
            if wait := self.buckets.take((address, "new sessions"), NEW_SESSIONS):
                return await self._refuse(send, "new sessions", wait)
        if session not in (None, ANONYMOUS):
            self.sessions[session] = self._clock()
            _prune(self.sessions, lambda t: t)
        if kind is not None:
            name, rate = kind
            wait = self.buckets.take((address, name), rate)
            if not wait and name == "polls" and session not in (None, ANONYMOUS):
                wait = self.buckets.take((f"session:{session}", name), SESSION_POLLS)
            if wait:
                return await self._refuse(send, name, wait)
        await self.app(scope, receive, send)

    async def _session_of(self, scope: Scope, path: str, receive: Callable) -> tuple[str | None, int | None, Callable]:
        """The request's Gradio session (from the heartbeat's path or a small JSON body), the body's
        ``fn_index`` and a ``receive`` that hands the app the body again; a call without a session is
        a new session each time."""
        if m := HEARTBEAT.match(path):
            return m.group(1), None, receive
        if scope.get("method") != "POST" or not path.startswith(SESSION_IN_BODY):
            return None, None, receive
        body, more = b"", True
        while more and len(body) <= MAX_BODY:
            message = await receive()
            if message["type"] != "http.request":
                return None, None, receive  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        try:
            fields = json.loads(body) if not more else {}
            session, fn_index = fields.get("session_hash"), fields.get("fn_index")
        except (ValueError, AttributeError):
            session, fn_index = None, None
        fn_index = fn_index if isinstance(fn_index, int) else None
        return (session if isinstance(session, str) and session else ANONYMOUS), fn_index, replay

    async def _refuse(self, send: Callable, what: str, wait: float) -> None:
        self.refused[what] += 1
        if self.held < MAX_HELD:
            self.held += 1
            try:
                await asyncio.sleep(min(wait, TARPIT_S))
            finally:
                self.held -= 1
        message = f"Too many {what} from your address: slow down (try again in {max(wait, 0.1):.1f} s)."
        await _json(send, 429, {"error": message}, retry_after=wait)


async def _json(send: Callable, status: int, payload: Any, retry_after: float | None = None) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, round(retry_after))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
