"""Both backends implement the whole ``Backend`` protocol, each saying what it can do by a field,
and what only one kind has is a part of its own (``reference``, ``recording``), None on the other."""

from __future__ import annotations

import inspect

import pytest

from engine_adapter.service.backend import LIVE, REPLAY, Backend, Recording, ReferenceTwin
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
    assert {"capabilities", "status", "stream", "steps_since", "set_background", "policy_view"} <= set(MEMBERS)
    assert {"reference", "recording"} <= set(MEMBERS)
    # what only one kind can do is not a member both carry as a stub
    assert not {"replay_info", "replay_prompt", "recorded_requests", "twin_status"} & set(MEMBERS)
    assert "reference" not in inspect.signature(Backend.stream).parameters


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
def test_capabilities_and_parts_are_fields_not_probes(backends, kind, capabilities, replay):
    backend = backends[kind]
    assert isinstance(backend, Backend)
    assert backend.capabilities == capabilities
    if replay:
        assert backend.reference is None and isinstance(backend.recording, Recording)
        assert backend.recording.info().num_requests == 1 and len(backend.recording.requests()) == 1
        assert backend.recording.prompt_for("def add(a, b):") == "def add(a, b):"  # the recorded one
    else:
        assert backend.recording is None and isinstance(backend.reference, ReferenceTwin)
        assert backend.reference.status(False).state == "off"  # never started
        assert backend.capabilities.lossless_check
