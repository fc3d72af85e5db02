"""Cost models shipped with the project, per CPU kind and dtype, and their scaling to this machine.

Contract: a shipped prior is a JSON file in ``cost_priors_dir()`` (``cost_priors/`` beside the
packages; ``SPEC_EXPLORER_COST_PRIORS`` names another folder): ``{"key": prior_key(...),
"measured": {where and how it was measured}, "cost": CostModel.to_dict(), "acceptance":
{"accepted": [...], "reached": [...]}}``, written by ``write_prior`` from a profile
(``scripts/ship_cost_prior.py``).

- ``prior_key(config, platform)``: what a prior must match to stand for an engine: the models by
  name, the method, the dtype, the CPU kind (``engine_config.cpu_kind``), whether the CPU has AMX,
  K's range, the cores the worker leaves free, the idle drafter and the batch limit. A GPU engine
  has none (None).
- ``find_prior(config, platform)``: the matching ``ShippedPrior`` (its fitted ``cost``, its
  ``acceptance`` and a ``label`` for the page), or None; where none was measured with the same
  matrix unit (AMX: a batch's step costs far less against one request's than without it), the
  same CPU kind's other one.
- ``kind_shape(config, platform)``: the step times of a prior shipped for this CPU kind and
  dtype, for any models: what a profile of models with no prior weighs its cells by.
- ``timing_grid(k_max, k_first)``: the cells timed at start to scale a prior to this machine (one
  request at ``first_request_k``, the unscaled prior's own choice for one request, else
  min(3, k_max); then K = 0: seconds, not minutes); ``scale_prior(cost, timed)``
  returns the prior with its verification terms scaled by the K=0 cells' measured/predicted
  ratio and its drafter terms by what the K>0 cells leave for them (with no K=0 cell, both by the
  K>0 cells' own ratio; medians, each clamped to ``SCALE_RANGE``), its points scaled alike, with
  the two factors.
- ``save_timing(path, prior, points, acceptance)`` / ``load_timing(path, prior)``: the cells a
  launch timed, kept beside the cost cache (``timing_cache_path``) for the prior they scaled
  (``prior_digest``: its cells and acceptance), so a later launch on the same machine scales the
  same prior without timing again (a ``CachedTiming``; None for another prior, a missing or
  malformed file). ``save_timing`` returns False where the file could not be written (the launch
  goes on; the next one times again). ``covers(points, grid)``: whether timed cells hold every
  cell of the grid (a timing cut short is not kept).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import median
from typing import Any

from engine_adapter.acceptance import PositionCounts
from engine_adapter.engine.models import write_cache_file
from engine_adapter.engine.platform import Platform, machine_facts
from engine_adapter.engine_config import EngineConfig, cpu_flags, cpu_kind, resolve_dtype, variant_key
from engine_adapter.package_data import data_path
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.k_policy import one_request_outlook
from engine_adapter.policy.profile_grid import ProfileGrid
from engine_adapter.policy.profiler import acceptance_from_dict, acceptance_to_dict

PRIORS_ENV = "SPEC_EXPLORER_COST_PRIORS"
TIMING_SUFFIX = ".timing.json"  # beside the cost cache's own file: the cells timed against a prior
SCALE_RANGE = (0.25, 4.0)  # a machine slower or faster than this is not the prior's kind: clamped
TIMING_K = 3
AMX_FLAGS = frozenset({"amx_bf16", "amx_int8", "amx_tile"})  # a matrix unit: batched steps far cheaper


@dataclass(frozen=True)
class ShippedPrior:
    cost: CostModel
    acceptance: PositionCounts | None
    label: str  # "AVX-512 BF16, bfloat16, measured ..." for the page


def cost_priors_dir() -> Path:
    override = os.environ.get(PRIORS_ENV, "").strip()
    return Path(override) if override else data_path("cost_priors")


def _model_name(spec: str) -> str:
    """A model by name, not by where it lies: a folder's name, a hub id or packaged spec as given."""
    path = Path(spec).expanduser()
    return path.name if path.is_dir() else spec


def prior_key(config: EngineConfig, platform: Platform, flags: frozenset[str] | None = None) -> dict[str, Any] | None:
    """What a prior stands for (None on a GPU or without live policies); ``flags``: this CPU's."""
    if platform.is_gpu or not config.live_policies:
        return None
    flags = cpu_flags() if flags is None else flags
    return variant_key(config.variant) | {
        "target": _model_name(config.target),
        "draft": _model_name(config.draft) if config.method == "draft" else None,
        "method": config.method,
        "dtype": resolve_dtype(config.dtype, on_cpu=True, flags=flags),
        "cpu_kind": cpu_kind(flags),
        "amx": bool(flags & AMX_FLAGS),
        "k_max": config.k_max,
        "reserved_cpus": config.reserved_cpus,
        "idle_drafter": config.drafter_idles,
        "max_num_seqs": config.max_num_seqs,
    }


