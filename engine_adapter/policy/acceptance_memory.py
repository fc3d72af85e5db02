"""The acceptance the cost-model policies read: a window's where it measured enough, else memory.

Contract: ``AcceptanceMemory`` holds, per draft position, the acceptance a launch started from
(``profiled``: the profile's drafts, a shipped prior's, the cache's; ``start_from``) and the one
last remembered. ``alphas(window)`` reads a window of engine steps' counts: at a position the
window tested ``MIN_REACHED`` times its own estimate, else the remembered one; positions never
measured inherit the position before (position 1: the 0.5 guess of ``alphas_from_counts``, before
anything was measured). ``remember(window, new)`` keeps what ``alphas`` reads now, for when a window
holds no drafts; at a position the window tested fewer than ``MIN_REACHED`` times, the drafts of
``new`` (the window's steps not passed before: each step counts once) move the memory, weighed
against ``MIN_REACHED`` drafts' worth of it (a short request at a high K, 13 steps, tells what its
text accepts without waiting for a full window); positions neither refreshed fade toward
``profiled`` with the time constant ``MEMORY_FADE_S`` (so a spell of hard text that put K at 0
everywhere does not keep it there for good). ``known(counts)``: the per-position acceptance a set
of counts measured, up to the first position it never tested (what ``start_from`` takes).

Why a memory at all: under the 0.5 guess the auto table chooses K=0 at every batch size on the
packaged pair, and a launch that never drafts never measures anything to correct it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from engine_adapter.acceptance import PositionCounts, alphas_from_counts, fade_toward, remembered_alphas

MIN_REACHED = 16  # a window's acceptance at a draft position replaces the remembered one once tested this often
MEMORY_FADE_S = 300.0  # time constant, seconds: an unrefreshed memory returns toward the launch's acceptance


def known(counts: PositionCounts) -> list[float]:
    """Per draft position, the acceptance ``counts`` measured, every position tested at least once
    up to the first never tested (a guess is not a measurement; a launch's few drafts at a deep
    position still beat inheriting the position before)."""
    return remembered_alphas([], counts.accepted, counts.reached, MIN_REACHED)


@dataclass
class AcceptanceMemory:
    """Per draft position: where the memory fades back to, and what it remembers since when."""

    profiled: list[float] = field(default_factory=list)
    remembered: list[float] = field(default_factory=list)
    remembered_t: float = field(default_factory=time.monotonic)

    def start_from(self, profiled: list[float]) -> None:
        """A launch's (or a new profile's) acceptance: faded back to, and remembered from now."""
        self.profiled = list(profiled)
        self.remembered, self.remembered_t = list(profiled), time.monotonic()

    def alphas(self, window: PositionCounts) -> list[float]:
        """Per draft position: ``window``'s acceptance where it tested the position ``MIN_REACHED``
        times, else the remembered."""
        kept = remembered_alphas(self.remembered, window.accepted, window.reached, MIN_REACHED)
        return alphas_from_counts([0] * len(window.reached), [0] * len(window.reached), memory=kept)

    def remember(self, window: PositionCounts, new: PositionCounts | None = None) -> None:
        """Keep what ``alphas(window)`` reads now, with ``new``'s drafts (steps of ``window`` not passed
        before) where the window tested a position too few times to read on its own; positions
        neither refreshed fade toward ``profiled`` by the time since the last call."""
        now = time.monotonic()
        kept = remembered_alphas(self.remembered, window.accepted, window.reached, MIN_REACHED)
        fresh = new or PositionCounts(len(window.reached))
        few = [i < len(self.remembered) and r < MIN_REACHED for i, r in enumerate(window.reached)]
        kept = [
            (fresh.accepted[i] + MIN_REACHED * m) / (fresh.reached[i] + MIN_REACHED) if few[i] else m
            for i, m in enumerate(kept)
        ]
        refreshed = [r >= MIN_REACHED or n > 0 for r, n in zip(window.reached, fresh.reached)]
        share = 1.0 - math.exp(-(now - self.remembered_t) / MEMORY_FADE_S)
        self.remembered, self.remembered_t = fade_toward(kept, self.profiled, refreshed, share), now
