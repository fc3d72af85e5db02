"""Sweep CSVs in the explorer: reading (clear errors), speedup against off, per category."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from engine_adapter.package_data import sweeps_dir
from engine_adapter.records import SweepFileSettings
from explorer.views.sweep_figure import (
    REQUIRED,
    read_sweep,
    settings_markdown,
    shipped_sweeps,
    show,
    sweep_figure,
    with_speedup,
)


def rows(policy, tps_by_c, category=None):
    out = []
    for c, tps in tps_by_c.items():
        r = {
            "policy": policy,
            "concurrency": c,
            "total_tokens_per_s": tps,
            "per_request_tokens_per_s": tps / c,
            "mean_accepted_per_step": 1.0,
            "effective_k": 2.0,
            "draft_acceptance_rate": 0.5,
        }
        if category:
            r["category"] = category
        out.append(r)
    return out


def test_speedup_is_against_off_at_the_same_level():
    df = pd.DataFrame(rows("off", {1: 10, 4: 20}) + rows("k3", {1: 15, 4: 16}))
    d = with_speedup(df).set_index(["policy", "concurrency"])
    assert d.loc[("k3", 1), "speedup"] == pytest.approx(1.5)
    assert d.loc[("k3", 4), "speedup"] == pytest.approx(0.8)
    assert d.loc[("off", 4), "speedup"] == pytest.approx(1.0)


def test_categories_get_their_own_baseline_and_panel():
    df = pd.DataFrame(
        rows("off", {1: 10}, "code")
        + rows("k3", {1: 15}, "code")
        + rows("off", {1: 5}, "story")
        + rows("k3", {1: 6}, "story")
    )
    d = with_speedup(df).set_index(["policy", "category"])
    assert d.loc[("k3", "story"), "speedup"] == pytest.approx(1.2)
    fig = sweep_figure(df)
    assert [a.text for a in fig.layout.annotations][:2] == ["code prompts", "story prompts"]


def test_without_off_the_figure_shows_tokens_per_second():
    fig = sweep_figure(pd.DataFrame(rows("k1", {1: 3, 2: 5})))
    assert fig.layout.yaxis.title.text == "total tokens/s"


@pytest.mark.parametrize(
    "content, error",
    [
        ("", "cannot read"),
        ("policy,concurrency\nk1,1\n", "missing column"),
        (",".join(REQUIRED) + "\n", "has no rows"),
    ],
)
def test_bad_csvs_get_a_clear_message(tmp_path, content, error):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ValueError, match=error):
        read_sweep(path)
    message, fig, table = show(path)
    assert message.startswith("✕") and fig is None and table is None


def test_sweep_targets_table():
    from engine_adapter.measure.targets import check

    def row(policy, c, tps, acc="0.8 0.7"):
        return {
            "policy": policy,
            "concurrency": c,
            "total_tokens_per_s": tps,
            "category": "code",
            "acceptance_per_position": acc,
        }

    df = pd.DataFrame(
        [
            row("off", 1, 10),
            row("k3", 1, 15),
            row("auto", 1, 14.6),
            row("auction", 1, 13),
            row("off", 16, 40),
            row("k3", 16, 20, "0.81 0.62"),
            row("auto", 16, 39),
            row("auction", 16, 38),
        ]
    )
    got = {(c["target"][:6], c["policy"], c["concurrency"]): (c["value"], c["ok"]) for c in check(df)}
    assert got[("policy", "auto", 1)] == (0.973, True)  # 14.6 / 15
    assert got[("policy", "auction", 1)] == (0.867, False)
    assert got[("policy", "auto", 16)] == (0.975, True)  # 39 / 40 (off is the best at 16)
    assert got[("auctio", "auction", 1)] == (1.3, True)
    assert got[("accept", "k3", 16)] == (0.08, False)  # position 2 moved by 0.08
    # with the per-text column the target compares the same texts; the pooled one is ignored
    df["acceptance_per_position_per_text"] = ["0.8 0.7"] * 4 + ["0.8 0.7", "0.79 0.73", "0.8 0.7", "0.8 0.7"]
    acc = [c for c in check(df) if c["target"].startswith("accept")]
    assert [(c["value"], c["ok"], c["column"]) for c in acc] == [(0.03, True, "acceptance_per_position_per_text")]
    # "within 0.05" includes 0.05 itself, as the CSV's 4 decimals give it
    df["acceptance_per_position_per_text"] = ["0.85 0.7"] * 4 + ["0.85 0.7", "0.9000 0.7", "0.85 0.7", "0.85 0.7"]
    acc = [c for c in check(df) if c["target"].startswith("accept")]
    assert [(c["value"], c["ok"]) for c in acc] == [(0.05, True)]
    # K=0 tested no draft, and one level alone has nothing to compare against: no check either way
    df["acceptance_per_position_per_text"] = ["", float("nan"), "", ""] * 2  # as a CSV reads back: NaN
    df.loc[df["policy"] == "k3", "policy"] = "k0"
    assert not [c for c in check(df) if c["target"].startswith("accept")]
    one_level = df[df["concurrency"] == 16].assign(
        policy=["off", "k3", "auto", "auction"], acceptance_per_position_per_text="0.8 0.7"
    )
    assert not [c for c in check(one_level) if c["target"].startswith("accept")]


def test_shipped_sweeps_follow_the_index_then_the_rest_by_name(tmp_path):
    for name in ("b.csv", "a.csv", "record.csv"):
        (tmp_path / name).write_text(",".join(REQUIRED) + "\n")
    (tmp_path / "index.json").write_text(
        '[{"file": "record.csv", "about": "of record"}, {"file": "gone.csv", "about": "deleted"}]'
    )
    got = [(s.path.name, s.about) for s in shipped_sweeps(tmp_path)]
    assert got == [("record.csv", "of record"), ("a.csv", ""), ("b.csv", "")]
    assert shipped_sweeps(tmp_path / "missing") == []


def test_every_shipped_sweep_is_in_the_index_and_reads():
    """The explorer's default sweep is the index's first: every shipped CSV says what it is."""
    shipped = shipped_sweeps(sweeps_dir())
    assert shipped and all(s.about for s in shipped), [s.path.name for s in shipped if not s.about]
    for s in shipped:
        assert not read_sweep(s.path).empty


def test_a_shipped_sweep_is_shown_with_its_settings_line(tmp_path):
    (tmp_path / "one.csv").write_text(",".join(REQUIRED) + "\n")
    (tmp_path / "two.csv").write_text(",".join(REQUIRED) + "\n")
    settings = {"hardware": "AMD EPYC, 2 cores (AVX-512 BF16)", "dtype": "bfloat16", "models": "t / d"}
    (tmp_path / "index.json").write_text(
        json.dumps(
            [
                {"file": "one.csv", "date": "the day it ran", "about": "a", "settings": settings | {"method": "draft"}},
                {"file": "two.csv", "date": "another day", "about": "b"},
            ]
        )
    )
    one, two = shipped_sweeps(tmp_path)
    assert one.settings == SweepFileSettings(settings["hardware"], "bfloat16", "t / d", "draft", None, "the day it ran")
    assert settings_markdown(one.settings) == (
        "**Measured with:** AMD EPYC, 2 cores (AVX-512 BF16), bfloat16; t / d; method draft; "
        "policies and concurrency as in the table; the day it ran"
    )
    assert two.settings is None and "not recorded with this file" in settings_markdown(two.settings)
    partial = SweepFileSettings.from_dict({"dtype": "float32", "max_tokens": 32, "unknown": 1})
    assert partial.line().startswith("not recorded, float32; not recorded; method not recorded; 32 tokens per request")


def test_every_shipped_sweep_says_what_it_was_measured_with():
    """Every speed figure on the page has its settings line: the shipped sweeps' come from the index."""
    missing = [s.path.name for s in shipped_sweeps(sweeps_dir()) if s.settings is None]
    assert not missing, missing
