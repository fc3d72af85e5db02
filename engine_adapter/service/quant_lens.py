"""The quantisation lens: the speedup probe's figures kept per model variant and load, set side by side.

Contract: ``lens_machine(process, config)`` is a started engine's ``LensMachine``;
``QuantLens()``; ``take(view, machine)`` keeps a finished speedup measurement (``SpeedupView``
in state "done", its settings naming the variant and the load) as a ``LensPoint``, with the
variant's roofline (``LensMachine``: the read bandwidth on the worker's cores and the bytes one
plain step of its target reads); taking the same view twice keeps one. The newest point per
(variant, load) is kept. ``view(variant, load)`` is a ``LensView``: every point, and for each
quantised variant measured at a load where the full pair was measured too a ``LensComparison``:

- ``quant_gain``: the variant's plain decoding over the full pair's (per request, decode rates);
- ``spec_gain``: the full pair's speedup (the policy over plain, the probe's median per kind);
- ``product``: what multiplying the two predicts; ``measured``: the variant's speculative decode
  rate over the full pair's plain one: what the two give together;
- ``agreement``: plain decoding's greedy text of the variant against the full pair's, the same
  prompts (``provenance.text_agreement`` over the shorter length, mean over task kinds): the
  quantised target's own difference, apart from speculation's guarantee (which the lossless
  check tests against the target that runs).

All rates are per request, tokens/s, from the probe (``service.speedup_probe``): plain decoding
is the same engine at K=0, under the same background load.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine_adapter.engine.roofline import bytes_read_per_step
from engine_adapter.engine_config import FULL_VARIANT, MODEL_VARIANTS, EngineConfig, resolve_dtype
from engine_adapter.provenance import text_agreement
from engine_adapter.service.speedup_probe import SpeedupView

if TYPE_CHECKING:
    from engine_adapter.engine.launcher import EngineProcess


@dataclass(frozen=True)
class LensMachine:
    bandwidth_gbs: float | None  # read bandwidth on the worker's cores (None: not measured)
    bytes_per_step: int  # what one plain decode step of the variant's target reads


def lens_machine(process: EngineProcess | None, config: EngineConfig | None) -> LensMachine | None:
    """The roofline figures of a started engine (None: an attached server, no process of ours)."""
    if process is None or process.target_dir is None:
        return None
    dtype = resolve_dtype((config or EngineConfig()).dtype, on_cpu=not process.platform.is_gpu)
    return LensMachine(process.bandwidth_gbs, bytes_read_per_step(process.target_dir, dtype))


@dataclass(frozen=True)
class LensPoint:
    variant: str
    load: int  # background requests in flight when measured
    # per request, the median over task kinds of the probe's medians (a kind whose short answer
    # read an outlying decode rate moves a mean, not the median)
    plain_tokens_per_s: float
    policy_tokens_per_s: float
    speedup: float  # the median over task kinds of the probe's median speedups
    bytes_per_step: int
    roofline_tokens_per_s: float | None  # per request: bandwidth / bytes per step
    settings: str  # the probe's settings line
    plain_token_ids: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def roofline_fraction(self) -> float | None:
        return self.plain_tokens_per_s / self.roofline_tokens_per_s if self.roofline_tokens_per_s else None


@dataclass(frozen=True)
class LensComparison:
    variant: str
    load: int
    quant_gain: float
    spec_gain: float
    product: float
    measured: float
    agreement: float | None  # None: no common task kind


@dataclass(frozen=True)
class LensView:
    variant: str  # the variant in force
    load: int  # background requests in flight now
    points: tuple[LensPoint, ...] = ()  # by variant (MODEL_VARIANTS' order), then load
    comparisons: tuple[LensComparison, ...] = ()


def _agreement(a: LensPoint, b: LensPoint) -> float | None:
    theirs = dict(b.plain_token_ids)
    scores = []
    for kind, ids in a.plain_token_ids:
        if kind in theirs:
            n = min(len(ids), len(theirs[kind]))
            scores.append(text_agreement(ids[:n], theirs[kind][:n]))
    return statistics.mean(scores) if scores else None


def compare(full: LensPoint, quantised: LensPoint) -> LensComparison:
    quant_gain = quantised.plain_tokens_per_s / full.plain_tokens_per_s
    return LensComparison(
        variant=quantised.variant,
        load=quantised.load,
        quant_gain=quant_gain,
        spec_gain=full.speedup,
        product=quant_gain * full.speedup,
        measured=quantised.policy_tokens_per_s / full.plain_tokens_per_s,
        agreement=_agreement(quantised, full),
    )


@dataclass
class QuantLens:
    _points: dict[tuple[str, int], LensPoint] = field(default_factory=dict)
    _last: SpeedupView | None = None  # the view kept last (a probe's finished view stays until the next)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # pages' handler threads take and read

    def take(self, view: SpeedupView, machine: LensMachine) -> LensPoint | None:
        """Keep a finished measurement (once); returns its point (None if not one to keep)."""
        with self._lock:
            if view.state != "done" or not view.rows or view.settings is None or view is self._last:
                return None
            self._last = view
        s = view.settings
        plain = statistics.median(r.plain_tokens_per_s for r in view.rows)
        roof = machine.bandwidth_gbs * 1e9 / machine.bytes_per_step if machine.bandwidth_gbs else None
        point = LensPoint(
            variant=s.variant,
            load=s.concurrency,
            plain_tokens_per_s=plain,
            policy_tokens_per_s=statistics.median(r.policy_tokens_per_s for r in view.rows),
            speedup=statistics.median(r.speedup for r in view.rows),
            bytes_per_step=machine.bytes_per_step,
            roofline_tokens_per_s=roof,
            settings=s.line(),
            plain_token_ids=view.plain_token_ids,
        )
        with self._lock:
            self._points[(s.variant, s.concurrency)] = point
        return point

    def view(self, variant: str, load: int) -> LensView:
        order = {v: i for i, v in enumerate(MODEL_VARIANTS)}
        with self._lock:
            known = dict(self._points)
        points = tuple(sorted(known.values(), key=lambda p: (order.get(p.variant, 99), p.load)))
        comparisons = tuple(
            compare(known[(FULL_VARIANT, p.load)], p)
            for p in points
            if p.variant != FULL_VARIANT and (FULL_VARIANT, p.load) in known
        )
        return LensView(variant, load, points, comparisons)
