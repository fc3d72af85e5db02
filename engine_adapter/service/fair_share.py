"""Background load shared between browser sessions: per-session asks, one global cap.

Contract: ``SessionLoads(cap, idle_s)`` keeps each session's requested
concurrency and when it was last seen; ``granted()`` shares ``cap`` by
water-filling (max-min fairness: nobody gets more than asked, and no session
gets less than an equal share while another gets more); ``expire(now)``
forgets sessions not seen for ``idle_s`` seconds (a closed tab whose unload
never arrived, a laptop put to sleep). Pure bookkeeping: the engine service
turns ``total()`` into real requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def fair_shares(asks: Mapping[str, int], cap: int) -> dict[str, int]:
    """Max-min fair integer shares of ``cap`` (sum = min(cap, sum of asks), each <= its ask).

    Smallest asks first: each takes at most an equal split of what is left, so
    what a small ask leaves over goes to the larger ones.
    """
    grants: dict[str, int] = {}
    left = max(int(cap), 0)
    order = sorted(asks.items(), key=lambda kv: (max(int(kv[1]), 0), kv[0]))
    for i, (session, ask) in enumerate(order):
        grants[session] = min(max(int(ask), 0), left // (len(order) - i))
        left -= grants[session]
    return grants


MAX_BACKGROUND = 64  # background requests in flight at most, all sessions together
SESSION_IDLE_S = 120.0  # a session that has not polled for this long loses its load


@dataclass
class SessionLoads:
    cap: int = MAX_BACKGROUND
    idle_s: float = SESSION_IDLE_S
    asks: dict[str, int] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)

    def set(self, session: str, n: int, now: float) -> int:
        """Record a session's ask (clamped to 0..cap); returns the ask kept."""
        n = max(0, min(int(n), self.cap))
        if n == 0:
            self.asks.pop(session, None)
        else:
            self.asks[session] = n
        self.last_seen[session] = now
        return n

    def touch(self, session: str, now: float) -> None:
        self.last_seen[session] = now

    def release(self, session: str) -> bool:
        """Forget a session (tab closed); True if it had a load."""
        self.last_seen.pop(session, None)
        return self.asks.pop(session, None) is not None

    def expire(self, now: float) -> list[str]:
        gone = [s for s, t in self.last_seen.items() if now - t > self.idle_s]
        for s in gone:
            self.release(s)
        return gone

    def granted(self) -> dict[str, int]:
        return fair_shares(self.asks, self.cap)

    def total(self) -> int:
        return sum(self.granted().values())
