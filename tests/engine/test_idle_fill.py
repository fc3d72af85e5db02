"""Idle time measures the cells of a shipped cost model that traffic has not reached (and the Ks
around the auto table's choices), and a visitor's request stops it: no step ever holds profiling
requests beside anyone else's.

Tiny models (the ``close`` draft, K up to 5), an empty cost-model cache and a prior for exactly this
engine in ``SPEC_EXPLORER_COST_PRIORS`` (the start times two cells and scales it); idle time counts
after 1 s here (the app waits ``idle_fill.QUIET_S``)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from engine_adapter.engine.platform import cpu_platform
from engine_adapter.policy.controller import PolicySpec
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.cost_prior import PRIORS_ENV, TIMING_SUFFIX, write_prior
from engine_adapter.policy.profile_grid import default_grid
from engine_adapter.records import RequestResult
from engine_adapter.service.engine_service import EngineService
from tests.support.fixtures import tiny_config

BG_PROMPTS = ["def add(a, b):", "The quick brown fox"]
K_MAX = 5
PRIOR = CostModel(base_s=0.02, slope_s=0.001, knee_tokens=8, draft_s=0.005, first_s=0.005)
CELLS = default_grid(K_MAX).cells


def made_up_prior() -> CostModel:
    return fit_cost_model([CostPoint(b, k, b * (k + 1), PRIOR.fit_step_s(b, k), 6) for b, k in CELLS], True)


async def _run(service: EngineService, prompt: str, max_tokens: int) -> RequestResult:
    async for item in service.stream(prompt, max_tokens=max_tokens, temperature=0.0):
        if isinstance(item, RequestResult):
            return item
    raise AssertionError("no result")


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def filling(tiny, tmp_path_factory):
    config = tiny_config(tiny, "draft", "close", k=3, k_max=K_MAX)
    priors = tmp_path_factory.mktemp("fill-priors")
    write_prior(priors / "tiny.json", config, cpu_platform(), made_up_prior(), None)
    mp = pytest.MonkeyPatch()
    mp.setenv("SPEC_EXPLORER_CACHE", str(tmp_path_factory.mktemp("fill-cache")))  # no cost model there
    mp.setenv(PRIORS_ENV, str(priors))
    svc = EngineService(
        background_prompts=BG_PROMPTS,
        policy_options={"default_policy": "auto"},
        idle_fill_options={"quiet_s": 1.0, "period_s": 0.2},
    )
    svc.start(config)
    _wait(lambda: svc.status().state in ("ready", "failed"), 300, "the engine")
    assert svc.status().state == "ready", svc.status()
    assert svc.policy_view().cost_source == "shipped", svc.policy_view()
    yield svc
    svc.close()
    mp.undo()


def test_a_visitors_request_stops_the_idle_measurement_and_never_shares_a_step_with_it(filling):
    svc = filling
    for prompt in ("def fibonacci(n):", "Once upon a time", "def add(a, b):"):
        _wait(lambda: svc.policy_view().filling is not None, 60, "a cell measured in idle time")
        result = asyncio.run(_run(svc, prompt, 24))
        steps = svc.steps_since(0.0)
        mine = [s for s in steps if any(r.request_id == result.request_id for r in s.requests)]
        assert mine, "the visitor's request ran in no step the tap saw"
        assert all(s.profiling_requests == 0 for s in mine), [s.profiling_requests for s in mine]
        mixed = [s for s in steps if 0 < s.profiling_requests < s.batch_size]
        assert mixed == [], f"steps mixing profiling and other requests: {mixed[:3]}"
        assert svc.policy_view().state.spec.kind == "auto"  # the policy in force, applied again


def test_a_policy_chosen_while_a_cell_runs_stops_it_and_is_in_force(filling):
    svc = filling
    _wait(lambda: svc.policy_view().filling is not None, 60, "a cell measured in idle time")
    state = asyncio.run(svc.set_policy(PolicySpec("fixed", 1)))
    assert state is not None and state.spec == PolicySpec("fixed", 1)
    assert svc.policy_view().filling is None  # stopped before the policy was sent
    # requests that come at any moment of a later cell (its start, its steps, its end) run under K=1
    for delay_s in (0.0, 0.1, 0.3, 0.6):
        _wait(lambda: svc.policy_view().filling is not None, 60, "the next cell")
        time.sleep(delay_s)
        result = asyncio.run(_run(svc, "def add(a, b):", 16))
        mine = [s for s in svc.steps_since(0.0) if any(r.request_id == result.request_id for r in s.requests)]
        drafting = [s.k for s in mine if s.num_drafted]
        assert drafting and set(drafting) == {1}, (delay_s, [(s.k, s.num_drafted) for s in mine])
        assert svc.policy_view().state.spec == PolicySpec("fixed", 1)
    assert asyncio.run(svc.set_policy(PolicySpec("auto"))).spec.kind == "auto"


def test_idle_time_fills_the_cells_traffic_has_not_reached(filling):
    svc = filling
    # every cell measured (or tried twice) in idle time, with no visitor's request at all
    _wait(lambda: not svc.live_policy.fill_left() and svc.policy_view().filling is None, 240, "every cell measured")
    view = svc.policy_view()
    assert view.cost_source == "learned", view
    assert "learned since from" in view.cost_note, view.cost_note
    learned = re.search(r"learned since from [\d,]+ engine steps in (\d+) cells?", view.cost_note)
    assert learned and int(learned[1]) >= len(CELLS) - 2, view.cost_note
    assert view.state.spec.kind == "auto", view.state
    assert svc.idle_fill.cells_started >= len(CELLS) - 2
    mixed = [s for s in svc.steps_since(0.0) if 0 < s.profiling_requests < s.batch_size]
    assert mixed == []


def test_a_second_launch_scales_the_prior_by_the_cells_the_first_timed(filling, tiny):
    """The cells a launch timed against the prior are kept beside the cost cache: the next launch on
    the same machine scales the same prior by them and times nothing (the warm start's seconds)."""
    svc = filling
    kept = list((Path(os.environ["SPEC_EXPLORER_CACHE"]) / "cost").glob(f"*{TIMING_SUFFIX}"))
    assert len(kept) == 1, kept
    before = kept[0].read_text()
    svc.start(tiny_config(tiny, "draft", "close", k=3, k_max=K_MAX)).result(timeout=300)
    assert svc.status().state == "ready", svc.status()
    view = svc.policy_view()
    assert view.cost_source in ("shipped", "learned"), view
    assert "cells an earlier launch timed on this machine" in view.cost_note, view.cost_note
    assert kept[0].read_text() == before  # nothing timed again
