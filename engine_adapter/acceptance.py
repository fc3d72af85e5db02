"""Acceptance, per draft position: counts, alphas and the per-request estimator.

Contract: pure functions and small state over vLLM's vocabulary, shared by the
plugin (the slot auction's estimator), the policy layer (auto table, profiling),
the app-side client (server-wide counts per engine step) and the explorer's
request card. No I/O, no vLLM.

- ``position_counts(per_step_accepted, per_step_drafted, k)``: (kept, reached) per
  position 1..k; position i is *reached* (tested) when every draft before it was kept;
- ``per_position_acceptance``: kept / reached per position (None where never reached);
- ``alpha_from_histogram``: one per-token alpha from vLLM's ``acceptance_histogram``;
- ``alphas_from_counts`` and ``PositionCounts``: pooled alphas over engine steps, shrunk
  toward a memory of earlier measurements; ``remembered_alphas`` updates that memory and
  ``fade_toward`` lets it return to a baseline (the profile's) where nothing refreshed it;
- ``survival(alphas)``: P(position i is accepted) = prod_{j<=i} alpha_j;
- ``SlotEstimator``: per-request alphas shrunk toward the pool, calibrated scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import mul


def alpha_from_histogram(histogram: Sequence[int], k: int) -> float:
    """Per-token acceptance alpha: accepted over draft positions actually tested.

    A step that accepted j < K drafts tested j + 1 positions (the last one
    failed); a step that accepted all K tested K. So
    alpha = sum j*h[j] / sum h[j]*min(j+1, K). For the vLLM example
    [39, 1, 0, 3] with K=3: 10 / 50 = 0.20.
    """
    tested = sum(h * min(j + 1, k) for j, h in enumerate(histogram))
    accepted = sum(j * h for j, h in enumerate(histogram))
    return accepted / tested if tested else 0.0


def per_position_acceptance(
    per_step_accepted: Sequence[int], per_step_drafted: Sequence[int], k: int
) -> list[float | None]:
    """P(draft at position i is kept | position i was drafted and reached), i = 1..k.

    Position i is reached when the i-1 drafts before it were kept. None where a
    position was never reached.
    """
    kept, reached = position_counts(per_step_accepted, per_step_drafted, k)
    return [kept[i] / reached[i] if reached[i] else None for i in range(k)]


def position_counts(
    per_step_accepted: Sequence[int], per_step_drafted: Sequence[int], k: int
) -> tuple[list[int], list[int]]:
    """(kept, reached) per draft position 1..k over steps: position i is reached
    (tested) when every draft before it was kept; positions beyond k are ignored."""
    reached = [0] * k
    kept = [0] * k
    for acc, drafted in zip(per_step_accepted, per_step_drafted):
        for i in range(min(drafted, acc + 1, k)):
            reached[i] += 1
            if i < acc:
                kept[i] += 1
    return kept, reached


def survival(alphas: Sequence[float]) -> list[float]:
    """[prod_{j<=i} alpha_j for i = 1..len]: P(draft position i is accepted)."""
    return list(accumulate((min(max(a, 0.0), 1.0) for a in alphas), mul))


@dataclass
class SlotEstimator:
    """Per-request acceptance per draft position, shrunk toward all requests',
    and survival scores calibrated against what the verifier then kept.

    alpha_{r,i} = (accepted_{r,i} + m * alpha_i) / (reached_{r,i} + m), where
    alpha_i is the pooled estimate over every request (itself starting from
    ``prior``) and m = ``strength`` pseudo-observations.

    ``scores`` are the survival probabilities prod_{j<=i} alpha_{r,j}, each
    scaled by its position's calibration c_i = (kept_i + n) / (predicted_i + n):
    at every verify step, before counting it, the step's raw survival
    probabilities are added to ``predicted`` and the drafts kept to ``kept``
    (n = ``calibration_strength``). Why: a request's running estimate is
    highest right after a run of accepted drafts, which is when deep positions
    get admitted, so raw scores overpromise exactly where they decide
    (measured, packaged pair, c=1 code: 5.7 tokens per step promised at K=5,
    4.4-4.7 kept). The calibration measures that optimism and takes it out.
    """

    k_max: int
    prior: float = 0.5
    strength: float = 2.0
    calibration_strength: float = 5.0
    pooled_reached: list[int] = field(default_factory=list)
    pooled_accepted: list[int] = field(default_factory=list)
    per_request: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    predicted: list[float] = field(default_factory=list)  # sum of raw survival per position
    kept: list[int] = field(default_factory=list)  # drafts kept per position, same steps

    def __post_init__(self) -> None:
        self.pooled_reached = [0] * self.k_max
        self.pooled_accepted = [0] * self.k_max
        self.predicted = [0.0] * self.k_max
        self.kept = [0] * self.k_max

    def observe(self, request_id: str, num_drafted: int, accepted: int, pooled: bool = True) -> None:
        """One verify step: positions 1..min(accepted+1, drafted) were tested. ``pooled`` False:
        the request's own estimate learns from it, the pool and the calibration do not (drafts an
        idle draft model made across a hole in its KV cache: they say nothing of anyone else's)."""
        n = min(num_drafted, self.k_max)
        if pooled:
            for i, p in enumerate(survival(self.alphas(request_id)[:n])):  # the promise, before this step counts
                self.predicted[i] += p
                self.kept[i] += i < accepted
        reached, acc = self.per_request.setdefault(request_id, ([0] * self.k_max, [0] * self.k_max))
        for i in range(min(accepted + 1, n)):
            reached[i] += 1
            self.pooled_reached[i] += pooled
            if i < accepted:
                acc[i] += 1
                self.pooled_accepted[i] += pooled

    def forget(self, request_id: str) -> None:
        self.per_request.pop(request_id, None)

    def pooled_alphas(self) -> list[float]:
        m = self.strength
        return [(a + m * self.prior) / (r + m) for a, r in zip(self.pooled_accepted, self.pooled_reached)]

    def alphas(self, request_id: str) -> list[float]:
        pooled = self.pooled_alphas()
        if request_id not in self.per_request:
            return pooled
        reached, acc = self.per_request[request_id]
        m = self.strength
        return [(a + m * p) / (r + m) for a, r, p in zip(acc, reached, pooled)]

    def calibration(self) -> list[float]:
        """Kept over promised per position (1.0 before any evidence)."""
        n = self.calibration_strength
        return [(k + n) / (p + n) for k, p in zip(self.kept, self.predicted)]

    def scores(self, request_id: str, k: int) -> list[float]:
        out: list[float] = []
        prev = 1.0
        for s, c in zip(survival(self.alphas(request_id)[:k]), self.calibration()):
            prev = min(s * c, prev)  # a survival probability: at most 1, never rising with depth
            out.append(prev)
        return out


