"""Both backends implement the whole ``Backend`` protocol, each saying what it can do by a field."""

from __future__ import annotations

import inspect

import pytest

from engine_adapter.service.backend import LIVE, REPLAY, Backend
from engine_adapter.service.engine_service import EngineService
from engine_adapter.service.replay_service import ReplayService
from tests.support.trace_samples import write_trace

MEMBERS = sorted(
    {n for n in vars(Backend) if not n.startswith("_")} | set(Backend.__annotations__) - {"__protocol_attrs__"}
)


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.jsonl"
    write_trace(path)
    live, replay = EngineService(), ReplayService(path)
    yield {"live": live, "replay": replay}
    live.close()
    replay.close()


def test_the_protocol_has_the_surface_the_explorer_uses():
    assert {"capabilities", "status", "stream", "steps_since", "set_background", "policy_view", "replay_info"} <= set(
        MEMBERS
    )


@pytest.mark.parametrize("kind", ["live", "replay"])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_backend_has_each_member(backends, kind, name):
    backend = backends[kind]
    assert hasattr(backend, name), f"{type(backend).__name__} lacks {name}"
    wanted = getattr(Backend, name, None)
    if callable(wanted) and not isinstance(inspect.getattr_static(Backend, name), property):
        have = inspect.signature(getattr(backend, name)).parameters
        for param in list(inspect.signature(wanted).parameters)[1:]:  # self
            assert param in have, f"{type(backend).__name__}.{name} takes no {param!r}"


@pytest.mark.parametrize("kind, capabilities, replay", [("live", LIVE, False), ("replay", REPLAY, True)])
def test_capabilities_and_replay_info_are_fields_not_probes(backends, kind, capabilities, replay):
    backend = backends[kind]
    assert isinstance(backend, Backend)
    assert backend.capabilities == capabilities
    assert (backend.replay_info is not None) == replay
    assert (backend.recorded_requests() != []) == replay
    assert backend.replay_prompt("def add(a, b):") == "def add(a, b):"  # recorded, or live: itself
