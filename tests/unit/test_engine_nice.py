"""The engine's CPU priority (``EngineConfig.nice``): a lower priority for vLLM's processes, checked."""

from __future__ import annotations

import pytest

from engine_adapter.engine_config import EngineConfig


@pytest.mark.parametrize("nice, ok", [(0, True), (10, True), (19, True), (-1, False), (20, False)])
def test_nice_is_a_lower_priority_or_none(nice, ok):
    config = EngineConfig(method="off", nice=nice)
    if ok:
        config.validate()
    else:
        with pytest.raises(ValueError, match="nice must be between 0"):
            config.validate()
