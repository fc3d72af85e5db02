"""scripts/space_start.py reads the app's status line into phases: the page's own texts, classified."""

from __future__ import annotations

import pytest

from engine_adapter.engine.start_log import StartProgress
from engine_adapter.engine_config import EngineConfig
from engine_adapter.service.backend import ServiceStatus
from explorer.views.status import status_markdown
from scripts.space_start import phase_durations, status_kind


class OneStatus:
    """The part of a Backend that ``status_markdown`` reads, for a live engine."""

    replay_info = None

    def __init__(self, status: ServiceStatus) -> None:
        self._status = status

    def status(self) -> ServiceStatus:
        return self._status

    def policy_view(self) -> None:
        return None


def line(state: str, progress: StartProgress | None = None, error: str | None = None, fault: str | None = None) -> str:
    st = ServiceStatus(
        state=state,
        progress=progress,
        error=error,
        config=EngineConfig(),
        url="http://127.0.0.1:1",
        attached=False,
        generation=1,
        fault=fault,
    )
    return status_markdown(OneStatus(st))


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
