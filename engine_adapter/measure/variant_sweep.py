"""The sweep over model variants: the same policies and levels on the full pair and its quantised
variants (``engine.variants``: int8 or int4 target, int8 or int4 pair), one variant's engines
after another.

Contract: ``variant_sweep(settings, variants, bandwidth_gbs, dtype)`` runs
``policy_sweep.sweep_levels`` once per variant (``settings``' target and draft are the full
pair's folders; the quantised copies are made on first use, in the model cache; ``dtype`` is the
engines') and returns one table: ``variant`` first, then the sweep's columns, then
``VARIANT_COLUMNS``:

- ``bytes_per_step``: what one plain decode step of the variant's target reads (GB);
- ``roofline_fraction``: plain decoding's tokens/s (``off`` rows only) over its bound,
  ``bandwidth_gbs`` / bytes per step x concurrency (``engine.roofline``);
- ``speedup_over_off``: total tokens/s over the same variant's ``off`` at the level;
- ``speedup_over_full_off``: the same over the full pair's ``off``: what the variant and the
  policy give together;
- ``naive_product``: the variant's plain speedup (its ``off`` over the full ``off``) times the
  policy's speedup on the full pair: what multiplying the two would predict, beside
  ``speedup_over_full_off`` measured (``None`` for the full variant and for ``off``);
- ``agreement_with_full``: mean token agreement (``provenance.text_agreement``) of each
  request's text with the full target's speculation-off text of the same prompt at the level,
  and ``identical_to_full``: the share of requests whose text is the same token for token.

``overlap_sentences(df)`` says, per level, how far the product overstates the measured
combination. Needs ``off`` and ``full`` in the sweep (the comparison's base).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pandas as pd

from engine_adapter.engine.models import default_cache_dir
from engine_adapter.engine.roofline import bytes_read_per_step, roofline_tokens_per_s
from engine_adapter.engine.variants import variant_models
from engine_adapter.engine_config import FULL_VARIANT as FULL
from engine_adapter.measure.policy_sweep import Levels, SweepSettings, reference_texts, sweep_frame, sweep_levels
from engine_adapter.measure.sweep_runs import Policy
from engine_adapter.provenance import text_agreement

VARIANT_COLUMNS = [
    "bytes_per_step",
    "roofline_fraction",
    "speedup_over_off",
    "speedup_over_full_off",
    "naive_product",
    "agreement_with_full",
    "identical_to_full",
]


def _agreement(levels: Levels, full_levels: Levels) -> dict[tuple[int, str, str], tuple[float, float]]:
    """(concurrency, category, policy) -> (mean agreement, identical share) with the full ``off`` texts."""
    out = {}
    for level, runs in levels.items():
        off_runs = {key: rs for key, rs in full_levels.get(level, {}).items() if key[0] == "off"}
        reference = reference_texts(off_runs)
        for (policy, _rule), rs in runs.items():
            pairs = [(r.token_ids, reference[r.prompt][0]) for run in rs for r in run.results if r.prompt in reference]
            if pairs:
                agree = sum(text_agreement(a, b) for a, b in pairs) / len(pairs)
                out[(level[0], level[1], policy)] = (
                    round(agree, 4),
                    round(sum(a == b for a, b in pairs) / len(pairs), 4),
                )
    return out


def _variant_frame(
    settings: SweepSettings, variant: str, policies: list[Policy], levels: Levels, full_levels: Levels, dtype: str
) -> pd.DataFrame:
    df = sweep_frame(settings, policies, levels)
    df.insert(0, "variant", variant)
    df["bytes_per_step"] = round(bytes_read_per_step(Path(settings.target), dtype) / 1e9, 3)
    agreement = _agreement(levels, full_levels)
    category = df["category"] if "category" in df.columns else pd.Series("all", index=df.index)
    keys = list(zip(df["concurrency"], category, df["policy"]))
    df["agreement_with_full"] = [agreement.get(k, (None, None))[0] for k in keys]
    df["identical_to_full"] = [agreement.get(k, (None, None))[1] for k in keys]
    return df


def _add_ratios(df: pd.DataFrame, bandwidth_gbs: float) -> pd.DataFrame:
    """The roofline fraction, the speedups and the naive product (see the module)."""
    level = ["concurrency", *(["category"] if "category" in df.columns else [])]
    rate = "total_tokens_per_s"
    off = df[df["policy"] == "off"].set_index(["variant", *level])[rate]
    full = df[df["variant"] == FULL].set_index(["policy", *level])[rate]

    def ratios(row: pd.Series) -> pd.Series:
        lvl = tuple(row[c] for c in level)
        own_off, full_off = off.get((row["variant"], *lvl)), off.get((FULL, *lvl))
        bound = roofline_tokens_per_s(bandwidth_gbs, int(row["bytes_per_step"] * 1e9), int(row["concurrency"]))
        full_policy = full.get((row["policy"], *lvl))
        naive = None
        if row["variant"] != FULL and row["policy"] != "off" and full_off and own_off and full_policy:
            naive = (own_off / full_off) * (full_policy / full_off)
        return pd.Series(
            {
                "roofline_fraction": row[rate] / bound if row["policy"] == "off" and bound else None,
                "speedup_over_off": row[rate] / own_off if own_off else None,
                "speedup_over_full_off": row[rate] / full_off if full_off else None,
                "naive_product": naive,
            }
        )

    df[["roofline_fraction", "speedup_over_off", "speedup_over_full_off", "naive_product"]] = df.apply(ratios, axis=1)
    for col in ("roofline_fraction", "speedup_over_off", "speedup_over_full_off", "naive_product"):
        df[col] = df[col].astype(float).round(3)
    return df[[c for c in df.columns if c not in VARIANT_COLUMNS] + VARIANT_COLUMNS]


async def variant_sweep(settings: SweepSettings, variants: list[str], bandwidth_gbs: float, dtype: str) -> pd.DataFrame:
    if FULL not in variants or "off" not in settings.policies:
        raise ValueError("a sweep over variants compares with the full pair's plain decoding: include full and off")
    cache_dir = default_cache_dir()
    frames, full_levels = [], None
    for variant in [FULL, *(v for v in variants if v != FULL)]:
        target, draft = variant_models(variant, Path(settings.target), Path(settings.draft), cache_dir)
        print(f"== variant {variant}: target {target.name}, draft {draft.name}", file=sys.stderr)
        mine = dataclasses.replace(settings, target=str(target), draft=str(draft))
        policies, levels = await sweep_levels(mine)
        full_levels = levels if variant == FULL else full_levels
        frames.append(_variant_frame(mine, variant, policies, levels, full_levels or {}, dtype))
    df = pd.concat(frames, ignore_index=True)
    return _add_ratios(df, bandwidth_gbs)


def overlap_sentences(df: pd.DataFrame) -> list[str]:
    """Per level and quantised variant: the naive product of the two speedups against the measured one."""
    out: list[str] = []
    rows = df[df["naive_product"].notna()]
    for _, r in rows.iterrows():
        over = r["naive_product"] / r["speedup_over_full_off"] - 1 if r["speedup_over_full_off"] else None
        out.append(
            f"c={int(r['concurrency'])}, {r['variant']} + {r['policy']}: product {r['naive_product']:.2f}x, "
            f"measured {r['speedup_over_full_off']:.2f}x over the full pair's plain decoding "
            f"(the product overstates it by {'-' if over is None else f'{over:+.0%}'})"
        )
    return out
