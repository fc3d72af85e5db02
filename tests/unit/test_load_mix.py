"""The background load's task mix: every kind by default, one kind on a presenter's choice, a kind
the load has no prompt of refused; the next load requests' prompts follow (no engine needed)."""

from __future__ import annotations

import asyncio

import pytest

from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.prompts import Preset
from engine_adapter.service.engine_service import EngineService
from engine_adapter.service.replay_service import ReplayService

PRESETS = [Preset("code", "a", "def f():"), Preset("story", "b", "Once"), Preset("code", "c", "for i in")]


@pytest.fixture
def service():
    svc = EngineService(background_prompts=PRESETS)
    yield svc
    svc.close()


def test_every_kind_by_default_then_one_kind_then_all_again(service: EngineService) -> None:
    mix = service.load_mix()
    assert mix.available == ("code", "story") and mix.chosen == ("code", "story")
    assert mix.describe() == "every task kind"
    mix = asyncio.run(service.set_load_mix(["story"]))
    assert mix.chosen == ("story",) and mix.describe() == "story only"
    assert [p.prompt for p in service.background.prompts] == ["Once"]
    assert asyncio.run(service.set_load_mix(["code", "story"])).describe() == "every task kind"
    assert len(service.background.prompts) == 3


@pytest.mark.parametrize("kinds", [[], ["poetry"], ["code", "poetry"]])
def test_a_kind_the_load_has_no_prompt_of_is_refused(service: EngineService, kinds: list[str]) -> None:
    with pytest.raises(ValueError, match="choose among the load's task kinds: code, story"):
        asyncio.run(service.set_load_mix(kinds))
    assert service.load_mix().describe() == "every task kind"


def test_a_replay_has_no_mix_to_change() -> None:
    replay = ReplayService(PROJECT_ROOT / "traces" / "low_load.jsonl")
    try:
        assert replay.load_mix().available == ()
        with pytest.raises(RuntimeError, match="recorded load"):
            asyncio.run(replay.set_load_mix(["code"]))
    finally:
        replay.close()
