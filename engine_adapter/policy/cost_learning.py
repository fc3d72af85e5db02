"""A cost model that keeps learning from the engine's own steps.

Contract: ``CostLearner(base, drafter_runs_model, learns_profiling=True, fit_weight_samples)``:
``base`` is the model to start from (a shipped prior scaled to this machine,
``cost_prior.scale_prior``; a profile measured by this launch or cached by an earlier one); steps
that carry the profiler's requests are learned with ``learns_profiling`` (a shipped prior's
timed cells), and over any base where all of them measure a cell in idle time
(``records.is_idle_measure_request``); never a profile's own steps. ``learn(steps)``
takes the engine's steps of one engine, in the order they ran (each counted once however often
passed: by ``seq``) and keeps, per (batch size, K) cell, the tokens and step period (the tap's
``interval_s``, as the profiler times its cells) of the steps ``counts`` admits: decode steps
of the steady loop, the last ``MAX_KEPT`` of each. It returns a new fit when a cell reached
``MIN_LEARN_SAMPLES`` steps or grew since the last fit, else None: the base's cells, scaled by
the learned ones
(``cost_prior.scale_prior``: a cell not yet reached follows the machine the others measured),
with every learned cell in place of the base's own for the same (batch size, K), each weighted
by its steps (the base's count as ``BASE_SAMPLES``) up to ``fit_weight_samples`` in the fit of the
straight lines, all of them in the per-K factor (``cost_model.CostModel.k_factor``): the lines
take the machine's shape from every cell, and what a K costs over them (a CPU's top draft
passes) stays at that K; two heavy cells off the per-pass line, weighed by all their steps,
would tilt the lines and misprice every K between them (``scripts/cost_learning_eval.py``).
``learned_steps`` and ``learned_cells`` say how much it rests on. ``unreached(cells)`` lists the
cells with fewer than ``MIN_LEARN_SAMPLES`` steps learned (traffic's or idle time's): what idle time
may measure (``live_state.LivePolicy.fill_left``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from statistics import median

from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.cost_prior import scale_prior
from engine_adapter.records import EngineStep, is_idle_measure_request

MIN_LEARN_SAMPLES = 8  # steps before a cell counts (a CPU step's time varies 5-10 %)
MAX_KEPT = 400  # steps kept per cell: the newest describe the machine as it is
BASE_SAMPLES = 4  # the weight of each of the base's cells (a profile's cell holds 4-8 steps)
FIT_WEIGHT_SAMPLES = 8  # a learned cell's steps counted in the lines' fit (twice a base cell's)
MAX_INTERVAL_OVER_WALL = 2.0  # a step whose period is longer than this many times its own time followed idle time


class CostLearner:
    def __init__(
        self,
        base: CostModel,
        drafter_runs_model: bool,
        learns_profiling: bool = True,
        fit_weight_samples: int | None = FIT_WEIGHT_SAMPLES,
    ) -> None:
        self.base = base
        self.fit_weight_samples = fit_weight_samples  # None: a learned cell weighs all its steps in the fit
        self.drafter_runs_model = drafter_runs_model
        self._cells: dict[tuple[int, int], collections.deque[tuple[int, float]]] = {}  # (tokens, seconds)
        self._added: collections.Counter[tuple[int, int]] = collections.Counter()  # steps ever added, per cell
        self._fitted: dict[tuple[int, int], int] = {}  # ... as of the last fit
        self.learns_profiling = learns_profiling
        self._last_seq = -1
        self.learned_steps = 0
        self.learned_cells = 0  # cells with MIN_LEARN_SAMPLES steps in the last fit (the page reads it)

    @staticmethod
    def counts(step: EngineStep) -> bool:
        """A decode step of the engine's steady loop: no prefill chunk in it, drafts within K, and
        no idle time before it (``interval_s`` runs from the end of the step before, which may
        have been seconds earlier: then it is no step period)."""
        b, k = step.batch_size, step.k
        return b > 0 and 0 < step.interval_s <= MAX_INTERVAL_OVER_WALL * step.wall_s and step.num_tokens <= b * (k + 1)

    def learns_from(self, step: EngineStep) -> bool:
        """Whether the step may teach the model: one without the profiler's requests always; one
        with them where ``learns_profiling``, or where each of them (counted with the skipped ones,
        which ``requests`` leaves out) is among ``requests`` and measures a cell in idle time."""
        if not step.profiling_requests or self.learns_profiling:
            return True
        return sum(1 for r in step.requests if is_idle_measure_request(r.request_id)) == step.profiling_requests

    def unreached(self, cells: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """The (batch size, K) cells, in the order given, with fewer than ``MIN_LEARN_SAMPLES`` steps learned."""
        return [cell for cell in cells if self._added[cell] < MIN_LEARN_SAMPLES]

    def learn(self, steps: Iterable[EngineStep]) -> CostModel | None:
        for s in steps:  # in the order they ran (``steps_since``): each one once
            if s.seq <= self._last_seq:
                continue
            self._last_seq = s.seq
            if self.counts(s) and self.learns_from(s):
                cell = (s.batch_size, s.k)
                self._cells.setdefault(cell, collections.deque(maxlen=MAX_KEPT)).append((s.num_tokens, s.interval_s))
                self._added[cell] += 1
                self.learned_steps += 1
        ready = {cell: n for cell, n in self._added.items() if n >= MIN_LEARN_SAMPLES}
        if not ready or ready == self._fitted:
            self.learned_cells = len(ready)
            return None
        self._fitted = ready
        learned = [
            CostPoint(
                b,
                k,
                int(median(n for n, _ in self._cells[(b, k)])),
                median(t for _, t in self._cells[(b, k)]),
                len(self._cells[(b, k)]),
            )
            for b, k in ready
        ]
        rescaled, *_ = scale_prior(self.base, learned)  # the cells not learned follow the ones learned
        kept = [
            CostPoint(p.batch_size, p.k, p.num_tokens, p.step_s, BASE_SAMPLES)
            for p in rescaled.points
            if (p.batch_size, p.k) not in ready
        ]
        points = sorted([*kept, *learned], key=lambda p: (p.batch_size, p.k))
        fitted = fit_cost_model(points, self.drafter_runs_model, self.base.capture_sizes, self.fit_weight_samples)
        self.learned_cells = len(ready)  # once the fit exists: the page reads the two together
        return fitted
