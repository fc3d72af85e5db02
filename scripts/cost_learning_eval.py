"""How well the learned cost model chooses K, on synthetic machines with a known truth.

    .venv/bin/python scripts/cost_learning_eval.py                       # fit weights: all steps, 8, 16
    .venv/bin/python scripts/cost_learning_eval.py --fit-weight-samples all,4,8

The truth is each shipped prior's fitted model (``cost_prior``, both CPU kinds), distorted as CPUs
were measured to distort it (a K's steps dearer than the per-pass line, the drafter or the whole
machine slower or faster). A ``CostLearner`` starts from the undistorted fit, as the app's starts
from its profile, learns from synthetic steps of the truth (5 % noise) at the cells traffic
reaches, and its auto table (``k_policy.derive_auto_table``, batch sizes 1-16, one acceptance at
every position) is scored by the truth: at each batch size the rate of the K it chose over the
best K's rate, the worst batch size kept. Prints one line per case, then each variant's worst
and mean score. Then one request at a time under auto (``ROUNDS`` rounds of ``ROUND_STEPS``
steps at the K the table gives batch size 1, learning after each), by traffic alone and with idle
time's cells around the table's Ks (``live_state.LivePolicy.fill_left``), on each machine: the Ks
it ran and its last K's rate over the best K's. Then a JSON last line. No engine: seconds on any
machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as a script

from engine_adapter.policy.cost_learning import MIN_LEARN_SAMPLES, CostLearner  # noqa: E402
from engine_adapter.policy.cost_model import CostModel, fit_cost_model  # noqa: E402
from engine_adapter.policy.cost_prior import cost_priors_dir  # noqa: E402
from engine_adapter.policy.k_policy import derive_auto_table  # noqa: E402
from engine_adapter.policy.profile_grid import default_grid  # noqa: E402
from engine_adapter.records import EngineStep  # noqa: E402

K_MAX = 5
MAX_BATCH = 16
ACCEPTANCES = (0.6, 0.8, 0.9)
ROUNDS, ROUND_STEPS = 6, 60
Distortion = Callable[[CostModel, int, int], float]  # (line, batch size, K) -> true/line
DISTORTIONS: dict[str, Distortion] = {
    "on the line": lambda m, b, k: 1.0,
    "K=5 30 % dear": lambda m, b, k: 1.3 if k == 5 else 1.0,
    "K=4, 5 20, 30 % dear": lambda m, b, k: {4: 1.2, 5: 1.3}.get(k, 1.0),
    "drafter x1.3": lambda m, b, k: (m.verify_s(b * (k + 1)) + 1.3 * m.draft_cost_s(b, k)) / m.fit_step_s(b, k),
    "drafter x0.8": lambda m, b, k: (m.verify_s(b * (k + 1)) + 0.8 * m.draft_cost_s(b, k)) / m.fit_step_s(b, k),
    "all x1.2": lambda m, b, k: 1.2,
}
TRAFFIC: dict[str, dict[tuple[int, int], int]] = {  # cell -> steps learned
    "(1,3)": {(1, 3): 300},
    "(1,5)": {(1, 5): 300},
    "(1,3)+(1,5)": {(1, 3): 300, (1, 5): 300},
    "(1,3)+(4,3)+(4,1)": {(1, 3): 300, (4, 3): 300, (4, 1): 200},
    "one request, every K": {(1, k): 150 for k in range(K_MAX + 1)},
}


def synthetic_steps(
    true_s: Callable[[int, int], float],
    cells: dict[tuple[int, int], int],
    first_seq: int = 0,
    seed: int | None = None,
) -> list[EngineStep]:
    """Decode steps of the cells, in order, numbered from ``first_seq``, each the truth's time with 5 %
    noise (drawn from ``seed``, else from ``first_seq``)."""
    rng, out = random.Random(first_seq if seed is None else seed), []
    for (b, k), n in cells.items():
        for _ in range(n):
            s = true_s(b, k) * rng.uniform(0.95, 1.05)
            seq = first_seq + len(out)
            out.append(
                EngineStep(
                    seq=seq,
                    t=seq * 0.2,
                    wall_s=s,
                    interval_s=s,
                    batch_size=b,
                    k=k,
                    num_tokens=b * (k + 1),
                    num_drafted=b * k,
                    num_accepted=0,
                    num_emitted=b,
                    accepted_per_pos=(),
                    reached_per_pos=(),
                    num_drafting=b if k else 0,
                    tap_s=0.0,
                )
            )
    return out


def score(chosen: list[int], rate: Callable[[int, int], float]) -> float:
    """The worst batch size's rate at the chosen K over its best K's rate."""
    return min(rate(b, chosen[b - 1]) / max(rate(b, k) for k in range(K_MAX + 1)) for b in range(1, MAX_BATCH + 1))


def evaluate(line: CostModel, weights: list[int | None]) -> list[dict]:
    rows = []
    for (d_name, distort), (t_name, cells), a in itertools.product(DISTORTIONS.items(), TRAFFIC.items(), ACCEPTANCES):

        def true_s(b: int, k: int, distort: Distortion = distort) -> float:
            return line.fit_step_s(b, k) * distort(line, b, k)

        def rate(b: int, k: int, a: float = a, true_s: Callable = true_s) -> float:
            return b * (1 - a ** (k + 1)) / (1 - a) / true_s(b, k)

        steps = synthetic_steps(true_s, cells)
        row = {"machine": d_name, "traffic": t_name, "acceptance": a}
        for w in weights:
            learned = CostLearner(line, True, fit_weight_samples=w).learn(steps)
            chosen = derive_auto_table(learned, [a] * K_MAX, K_MAX, MAX_BATCH).k_by_batch
            row[_label(w)] = round(score(chosen, rate), 3)
        rows.append(row)
    return rows


def one_request_rounds(line: CostModel, distort: Distortion, a: float, idle: bool) -> tuple[list[int], float]:
    """The Ks one request at a time runs under auto, round by round, and the last one's score; with
    ``idle``, each round's idle time measures the cells around the table's Ks that no step reached
    yet (``ProfileGrid.cells_around``, ``MIN_LEARN_SAMPLES`` steps each), as the app's does."""

    def true_s(b: int, k: int) -> float:
        return line.fit_step_s(b, k) * distort(line, b, k)

    def rate(k: int) -> float:
        return (1 - a ** (k + 1)) / (1 - a) / true_s(1, k)

    learner, model, ks, seq, grid = CostLearner(line, True), line, [], 0, default_grid(K_MAX)
    for r in range(ROUNDS + 1):
        table = derive_auto_table(model, [a] * K_MAX, K_MAX, MAX_BATCH)
        ks.append(table.k_by_batch[0])
        if r == ROUNDS:
            break
        cells = {(1, ks[-1]): ROUND_STEPS}
        if idle:
            cells |= {c: MIN_LEARN_SAMPLES for c in learner.unreached(grid.cells_around(table.k_by_batch, K_MAX))}
        steps = synthetic_steps(true_s, cells, seq)
        seq += len(steps)
        model = learner.learn(steps) or model
    return ks, round(rate(ks[-1]) / max(rate(k) for k in range(K_MAX + 1)), 3)


