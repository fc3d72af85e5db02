"""Background load shared between browser sessions and visitors: per-session asks, two caps.

Contract: ``SessionLoads(cap, idle_s, visitor_cap, max_age_s)`` keeps each session's requested
concurrency, the visitor it belongs to (the client's address: several sessions of one browser,
or a script opening many, are one visitor), when it was last seen and when it last asked.
``granted()`` shares ``cap`` in two levels of water-filling (max-min fairness: nobody gets more
than asked, and nobody gets less than an equal share while another gets more): first between
visitors, each asking the sum of its sessions' asks but at most ``visitor_cap`` (a presenter's
sessions, ``privileged``, are not held to it), then within each visitor between its sessions.
``expire(now)`` ends the load of sessions not seen for ``idle_s`` seconds (a closed tab whose
unload never arrived, a laptop put to sleep) or whose last ask is older than ``max_age_s`` (a
page left open: the load is renewed by moving the slider) and keeps why, for the session's
readout (``ended``). Pure bookkeeping: the engine service turns ``total()`` into real requests.
"""

from __future__ import annotations

from collections import defaultdict
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
MAX_BACKGROUND_PER_VISITOR = 16  # at most, all sessions of one visitor (client address) together
SESSION_IDLE_S = 120.0  # a session that has not polled for this long loses its load
SESSION_LOAD_MAX_S = 3600.0  # a load not asked for again (slider moved) for this long stops

IDLE_END = "your page stopped polling for {s:.0f} s (a closed or sleeping tab)"
AGE_END = "the slider was last moved {s:.0f} minutes ago; move it to start the load again"


@dataclass
class SessionLoads:
    cap: int = MAX_BACKGROUND
    idle_s: float = SESSION_IDLE_S
    visitor_cap: int = MAX_BACKGROUND_PER_VISITOR
    max_age_s: float = SESSION_LOAD_MAX_S
    asks: dict[str, int] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    asked_at: dict[str, float] = field(default_factory=dict)
    visitor_of: dict[str, str] = field(default_factory=dict)
    privileged: set[str] = field(default_factory=set)  # sessions not held to visitor_cap
    ended: dict[str, str] = field(default_factory=dict)  # session -> why its load stopped by itself

    def set(self, session: str, n: int, now: float, visitor: str | None = None, privileged: bool = False) -> int:
        """Record a session's ask (clamped to 0..cap) from ``visitor`` (default: the session
        itself); returns the ask kept."""
        n = max(0, min(int(n), self.cap))
        self.visitor_of[session] = visitor or session
        if privileged:
            self.privileged.add(session)
        else:
            self.privileged.discard(session)
        if n == 0:
            self.asks.pop(session, None)
        else:
            self.asks[session] = n
        self.last_seen[session] = now
        self.asked_at[session] = now
        self.ended.pop(session, None)
        return n

    def touch(self, session: str, now: float) -> None:
        self.last_seen[session] = now

    def release(self, session: str) -> bool:
        """Forget a session (tab closed); True if it had a load."""
        for table in (self.last_seen, self.asked_at, self.visitor_of, self.ended):
            table.pop(session, None)
        self.privileged.discard(session)
        return self.asks.pop(session, None) is not None

    def expire(self, now: float) -> list[str]:
        """End the loads of idle and aged sessions (the reason kept in ``ended`` for an aged one,
        whose page still polls); returns the sessions whose load ended."""
        gone = [s for s, t in self.last_seen.items() if now - t > self.idle_s]
        for s in gone:
            self.release(s)
        aged = [s for s in self.asks if now - self.asked_at.get(s, now) > self.max_age_s]
        for s in aged:
            self.asks.pop(s)
            self.ended[s] = AGE_END.format(s=self.max_age_s / 60)
        return gone + aged

    def _visitor_cap(self, sessions: list[str]) -> int:
        return self.cap if any(s in self.privileged for s in sessions) else min(self.visitor_cap, self.cap)

    def granted(self) -> dict[str, int]:
        by_visitor: dict[str, list[str]] = defaultdict(list)
        for s in self.asks:
            by_visitor[self.visitor_of.get(s, s)].append(s)
        demand = {
            v: min(sum(self.asks[s] for s in sessions), self._visitor_cap(sessions))
            for v, sessions in by_visitor.items()
        }
        grants: dict[str, int] = {}
        for v, share in fair_shares(demand, self.cap).items():
            grants |= fair_shares({s: self.asks[s] for s in by_visitor[v]}, share)
        return grants

    def total(self) -> int:
        return sum(self.granted().values())

    def visitors(self) -> int:
        """Visitors asking for load now."""
        return len({self.visitor_of.get(s, s) for s in self.asks})
