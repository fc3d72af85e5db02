"""The variant sweep's ratios on a synthetic table: the roofline fraction of plain decoding, the
speedups over each variant's own plain decoding and over the full pair's, and the naive product."""

from __future__ import annotations

import pandas as pd
import pytest

from engine_adapter.measure.variant_sweep import VARIANT_COLUMNS, _add_ratios, overlap_sentences


def table() -> pd.DataFrame:
    rows = [  # (variant, policy, concurrency, tokens/s, GB per step)
        ("full", "off", 1, 4.0, 3.0),
        ("full", "auto", 1, 8.0, 3.0),
        ("int8-pair", "off", 1, 6.0, 1.5),
        ("int8-pair", "auto", 1, 9.0, 1.5),
        ("full", "off", 16, 40.0, 3.0),
        ("full", "auto", 16, 40.0, 3.0),
        ("int8-pair", "off", 16, 50.0, 1.5),
        ("int8-pair", "auto", 16, 50.0, 1.5),
    ]
    df = pd.DataFrame(rows, columns=["variant", "policy", "concurrency", "total_tokens_per_s", "bytes_per_step"])
    df["agreement_with_full"] = 1.0
    df["identical_to_full"] = 1.0
    return df


def test_ratios_and_the_naive_product():
    df = _add_ratios(table(), bandwidth_gbs=15.0)
    assert list(df.columns[-len(VARIANT_COLUMNS) :]) == VARIANT_COLUMNS
    by = {(r.variant, r.policy, r.concurrency): r for r in df.itertuples()}
    assert by[("full", "off", 1)].roofline_fraction == pytest.approx(4.0 / 5.0)  # 15 GB/s / 3 GB = 5 tokens/s
    assert by[("int8-pair", "off", 16)].roofline_fraction == pytest.approx(50.0 / 160.0, abs=1e-3)
    assert pd.isna(by[("full", "auto", 1)].roofline_fraction)  # plain decoding's figure only
    assert by[("int8-pair", "auto", 1)].speedup_over_off == pytest.approx(1.5)
    assert by[("int8-pair", "auto", 1)].speedup_over_full_off == pytest.approx(2.25)
    assert by[("int8-pair", "auto", 1)].naive_product == pytest.approx(1.5 * 2.0)
    assert pd.isna(by[("full", "auto", 1)].naive_product) and pd.isna(by[("int8-pair", "off", 1)].naive_product)
    sentences = overlap_sentences(df)
    assert sentences[0].startswith("c=1, int8-pair + auto: product 3.00x, measured 2.25x")
    assert "overstates it by +33%" in sentences[0]
    assert "c=16, int8-pair + auto: product 1.25x, measured 1.25x" in sentences[1]