def alphas_from_counts(
    accepted: Sequence[int],
    reached: Sequence[int],
    prior: float = 0.5,
    strength: float = 2.0,
    memory: Sequence[float] = (),
) -> list[float]:
    """Per-position acceptance from pooled counts, each shrunk toward what is known already.

    Position i shrinks toward ``memory[i]`` where there is one (what was measured before:
    counts that have left a time window must not turn a measured acceptance back into a
    guess), else toward the estimate of the position before it: a position never tested (K
    was lower) inherits its predecessor's rather than a made-up number; position 1 shrinks
    toward ``prior``.
    """
    out: list[float] = []
    prev = prior
    for i, (a, r) in enumerate(zip(accepted, reached)):
        toward = memory[i] if i < len(memory) else prev
        prev = (a + strength * toward) / (r + strength)
        out.append(prev)
    return out


def remembered_alphas(
    memory: Sequence[float], accepted: Sequence[int], reached: Sequence[int], min_reached: int
) -> list[float]:
    """The acceptance to remember per position after a window of counts: the window's own
    estimate (``alphas_from_counts`` without the memory, so that remembering a window and reading
    it again agree) where the window tested the position at least ``min_reached`` times, else the
    memory's. A position past the memory is remembered once the window tested it at all; one
    never tested stays unknown (the memory ends there: a guess is not a measurement)."""
    fresh = alphas_from_counts(accepted, reached)
    out: list[float] = []
    for i, (f, r) in enumerate(zip(fresh, reached)):
        if r >= min_reached or (i >= len(memory) and r > 0):
            out.append(f)
        elif i < len(memory):
            out.append(memory[i])
        else:
            break
    return out


def fade_toward(
    memory: Sequence[float], target: Sequence[float], refreshed: Sequence[bool], share: float
) -> list[float]:
    """``memory`` moved ``share`` (0..1) of the way to ``target`` at each position not ``refreshed``
    (a position past ``target`` or past ``refreshed`` stays as it is)."""
    return [
        m + (target[i] - m) * share if i < len(target) and not (i < len(refreshed) and refreshed[i]) else m
        for i, m in enumerate(memory)
    ]


class PositionCounts:
    """Acceptance per draft position pooled over engine steps (``EngineStep.accepted_per_pos``
    and ``reached_per_pos``); positions beyond ``k`` are ignored."""

    def __init__(self, k: int) -> None:
        self.accepted = [0] * k
        self.reached = [0] * k

    def add(self, steps) -> None:
        for s in steps:
            for i, (a, r) in enumerate(zip(s.accepted_per_pos, s.reached_per_pos)):
                if i < len(self.accepted):
                    self.accepted[i] += a
                    self.reached[i] += r

    def alphas(self, memory: Sequence[float] = ()) -> list[float]:
        return alphas_from_counts(self.accepted, self.reached, memory=memory)
