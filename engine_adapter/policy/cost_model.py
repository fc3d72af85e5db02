"""Step-time cost model, measured: how long one engine step takes for a batch.

Contract: ``CostPoint`` is one measured cell (batch size, K in force, tokens
verified per step, median step seconds); ``fit_cost_model(points)`` fits

    step_s(b, K) = verify_s(b * (K + 1)) + draft_cost_s(b, K)
    verify_s(n)  = base_s + slope_s * max(0, pad(n) - knee_tokens)
    draft_cost_s(b, K) = [K > 0] * (first_s + first_s_per_req * b)
                       + max(K - 1, 0) * (draft_s + draft_s_per_req * b)

i.e. a flat, memory-bound region (reading the weights once costs the same for
1 or ``knee_tokens`` tokens) then a rising, compute-bound one, plus the draft
model's own passes (0 for ngram/suffix drafting): its first pass, which yields
the first draft and which an idle drafter skips at K=0 (``idle_drafter.py``;
vLLM's own drafter runs it at any K, so there it is part of ``verify_s`` and
``first_s`` fits to ~0), and one sequential pass per further position. ``step_s`` answers
with the fitted curve everywhere, measured cells included: a cell's median carries its own
noise (5-10 % per step on a CPU), and a policy that read cells where they exist and the
curve between them zig-zagged in K from one batch size to the next. What the straight lines
cannot hold (a K whose steps cost more than the per-pass line says, as a draft pass's cost
moves on a CPU) its cells say through ``k_factor``: the fitted curve at each K is scaled by
that K's cells' measured/fitted ratio (steps-weighted, over all batch sizes alike, so the
curve keeps its shape in the batch size), shrunk toward 1 as if ``K_SHRINK_STEPS`` steps had
read the fit: one 4-step cell moves it a third of the way, hundreds of learned steps
all of it. A K with no cells takes the factor interpolated between its measured neighbours
(above the highest, the highest's), and step time never falls as K rises. The knee is chosen
by least squares over the measured token counts, so a CPU (knee near a handful
of tokens) and a GPU (hundreds) go through the same code.

Where the engine pads steps (a GPU with CUDA graphs: a step of n tokens runs the graph
captured for the smallest size >= n, and costs what that graph costs), ``capture_sizes``
holds the captured sizes (tokens per step, ascending) and ``verify_s`` first rounds the
verified tokens up to the next of them (``padded_tokens``; past the largest the step
runs unpadded), so step time is a staircase under the hinge; the fit reads the cells'
padded token counts. With no capture sizes (CPU, eager mode) nothing is padded.

Units: seconds, tokens per step. Pure numpy; no vLLM, no UI.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from statistics import median
from typing import Any

import numpy as np

K_SHRINK_STEPS = 8  # a K's cells move its curve as if this many more steps had read the fit there


@dataclass(frozen=True, slots=True)
class CostPoint:
    batch_size: int
    k: int  # K in force (num_spec_tokens_to_schedule)
    num_tokens: int  # tokens verified per step (median), ~ batch_size * (K + 1)
    step_s: float  # median seconds per engine step
    samples: int = 1


@dataclass(frozen=True)
class CostModel:
    base_s: float  # verify cost in the flat region, s
    slope_s: float  # extra s per verified token beyond the knee
    knee_tokens: float  # tokens per step where compute starts to bind
    draft_s: float = 0.0  # drafter's cost per draft position per step, s
    draft_s_per_req: float = 0.0  # ... and per position per request, s
    first_s: float = 0.0  # drafter's first pass when K > 0 (skipped at K = 0 by an idle drafter), s
    first_s_per_req: float = 0.0  # ... and per request, s
    points: tuple[CostPoint, ...] = field(default_factory=tuple)
    rmse_s: float = 0.0  # fit error over the points, s
    # tokens per step CUDA graphs were captured for, ascending (a step is padded up to the next);
    # () = no padding (CPU, eager mode)
    capture_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:  # any sequence in, a sorted tuple kept (hashable, from JSON lists too)
        object.__setattr__(self, "capture_sizes", tuple(sorted({int(s) for s in self.capture_sizes})))

    def padded_tokens(self, num_tokens: float) -> float:
        """The tokens a step of ``num_tokens`` costs as: ``padded_tokens`` of the capture sizes."""
        return padded_tokens(num_tokens, self.capture_sizes)

    def verify_s(self, num_tokens: float) -> float:
        n = self.padded_tokens(num_tokens)
        return self.base_s + self.slope_s * max(0.0, n - self.knee_tokens)

    def draft_cost_s(self, batch_size: int, k: int) -> float:
        """The drafter's passes that depend on K: the first (yielding the first draft; vLLM's
        drafter runs it at K=0 too, to keep its KV cache in step (docs/k-policies.md); an idle one
        does not) and one more sequential pass per further position."""
        first = (self.first_s + self.first_s_per_req * batch_size) if k > 0 else 0.0
        return first + max(k - 1, 0) * (self.draft_s + self.draft_s_per_req * batch_size)

    def fit_step_s(self, batch_size: int, k: int) -> float:
        return self.verify_s(batch_size * (k + 1)) + self.draft_cost_s(batch_size, k)

    def step_s(self, batch_size: int, k: int) -> float:
        """Seconds per step with ``batch_size`` requests drafting K each: the fitted curve scaled by
        ``k_factor`` (the module docstring says why not the measured cell), never below a smaller K's."""
        return self.step_s_by_k(batch_size, k)[k]

    def step_s_by_k(self, batch_size: int, k_max: int) -> list[float]:
        """``step_s(batch_size, K)`` for K = 0..k_max, in one pass (a running maximum over K)."""
        out: list[float] = []
        for j in range(k_max + 1):
            scaled = self.fit_step_s(batch_size, j) * self.k_factor(j)
            out.append(max(scaled, out[-1]) if out else scaled)
        return out

    def k_factor(self, k: int) -> float:
        """How much K's steps cost over the fitted curve, by the cells (1: none measured)."""
        by_k = self._k_factor_by_k  # each K interpolated once: the policies ask per batch size and K
        if k not in by_k:
            known = self._k_factors
            ks = sorted(known)
            by_k[k] = float(np.interp(k, ks, [known[j] for j in ks])) if known else 1.0  # flat past the ends
        return by_k[k]

    @cached_property
    def _k_factor_by_k(self) -> dict[int, float]:
        """``k_factor``'s answers so far (filled as asked)."""
        return {}

    @cached_property
    def _k_factors(self) -> dict[int, float]:
        """Per measured K: sum(samples x measured) / sum(samples x fitted), shrunk by ``K_SHRINK_STEPS``."""
        sums: dict[int, list[float]] = {}
        for p in self.points:
            fitted = self.fit_step_s(p.batch_size, p.k)
            if fitted > 0 and p.step_s > 0 and p.samples > 0:
                acc = sums.setdefault(p.k, [0.0, 0.0, 0.0])
                acc[0] += p.samples * p.step_s
                acc[1] += p.samples * fitted
                acc[2] += p.samples
        return {k: 1.0 + (m / f - 1.0) * n / (n + K_SHRINK_STEPS) for k, (m, f, n) in sums.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = [asdict(p) for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CostModel:
        """``to_dict``'s inverse; a dict saved before ``capture_sizes`` existed loads unpadded."""
        pts = tuple(CostPoint(**p) for p in d.get("points", ()))
        return cls(**{k: v for k, v in d.items() if k != "points"}, points=pts)


def padded_tokens(num_tokens: float, capture_sizes: Sequence[int]) -> float:
    """The smallest of ``capture_sizes`` (ascending, tokens) at or above ``num_tokens``; ``num_tokens``
    itself past the largest or with none (the step then runs without a graph, unpadded)."""
    i = bisect_left(capture_sizes, num_tokens)
    return capture_sizes[i] if i < len(capture_sizes) else num_tokens


def points_from_steps(steps: Iterable[tuple[int, int, int, float]], min_samples: int = 3) -> list[CostPoint]:
    """Group (batch_size, k, num_tokens, step_s) observations into median cells.

    Only pure decode steps belong here (``num_tokens <= batch_size * (k + 1)``):
    a prefill chunk in the step would charge its prompt to the wrong cell.
    """
    cells: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for b, k, n, s in steps:
        if b > 0 and s > 0 and n <= b * (k + 1):
            cells.setdefault((b, k), []).append((n, s))
    return [
        CostPoint(b, k, int(median(n for n, _ in obs)), median(s for _, s in obs), len(obs))
        for (b, k), obs in sorted(cells.items())
        if len(obs) >= min_samples
    ]


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0 (drop a negative column, refit)."""
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        active.pop(int(np.argmin(sol)))
    return coef


def fit_cost_model(
    points: Sequence[CostPoint],
    drafter_runs_model: bool = False,
    capture_sizes: Sequence[int] = (),
    max_weight_samples: int | None = None,
) -> CostModel:
    """Fit the hinge (and drafter) model to measured cells, their tokens padded up to ``capture_sizes``
    (tokens per step; () = none); see the module docstring. A cell weighs sqrt(samples) in the fit,
    its samples counted up to ``max_weight_samples`` where given (``k_factor`` reads them all)."""
    if not points:
        raise ValueError("no measured steps to fit a cost model to")
    sizes = tuple(sorted(set(capture_sizes)))
    n = np.array([padded_tokens(p.num_tokens, sizes) for p in points], dtype=float)
    y = np.array([p.step_s for p in points], dtype=float)
    k = np.array([p.k for p in points], dtype=float)
    b = np.array([p.batch_size for p in points], dtype=float)
    samples = [p.samples if max_weight_samples is None else min(p.samples, max_weight_samples) for p in points]
    w = np.sqrt(np.array(samples, dtype=float))  # cells with more steps weigh more
    best: tuple[float, float, np.ndarray] | None = None
    for knee in sorted({0.0, *n.tolist()}):
        cols = [np.ones_like(n), np.maximum(0.0, n - knee)]
        if drafter_runs_model:  # see draft_cost_s
            extra = np.maximum(k - 1, 0)
            first = (k > 0).astype(float)
            cols += [extra, extra * b, first, first * b]
        coef = _nonneg_lstsq(np.stack(cols, axis=1), y, w)
        resid = np.stack(cols, axis=1) @ coef - y
        err = float(np.sqrt(np.mean(resid**2)))
        if best is None or err < best[0] - 1e-12:
            best = (err, knee, coef)
    err, knee, coef = best
    draft = coef[2:] if drafter_runs_model else np.zeros(4)
    return CostModel(
        base_s=float(coef[0]),
        slope_s=float(coef[1]),
        knee_tokens=float(knee),
        draft_s=float(draft[0]),
        draft_s_per_req=float(draft[1]),
        first_s=float(draft[2]),
        first_s_per_req=float(draft[3]),
        points=tuple(points),
        rmse_s=err,
        capture_sizes=sizes,
    )