def _kind_key(key: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in key.items() if k != "amx"}


def _shipped(
    folder: Path, drafter_runs_model: bool, wanted: Callable[[dict[str, Any]], bool]
) -> Iterator[tuple[dict[str, Any], ShippedPrior]]:
    """Each prior in ``folder`` whose key is ``wanted``, with its key, refitted (the fit may have
    changed, not the data); a file that does not parse is passed over."""
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.json")):
        try:
            saved = json.loads(path.read_text())
            saved_key = saved.get("key") or {}
            if not wanted(saved_key):
                continue
            kept = CostModel.from_dict(saved["cost"])
            cost = fit_cost_model(kept.points, drafter_runs_model=drafter_runs_model)
            acceptance = acceptance_from_dict(saved["acceptance"]) if saved.get("acceptance") else None
            prior = ShippedPrior(cost, acceptance, _label(saved_key, saved.get("measured", {})))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        yield saved_key, prior


def find_prior(
    config: EngineConfig, platform: Platform, folder: Path | None = None, flags: frozenset[str] | None = None
) -> ShippedPrior | None:
    """The prior for ``prior_key``: one measured with the same matrix unit (AMX or none) first,
    else the same CPU kind's other one (scaled like any other)."""
    key = prior_key(config, platform, flags)
    if key is None:
        return None
    found = [
        (saved_key.get("amx", False) != key["amx"], prior)
        for saved_key, prior in _shipped(
            folder or cost_priors_dir(), config.method == "draft", lambda saved: _kind_key(saved) == _kind_key(key)
        )
    ]
    return min(found, key=lambda f: f[0])[1] if found else None


def kind_shape(
    config: EngineConfig, platform: Platform, folder: Path | None = None, flags: frozenset[str] | None = None
) -> CostModel | None:
    """Step times shipped for this CPU kind and dtype, for any models: how a profile with no cost
    model in force weighs its cells until it has measured two batch sizes
    (``profiler.cell_shares``); the same matrix unit first, then the same method. None on a GPU,
    or where nothing was shipped for the kind."""
    key = prior_key(config, platform, flags)
    if key is None:
        return None

    def same_kind(saved: dict[str, Any]) -> bool:
        return (saved.get("cpu_kind"), saved.get("dtype")) == (key["cpu_kind"], key["dtype"])

    found = [
        ((saved_key.get("amx", False) != key["amx"], saved_key.get("method") != key["method"]), prior.cost)
        for saved_key, prior in _shipped(folder or cost_priors_dir(), config.method == "draft", same_kind)
    ]
    return min(found, key=lambda f: f[0])[1] if found else None


def _label(key: dict[str, Any], measured: dict[str, Any]) -> str:
    where = measured.get("hardware", "a machine of that kind")
    when = measured.get("date", "")
    kind = f"{key['cpu_kind']}{' with AMX' if key.get('amx') else ''}"
    return f"shipped for {kind} in {key['dtype']} (measured on {where}{', ' + when if when else ''})"


