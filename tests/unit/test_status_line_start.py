"""The status line through a start: the measuring line names the cell and the share done, and the
ready line says how long the start took and how much of it measured this machine."""

from __future__ import annotations

from engine_adapter.engine.start_log import StartProgress
from engine_adapter.service.backend import StartTimes
from tests.support.status_lines import line


def test_the_measuring_line_names_the_cell_and_the_share_done() -> None:
    text = line("starting", StartProgress("measure", 0.45, "measuring this machine: batch 4, K=1 (cell 5 of 9)"))
    assert text.startswith("◐ **Measuring this machine**"), text
    assert "45%" in text and "cell 5 of 9" in text, text


def test_the_ready_line_says_how_long_the_start_measured_this_machine() -> None:
    text = line("ready", started=StartTimes(26.4, 1.84))
    assert text.startswith("● **Engine ready**"), text
    assert "Started in 26 s, 1.8 s of it spent measuring this machine's step times" in text, text


def test_a_start_from_the_cached_cost_model_says_only_how_long() -> None:
    text = line("ready", started=StartTimes(22.0, None))
    assert "Started in 22 s." in text and "measuring" not in text, text


def test_a_line_before_any_start_is_over_says_no_time() -> None:
    assert "Started in" not in line("ready")
