"""Every page's polls answered from one computation per refresh tick, and a bound on how many run.

Contract: ``TickCache(ttl_s)``; ``get(key, build)`` returns what ``build()`` gave for ``key``
less than ``ttl_s`` ago, else builds it, once: concurrent callers of one key wait for that one
build instead of repeating it (a page's poll then costs a dictionary lookup, however many pages
or scripts poll). Keys are any value (one that is not hashable, a list, is keyed by its ``repr``);
entries older than ``KEEP_TTLS`` ticks are dropped.
``PollBound(max_at_once)``: ``with bound.slot() as ok:`` is True for at most ``max_at_once``
callers at a time and False at once for the others, who answer from what is cached (nothing
waits: the handlers run in Gradio's thread pool, shared with every other handler).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

KEEP_TTLS = 10  # an entry unused for this many ticks is dropped
MAX_POLLS_AT_ONCE = 4  # page polls computing at once (the rest answer from the cache)


class TickCache:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[Hashable, tuple[float, Any]] = {}
        self._building: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.builds = 0  # how many times a value was computed (tests, benchmarks)

    def _fresh(self, key: Hashable) -> tuple[bool, Any]:
        entry = self._entries.get(key)
        if entry is not None and self._clock() - entry[0] < self.ttl_s:
            return True, entry[1]
        return False, None

    def peek(self, key: Hashable) -> Any:
        """The last value built for ``key``, however old (None if never)."""
        with self._lock:
            entry = self._entries.get(key)
        return entry[1] if entry else None

    def get(self, key: Any, build: Callable[[], T]) -> T:
        key = _hashable(key)
        with self._lock:
            fresh, value = self._fresh(key)
            if fresh:
                return value
            builder = self._building.setdefault(key, threading.Lock())
        with builder:
            with self._lock:
                fresh, value = self._fresh(key)
            if fresh:
                return value
            value = build()
            with self._lock:
                now = self._clock()
                self._entries[key] = (now, value)
                self.builds += 1
                for old in [k for k, (t, _) in self._entries.items() if now - t > KEEP_TTLS * self.ttl_s]:
                    del self._entries[old]
                    self._building.pop(old, None)
            return value


def _hashable(key: Any) -> Hashable:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


class PollBound:
    def __init__(self, max_at_once: int = MAX_POLLS_AT_ONCE) -> None:
        self._slots = threading.BoundedSemaphore(max_at_once)
        self.refused = 0  # polls answered from the cache because every slot was taken

    @contextlib.contextmanager
    def slot(self) -> Iterator[bool]:
        got = self._slots.acquire(blocking=False)
        if not got:
            self.refused += 1
        try:
            yield got
        finally:
            if got:
                self._slots.release()
