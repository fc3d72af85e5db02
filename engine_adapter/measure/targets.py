"""Where a sweep stands against its targets: the checks behind ``python -m engine_adapter.sweep_targets``.

Contract: ``check(df)`` takes a sweep CSV as a DataFrame and returns one dict per target
cell (auto and auction against the best fixed policy per level, the auction against
``off`` at c=1, acceptance per position at the top level against c=1), each with the
figures and whether it is met.
"""

from __future__ import annotations

import pandas as pd

BASELINES = ["off", "k1", "k3", "k5"]


def _groups(df: pd.DataFrame):
    if "category" in df.columns:
        yield from df.groupby("category")
    else:
        yield "all", df


def _per_position(cell: pd.Series) -> list[float]:
    """A row's space-separated acceptance per position; [] where none was measured (NaN in the CSV)."""
    v = cell.iloc[0]
    return [float(x) for x in str(v).split()] if pd.notna(v) else []


def check(df: pd.DataFrame) -> list[dict]:
    out: list[dict] = []
    for cat, d in _groups(df):
        tps = d.pivot_table(index="concurrency", columns="policy", values="total_tokens_per_s")
        base = [p for p in BASELINES if p in tps.columns]
        for policy in ("auto", "auction"):
            if policy not in tps.columns or not base:
                continue
            for c, row in tps.iterrows():
                best = row[base].max()
                out.append(
                    {
                        "target": "policy >= 0.97 x best fixed",
                        "category": cat,
                        "policy": policy,
                        "concurrency": int(c),
                        "value": round(row[policy] / best, 3),
                        "best_of": row[base].idxmax(),
                        "ok": bool(row[policy] >= 0.97 * best),
                    }
                )
        if cat in ("code", "all") and {"auction", "off"} <= set(tps.columns) and 1 in tps.index:
            r = tps.loc[1, "auction"] / tps.loc[1, "off"]
            out.append(
                {
                    "target": "auction >= 1.3 x off at c=1, code",
                    "category": cat,
                    "policy": "auction",
                    "concurrency": 1,
                    "value": round(r, 3),
                    "ok": bool(r >= 1.3),
                }
            )
        # same texts at both levels where the sweep measured it (older CSVs: pooled)
        col = next((c for c in ("acceptance_per_position_per_text", "acceptance_per_position") if c in d.columns), None)
        c_lo, c_hi = d["concurrency"].min(), d["concurrency"].max()
        if col is not None and c_hi > c_lo:  # one level alone compares nothing
            for policy in [p for p in d["policy"].unique() if p.startswith("k")]:
                lo = d[(d["policy"] == policy) & (d["concurrency"] == c_lo)]
                hi = d[(d["policy"] == policy) & (d["concurrency"] == c_hi)]
                if lo.empty or hi.empty:
                    continue
                a, b = _per_position(lo[col]), _per_position(hi[col])
                if not a or not b:  # K=0: no draft was tested, nothing to compare
                    continue
                # the CSV holds 4 decimals: 0.9000 - 0.8500 must read 0.05, not 0.05000000000000004
                diff = round(max((abs(x - y) for x, y in zip(a, b)), default=0.0), 4)
                out.append(
                    {
                        "target": f"acceptance per position, c={int(c_hi)} vs c=1",
                        "category": cat,
                        "policy": policy,
                        "concurrency": int(c_hi),
                        "value": round(diff, 3),
                        "column": col,
                        "ok": bool(diff <= 0.05),
                    }
                )
    return out