def write_prior(
    path: Path,
    config: EngineConfig,
    platform: Platform,
    cost: CostModel,
    acceptance: PositionCounts | None,
    flags: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Write the prior a profile of ``config`` on this machine (``flags``: its CPU's) makes; returns
    what was written."""
    key = prior_key(config, platform, flags)
    if key is None:
        raise ValueError("a prior is for a CPU engine with live policies (k_max)")
    facts = machine_facts(config.dtype)
    saved = {
        "key": key,
        "measured": {"hardware": f"{facts['cpu']}, {facts['cores']} cores", "date": time.strftime("%Y-%m-%d")},
        "cost": cost.to_dict(),
        "acceptance": acceptance_to_dict(acceptance) if acceptance else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved, indent=1) + "\n")
    return saved


def timing_grid(k_max: int, k_first: int | None = None) -> ProfileGrid:
    """One request at K = ``k_first`` (``first_request_k``: the K the unscaled prior gives one
    request), else ``TIMING_K``, within 1..``k_max``; then K = 0."""
    k = TIMING_K if k_first is None else k_first
    return ProfileGrid((1,), (min(max(1, k), k_max), 0))


def first_request_k(prior: ShippedPrior, alphas: Sequence[float], k_max: int) -> int | None:
    """The K the unscaled prior chooses for one request with ``alphas`` (``k_policy.one_request_outlook``;
    at least 1): the K the first request most likely runs, the drafting cell worth timing, since a
    draft pass's cost is not the same at every K on a CPU (docs/k-policies.md). None without
    acceptance to choose by."""
    outlook = one_request_outlook(prior.cost, alphas, k_max) if alphas else None
    return None if outlook is None else outlook.k


def _ratio(new: float, old: float) -> float:
    return new / old if old > 0 else 1.0


def _clamp(x: float) -> float:
    return min(max(x, SCALE_RANGE[0]), SCALE_RANGE[1])


def scale_prior(cost: CostModel, timed: list[CostPoint]) -> tuple[CostModel, float, float]:
    """The prior scaled to this machine by timed cells (``timing_grid``'s, or any measured ones), and
    the verification and drafter factors: the median measured/predicted ratio of the K=0 cells, and
    of what the K>0 cells leave for the drafter's passes. With no K=0 cell both take the K>0 cells'
    median measured/predicted step (a drafting step's time cannot say which part moved, and a
    machine slower or faster as a whole is the likelier: ``scripts/cost_learning_eval.py``); with
    no drafting cell the drafter's factor stays 1."""
    plain = [
        p.step_s / cost.fit_step_s(p.batch_size, 0) for p in timed if p.k == 0 and cost.fit_step_s(p.batch_size, 0) > 0
    ]
    drafting = [p for p in timed if p.k > 0 and cost.fit_step_s(p.batch_size, p.k) > 0]
    if not plain and drafting:
        verify = draft = _clamp(median(p.step_s / cost.fit_step_s(p.batch_size, p.k) for p in drafting))
    else:
        verify = _clamp(median(plain)) if plain else 1.0
        drafted = []
        for p in drafting:
            predicted = cost.draft_cost_s(p.batch_size, p.k)
            if predicted > 0:  # nothing left for the drafter: the smallest factor (clamped)
                drafted.append(max(p.step_s - verify * cost.verify_s(p.num_tokens), 0.0) / predicted)
        draft = _clamp(median(drafted)) if drafted else 1.0
    scaled = replace(
        cost,
        base_s=cost.base_s * verify,
        slope_s=cost.slope_s * verify,
        draft_s=cost.draft_s * draft,
        draft_s_per_req=cost.draft_s_per_req * draft,
        first_s=cost.first_s * draft,
        first_s_per_req=cost.first_s_per_req * draft,
    )
    points = tuple(
        replace(p, step_s=p.step_s * _ratio(scaled.fit_step_s(p.batch_size, p.k), cost.fit_step_s(p.batch_size, p.k)))
        for p in cost.points
    )
    return replace(scaled, points=points), verify, draft


@dataclass(frozen=True)
class CachedTiming:
    points: list[CostPoint]  # the cells timed against the prior
    acceptance: PositionCounts | None  # the timing's own drafts (what a prior without acceptance starts from)
    date: str  # when they were timed, for the page


def prior_digest(prior: ShippedPrior) -> str:
    """The prior's cells and acceptance, hashed: a timing is kept for exactly the prior it scaled
    (the cells timed depend on both: the drafting cell's K is the prior's choice for one request)."""
    shipped = {
        "points": [asdict(p) for p in prior.cost.points],
        "acceptance": acceptance_to_dict(prior.acceptance) if prior.acceptance is not None else None,
    }
    return hashlib.sha256(json.dumps(shipped, sort_keys=True).encode()).hexdigest()[:16]


def covers(points: Sequence[CostPoint], grid: ProfileGrid) -> bool:
    """Whether ``points`` hold every (batch size, K) cell of ``grid``."""
    return {(p.batch_size, p.k) for p in points} >= set(grid.cells)


def timing_cache_path(cost_cache: Path) -> Path:
    """Where the timing of a prior lies, beside ``cost_cache`` (``profiler.config_cache_path``)."""
    return cost_cache.with_name(cost_cache.stem + TIMING_SUFFIX)


def save_timing(
    path: Path, prior: ShippedPrior, points: Sequence[CostPoint], acceptance: PositionCounts | None
) -> bool:
    saved = {
        "prior": prior_digest(prior),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "points": [asdict(p) for p in points],
        "acceptance": acceptance_to_dict(acceptance) if acceptance is not None else None,
    }
    try:
        write_cache_file(path, json.dumps(saved, indent=1))
        return True
    except OSError:
        return False


def load_timing(path: Path, prior: ShippedPrior) -> CachedTiming | None:
    try:
        saved = json.loads(path.read_text())
        if saved.get("prior") != prior_digest(prior):
            return None
        points = [
            CostPoint(int(p["batch_size"]), int(p["k"]), int(p["num_tokens"]), float(p["step_s"]), int(p["samples"]))
            for p in saved["points"]
        ]
        acceptance = acceptance_from_dict(saved["acceptance"]) if saved.get("acceptance") else None
        return CachedTiming(points, acceptance, str(saved.get("date", ""))) if points else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
