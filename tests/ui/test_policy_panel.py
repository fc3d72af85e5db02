"""The K-under-load panel's pure parts: editor cells, the row in force, the figures."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from engine_adapter.policy.cost_model import CostModel, CostPoint
from engine_adapter.policy.k_policy import AutoTable, derive_auto_table
from engine_adapter.records import EngineStep, SlotBid
from explorer.views.k_table import table_check, table_rows
from explorer.views.policy_charts import (
    auction_figure,
    auto_figure,
    chosen_k_caption,
    step_time_figure,
    table_in_force_markdown,
)


@pytest.mark.parametrize(
    "cells, expected",
    [
        ([[1, 2, 3], [3, 64, 0]], [[1, 2, 3], [3, 64, 0]]),
        (pd.DataFrame([[1.0, 4.0, 2.0]]), [[1, 4, 2]]),  # the editor sends floats
        ({"headers": ["start_bs", "end_bs", "K"], "data": [[1, 8, 1]]}, [[1, 8, 1]]),  # the API's form
        ([[1, 8, 1], [None, None, None], ["", "", ""]], [[1, 8, 1]]),  # empty rows are skipped
        (pd.DataFrame([[1, 8, 1], [math.nan, math.nan, math.nan]]), [[1, 8, 1]]),
    ],
)
def test_table_rows_accepts(cells, expected):
    assert table_rows(cells) == expected


@pytest.mark.parametrize(
    "cells, error",
    [
        ([[1, 2.5, 3]], "end_bs must be a whole number"),
        ([[1, "x", 3]], "end_bs must be a whole number"),
        ([[1, 2]], "needs three cells"),
        ([[1, 2, None]], "K must be a whole number"),
        ([[1, 1, 1]] * 65, "at most 64 rows"),
    ],
)
def test_table_rows_refuses(cells, error):
    with pytest.raises(ValueError, match=error):
        table_rows(cells)


@pytest.mark.parametrize(
    "cells, k_max, said",
    [
        ([[1, 2, 3], [3, 64, 0]], 3, "Valid table [[1, 2, 3], [3, 64, 0]]"),
        (
            pd.DataFrame([[3.0, 64.0, 0.0], [1.0, 2.0, 3.0]]),
            5,
            "Valid table [[1, 2, 3], [3, 64, 0]]",
        ),  # sorted, as vLLM
        ([[2, 2, 3], [3, 64, 0]], 5, "✕ Not a valid table yet: the first row must start at batch size 1"),
        ([[1, 4, 3], [3, 64, 0]], 5, "overlap"),
        ([[1, 4, 6]], 5, "above this engine's num_speculative_tokens (5)"),
        ([[1, 4, -1]], 5, "K must be >= 0"),
        ([[1, "x", 1]], 5, "end_bs must be a whole number"),
        ([], 5, "non-empty list"),
    ],
)
def test_the_table_is_checked_as_it_is_typed(cells, k_max, said):
    assert said in table_check(cells, k_max)


TABLE = [(1, 2, 3), (4, 8, 1), (16, 64, 0)]


@pytest.mark.parametrize(
    "batch, row, note",
    [
        (1, 0, ""),
        (2, 0, ""),
        (3, 0, "gap"),
        (5, 1, ""),
        (12, 1, "gap"),
        (16, 2, ""),
        (64, 2, ""),
    ],
)
def test_the_row_in_force_is_marked(batch, row, note):
    md = table_in_force_markdown(TABLE, batch, auction=False, k_max=5)
    lines = md.splitlines()[2:]
    marked = [i for i, line in enumerate(lines) if "in force" in line]
    assert marked == [row]
    assert (" gap " in lines[row] or "gap after" in lines[row]) == (note == "gap")


def test_auction_replaces_the_table_view():
    assert "Slot auction" in table_in_force_markdown(None, 3, auction=True, k_max=5)
    assert "shared alike" in table_in_force_markdown(None, 3, auction=True, k_max=5, equal=True)


def step(seq, b, k, n, s, bids=()):
    return EngineStep(
        seq,
        float(seq),
        s,
        s,
        b,
        k,
        n,
        0,
        0,
        b,
        (),
        (),
        0,
        0.0,
        0,
        sum(x.admitted for x in bids) if bids else None,
        tuple(bids),
    )


COST = CostModel(0.05, 0.002, 4, points=(CostPoint(1, 0, 1, 0.05, 5), CostPoint(4, 3, 16, 0.074, 5)))


@pytest.mark.parametrize("knee, line_at", [(0.0, 1.0), (4.0, 4.0), (24.0, 24.0), (300.0, 300.0)])
def test_the_knee_label_sits_on_the_knee_line(knee, line_at):
    """On the log x axis a shape's x is in tokens, an annotation's in log10(tokens)."""
    fig = step_time_figure(CostModel(**{**COST.__dict__, "knee_tokens": knee}), [])
    label = next(a for a in fig.layout.annotations if a.text.startswith("knee"))
    line = next(s for s in fig.layout.shapes if s.type == "line")
    assert (line.x0, label.x) == (line_at, pytest.approx(math.log10(line_at)))


@pytest.mark.parametrize(
    "batch_size, expected",
    [
        (1, "K (at batch size 1, K = 1 maximises)"),  # its own optimum
        # +7.80 %: 2.2 against 2 weighed as K is chosen (0.98 per draft position), not the +10 % unweighed
        (2, "K (at batch size 2, K = 1; K = 2 gives +7.80%<br>but K never rises with the batch size)"),
        (3, "K (at batch size 3, K = 0 maximises)"),
    ],
)
def test_the_auto_chart_says_where_k_was_kept_from_rising(batch_size, expected):
    auto = AutoTable([(1, 2, 1), (3, 3, 0)], [1, 1, 0], [[1, 2, 1], [1, 2, 2.2], [2, 1, 1]], [0.9], [1, 2, 0])
    assert chosen_k_caption(auto, batch_size) == expected


def test_figures_render_with_and_without_data():
    assert "No cost model" in step_time_figure(None, []).layout.annotations[0].text
    fig = step_time_figure(COST, [step(1, 4, 3, 16, 0.07), step(2, 4, 3, 16, 0.08)])
    names = [t.name for t in fig.data]
    assert "measured, K=0" in names and "now (last 5 s)" in names
    assert "knee ≈ 4 tokens" in [a.text for a in fig.layout.annotations]
    auto = derive_auto_table(COST, [0.8, 0.7, 0.6], 3, 8)
    assert auto_figure(auto, 2, "in force now").data
    bids = (SlotBid("mine", (0.9, 0.8), 2), SlotBid("other", (0.2, 0.05), 0))
    fig = auction_figure([step(3, 2, 2, 4, 0.06, bids)], "mine")
    assert list(fig.data[0].y) == ["your request", "neighbour 1"]
    assert fig.data[0].text[0][1].endswith("✓") and fig.data[0].text[1][0].endswith("✗")
    assert "No step has run under the auction" in auction_figure([], None).layout.annotations[0].text


def test_the_auction_grid_says_when_nobody_drafts():
    """Under the auction with the drafter idle (ceiling 0) no request bids: the grid says so."""
    from dataclasses import replace

    idle = replace(step(7, 16, 0, 16, 0.3), auction_slots=0, auction_ceiling=0)
    text = auction_figure([idle], "mine").layout.annotations[0].text
    assert "engine step 7: 16 requests, none drafting: 0 slots admitted" in text
    assert "proposes 0 next" in text
