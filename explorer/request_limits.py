"""Per-visitor request rates at the HTTP door, before Gradio does any work for a request.

Contract: ``VisitorRateLimit`` is an ASGI middleware (``launch(app_kwargs={"middleware": [...]})``)
that gives each visitor address (``visitors.address_of``: on a Space the address its proxy
forwarded, else the connection's) a token bucket per kind of request: the page's plain polls
(``/gradio_api/run/...``: the status line, the charts; ``POLLS``), events joining the queue
(``/gradio_api/queue/join``, ``/gradio_api/call/...``; ``EVENTS``) and uploads (``UPLOADS``).
A request over its visitor's rate is answered 429 at once, with a ``Retry-After`` and a sentence
in JSON; everything else (the page itself, its assets, Gradio's heartbeat) passes untouched.
The rates leave room for a classroom behind one address: a page polls about twice a second.
"""

from __future__ import annotations

import json
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


POLLS = Rate(30.0, 60.0)  # plain requests a visitor address may make per second (a page makes ~2)
EVENTS = Rate(10.0, 40.0)  # events joining the queue per second (Run, a slider, a click)
UPLOADS = Rate(1.0, 5.0)
MAX_TRACKED = 20_000  # visitor buckets kept at most; idle ones go first

KINDS: tuple[tuple[str, str, Rate], ...] = (
    ("/gradio_api/run/", "polls", POLLS),
    ("/gradio_api/queue/join", "events", EVENTS),
    ("/gradio_api/call/", "events", EVENTS),
    ("/gradio_api/upload", "uploads", UPLOADS),
)


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
            self._prune(now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / rate.per_s

    def _prune(self, now: float) -> None:
        if len(self._buckets) > MAX_TRACKED:
            for key in sorted(self._buckets, key=lambda k: self._buckets[k][1])[: len(self._buckets) // 2]:
                del self._buckets[key]


class VisitorRateLimit:
    def __init__(self, app: ASGIApp, exposure: Exposure, kinds: tuple[tuple[str, str, Rate], ...] = KINDS) -> None:
        self.app = app
        self.exposure = exposure
        self.kinds = kinds
        self.buckets = TokenBuckets()
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope.get("type") == "http":
            path = scope.get("path", "")
            for prefix, kind, rate in self.kinds:
                if path.startswith(prefix):
                    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
                    client = scope.get("client") or ("unknown", 0)
                    wait = self.buckets.take((address_of(headers, client[0], self.exposure), kind), rate)
                    if wait > 0:
                        self.refused += 1
                        await _too_many(send, kind, wait)
                        return
                    break
        await self.app(scope, receive, send)


async def _too_many(send: Callable, kind: str, wait: float) -> None:
    body = json.dumps({"error": f"Too many {kind} from your address: slow down (try again in {wait:.1f} s)."}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", str(max(1, round(wait))).encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