def _label(w: int | None) -> str:
    return "all" if w is None else str(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit-weight-samples", default="all,8,16", help="comma-separated; 'all': no cap")
    args = ap.parse_args()
    weights = [None if w == "all" else int(w) for w in args.fit_weight_samples.split(",")]
    summary: dict[str, dict] = {}
    for path in sorted(cost_priors_dir().glob("*.json")):
        saved = json.loads(path.read_text())
        line = fit_cost_model(CostModel.from_dict(saved["cost"]).points, drafter_runs_model=True)
        amx = " AMX" if saved["key"].get("amx") else ""
        kind = f"{saved['key']['cpu_kind']}{amx} {saved['key']['dtype']}"
        print(f"== {kind} (shipped prior {path.name})")
        rows = evaluate(line, weights)
        for r in rows:
            scores = "  ".join(f"{_label(w)}: {r[_label(w)]:.3f}" for w in weights)
            print(f"{r['machine']:22s} {r['traffic']:22s} a={r['acceptance']}  {scores}")
        summary[kind] = {
            _label(w): {"worst": min(r[_label(w)] for r in rows), "mean": round(mean(r[_label(w)] for r in rows), 4)}
            for w in weights
        }
        for w, s in summary[kind].items():
            print(f"   fit weight samples {w}: worst {s['worst']:.3f}, mean {s['mean']:.4f} over {len(rows)} cases")
        for idle in (False, True):
            how = "and idle time's cells around them" if idle else "traffic only"
            print(
                f"   one request at a time, {ROUNDS} rounds of {ROUND_STEPS} steps, {how}: the Ks run, the last's score"
            )
            rounds = {}
            for (d_name, distort), a in itertools.product(DISTORTIONS.items(), (0.8, 0.9)):
                ks, last = one_request_rounds(line, distort, a, idle)
                rounds[f"{d_name}, a={a}"] = {"ks": ks, "score": last}
                print(f"   {d_name:22s} a={a}: K {' '.join(map(str, ks))} -> {last:.3f}")
            summary[kind]["one_request_rounds" + ("_idle_cells" if idle else "")] = rounds
    print(json.dumps({"cases_per_kind": len(DISTORTIONS) * len(TRAFFIC) * len(ACCEPTANCES), "by_kind": summary}))


if __name__ == "__main__":
    main()
