"""A clock the test sets by hand: ``clock = ManualClock(t)``, ``clock()`` reads it, ``clock.t += s`` moves it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ManualClock:
    t: float = 0.0  # seconds

    def __call__(self) -> float:
        return self.t
