"""The page's status line for one ``ServiceStatus`` of a live engine, as ``status_markdown`` writes it."""

from __future__ import annotations

from typing import Any

from engine_adapter.engine.start_log import StartProgress
from engine_adapter.engine_config import EngineConfig
from engine_adapter.service.backend import ServiceStatus
from explorer.views.status import status_markdown


class OneStatus:
    """The part of a Backend that ``status_markdown`` reads, for a live engine."""

    recording = None

    def __init__(self, status: ServiceStatus) -> None:
        self._status = status

    def status(self) -> ServiceStatus:
        return self._status

    def policy_view(self) -> None:
        return None


def line(
    state: str,
    progress: StartProgress | None = None,
    error: str | None = None,
    fault: str | None = None,
    **more: Any,
) -> str:
    """The status line for a live engine in ``state`` (``more``: other ``ServiceStatus`` fields)."""
    st = ServiceStatus(
        state=state,
        progress=progress,
        error=error,
        config=EngineConfig(),
        url="http://127.0.0.1:1",
        attached=False,
        generation=1,
        fault=fault,
        **more,
    )
    return status_markdown(OneStatus(st))
