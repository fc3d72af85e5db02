"""scripts/space_start.py reads the app's status line into phases: the page's own texts, classified."""

from __future__ import annotations

import pytest

from engine_adapter.engine.start_log import StartProgress
from engine_adapter.service.backend import StartTimes
from scripts.space_start import phase_durations, status_kind
from tests.support.status_lines import line


@pytest.mark.parametrize(
    "status, kind",
    [
        (line("starting", StartProgress("models", 0.0, "resolving target model packaged:1.5b")), "models"),
        (line("starting", StartProgress("models", 0.09, "packaged:1.5b: assemble 30%")), "models"),
        (line("starting", StartProgress("models", 0.3, "packaged:0.5b: convert 100%")), "models"),
        (line("starting", StartProgress("models", 0.15, "resolving draft model packaged:0.5b")), "models"),
        (line("starting", StartProgress("spawn", 0.3, "starting vLLM")), "vllm"),
        (line("starting", StartProgress("weights", 0.55, "weights loaded")), "vllm"),
        (line("starting", StartProgress("ready", 1.0, "server answering at http://x; checking the tap")), "vllm"),
        (line("starting", StartProgress("measure", 0.4, "measuring this machine: batch 4, K=3")), "measuring"),
        (line("ready"), "ready"),
        (line("ready", started=StartTimes(26.0, 1.8)), "ready"),
        (line("failed", error="could not prepare the models: converting packaged:1.5b needs X"), "failed"),
        (line("restarting", error="the engine was killed"), "restarting"),
        (line("starting", StartProgress("spawn", 0.3, "starting vLLM"), fault="killed"), "restarting"),
        (line("stopped"), "other"),
    ],
)
def test_status_kind(status: str, kind: str) -> None:
    assert status_kind(status) == kind, status


def test_phase_durations_run_from_launch_through_the_marks_reached() -> None:
    at = {"page_up": 5.0, "models_built": 100.0, "vllm_started": 160.0, "measuring": 160.0, "ready": 400.0}
    assert phase_durations(at) == {"page_up": 5.0, "models_built": 95.0, "vllm_started": 60.0, "ready": 240.0}
