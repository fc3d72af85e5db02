"""A cold start on tiny engines (no cost model cached): the cost model is measured before the
service takes visitors' requests, no visitor request shares a profiling step, the start policy
(auto) is in force afterwards, the measured model learns from traffic and from the cells idle
time measures around auto's choices, and measuring again waits for the requests in flight."""

from __future__ import annotations

import asyncio
import collections
import re
import time

import pytest

from engine_adapter.policy.cost_learning import MIN_LEARN_SAMPLES, CostLearner
from engine_adapter.policy.profile_grid import default_grid
from engine_adapter.records import RequestResult
from engine_adapter.service.engine_service import EngineService
from tests.support.fixtures import tiny_config

BG_PROMPTS = ["def add(a, b):", "The quick brown fox"]


def _profiling_steps_hold_only_profiling_requests(service: EngineService) -> int:
    steps = service.steps_since(0.0)
    mixed = [s for s in steps if 0 < s.profiling_requests < s.batch_size]
    assert mixed == [], f"steps mixing profiling and other requests: {mixed[:3]}"
    return sum(1 for s in steps if s.profiling_requests)


async def _run(service: EngineService, prompt: str, max_tokens: int) -> RequestResult:
    async for item in service.stream(prompt, max_tokens=max_tokens, temperature=0.0):
        if isinstance(item, RequestResult):
            return item
    raise AssertionError("no result")


@pytest.fixture(scope="module")
def cold_service(tiny, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SPEC_EXPLORER_CACHE", str(tmp_path_factory.mktemp("cold-cache")))  # no cost model there
    # remeasure_interval_s=0: this module measures again at once (the app keeps MIN_REMEASURE_INTERVAL_S)
    # learn_s=2: the model learns from traffic within seconds (the app refits every LEARN_S);
    # idle time counts after 1 s (the app waits idle_fill.QUIET_S): every test here meets idle cells
    svc = EngineService(
        background_prompts=BG_PROMPTS,
        policy_options={"default_policy": "auto", "learn_s": 2.0},
        idle_fill_options={"quiet_s": 1.0, "period_s": 0.2},
        remeasure_interval_s=0.0,
    )
    seen: list[tuple[str, str | None, str | None]] = []  # (state, progress stage, policy cost source)
    # a draft equal to the target: drafting pays at every batch size, so auto drafts
    svc.start(tiny_config(tiny, "draft", "close", k=3, k_max=5))
    deadline = time.monotonic() + 300
    while svc.status().state != "ready" and time.monotonic() < deadline:
        st = svc.status()
        seen.append((st.state, st.progress.stage if st.progress else None, svc.policy_view().cost_source))
        time.sleep(0.1)
    yield svc, seen
    svc.close()
    mp.undo()


def test_the_service_is_ready_only_after_measuring(cold_service):
    svc, seen = cold_service
    assert svc.status().state == "ready", svc.status()
    stages = [stage for state, stage, _ in seen if state == "starting"]
    assert "measure" in stages, f"no measuring stage before ready: {sorted(set(stages))}"
    assert ("starting", "measure", "measuring") in seen, "the step-time picture never showed cells while measuring"
    v = svc.policy_view()
    # measured by this launch (idle time may have taught it a cell since: then "learned")
    assert v.cost_source in ("profiled", "learned") and v.cost_note.startswith(
        "measured on this machine by this launch"
    )
    missing = set(default_grid(5).cells) - {(p.batch_size, p.k) for p in v.cost.points}
    assert not missing, f"cells not measured (batch size, K): {sorted(missing)}; measured: {v.cost.points}"
    assert v.state.spec.kind == "auto", v.state.spec  # the start policy, once the cost model is there
    assert _profiling_steps_hold_only_profiling_requests(svc) > 20


def test_the_first_request_after_ready_drafts(cold_service):
    svc, _ = cold_service
    result = asyncio.run(_run(svc, "def fibonacci(n):", 32))
    assert "accepted" in result.kinds, result.kinds
    assert _profiling_steps_hold_only_profiling_requests(svc) > 0


def test_the_measured_model_learns_from_traffic_and_not_from_its_own_profile(cold_service):
    svc, _ = cold_service
    asyncio.run(_run(svc, "def fibonacci(n):", 96))
    steps = svc.steps_since(0.0)
    traffic = collections.Counter(
        (s.batch_size, s.k) for s in steps if not s.profiling_requests and CostLearner.counts(s)
    )
    cell, n = traffic.most_common(1)[0]  # one request at the K auto gives it
    assert n > 2 * MIN_LEARN_SAMPLES, traffic  # more than idle time's two tries of a cell could give

    def learned_points() -> int:  # the steps the model in force learned at the traffic's cell
        cost = svc.policy_view().cost
        return next((p.samples for p in cost.points if (p.batch_size, p.k) == cell), 0) if cost else 0

    deadline = time.monotonic() + 60
    while learned_points() < n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert learned_points() >= n, (cell, n, learned_points())
    view = svc.policy_view()
    note = view.cost_note or ""
    learned = re.search(r"^measured on this machine by this launch; learned since from ([\d,]+) engine steps", note)
    assert learned and view.cost_source == "learned", note
    # a refit reads the last learn_s seconds again: the profile's last steps must not count (traffic's
    # and idle time's may)
    over_a_profile = CostLearner(view.cost, True, learns_profiling=False)
    learnable = [s for s in svc.steps_since(0.0) if CostLearner.counts(s) and over_a_profile.learns_from(s)]
    assert 8 <= int(learned[1].replace(",", "")) <= len(learnable), (note, len(learnable))


def test_idle_time_measures_the_ks_around_autos_choices_over_a_profile(cold_service):
    """One request at a time runs one K, and one cell cannot tell a dearer K from a slower machine:
    idle time measures the cells either side of the K the auto table chooses at each of the grid's
    batch sizes, a profile's as a shipped prior's, and the model learns them."""
    svc, _ = cold_service
    deadline = time.monotonic() + 180
    while svc.live_policy.fill_left() or svc.policy_view().filling is not None:
        assert time.monotonic() < deadline, f"idle time left cells unmeasured: {svc.live_policy.fill_left()}"
        time.sleep(0.2)
    view = svc.policy_view()
    assert view.state.spec.kind == "auto", view.state
    steps = svc.steps_since(0.0)
    over_a_profile = CostLearner(view.cost, True, learns_profiling=False)  # takes idle time's steps only
    idle = collections.Counter(
        (s.batch_size, s.k)
        for s in steps
        if s.profiling_requests and CostLearner.counts(s) and over_a_profile.learns_from(s)
    )
    traffic_ks = {s.k for s in steps if not s.profiling_requests and s.batch_size == 1 and CostLearner.counts(s)}
    explored_ks = {k for (b, k), n in idle.items() if b == 1 and n >= MIN_LEARN_SAMPLES}
    assert traffic_ks and explored_ks - traffic_ks, (traffic_ks, idle)  # a K beside the one traffic ran
    around = default_grid(view.k_max).cells_around(view.state.auto.k_by_batch, view.k_max)
    # every batch size of the grid (more besides: a tiny engine runs many steps before a cell's aborted
    # requests leave it, with fewer requests and, once the policy is applied again, at its K)
    assert {b for b, _ in around} <= {b for (b, _), n in idle.items() if n >= MIN_LEARN_SAMPLES}, (around, idle)
    assert re.search(r"learned since from [\d,]+ engine steps in \d+ cells?", view.cost_note or ""), view.cost_note
    _profiling_steps_hold_only_profiling_requests(svc)  # no idle cell shared a step with anyone


def test_measuring_again_waits_for_requests_and_refuses_new_ones(cold_service):
    svc, _ = cold_service

    async def scenario() -> tuple[RequestResult, str]:
        in_flight = asyncio.create_task(_run(svc, "The quick brown fox", 96))
        await asyncio.sleep(0.3)
        await svc.profile_cost()
        assert svc.status().state == "starting"
        refused = ""
        try:
            await _run(svc, "def add(a, b):", 8)
        except RuntimeError as e:
            refused = str(e)
        return await in_flight, refused

    result, refused = asyncio.run(scenario())
    assert "not ready" in refused
    assert result.finish_reason in ("length", "stop")  # the request in flight ran to its end
    deadline = time.monotonic() + 300
    while svc.status().state != "ready" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert svc.status().state == "ready"
    assert svc.policy_view().state.spec.kind == "auto"  # the policy in force came back
    assert _profiling_steps_hold_only_profiling_requests(svc) > 40  # two profiles, no visitor in either


# raising the load lowers the K in force under auto: tests/ui/test_cold_start_browser.py, as the page shows it


def test_a_warm_launch_starts_from_the_acceptance_the_profile_measured(cold_service, tiny):
    """A launch that finds the cost model cached (every start after a machine's first) takes the
    acceptance the profile measured with it, not the 0.5 guess (under which the auto table drafted
    nowhere on the packaged pair, and so never measured anything to correct it)."""
    svc, _ = cold_service
    svc.start(tiny_config(tiny, "draft", "close", k=3, k_max=5)).result(timeout=300)
    assert svc.status().state == "ready", svc.status()
    v = svc.policy_view()
    assert v.cost_source == "cache"
    assert v.state.spec.kind == "auto"
    # no drafts since this launch: the alphas are the profile's (a 'close' draft: 0.6-0.85), not 0.5
    assert v.alphas[0] > 0.55, v.alphas
    assert v.state.auto.k_by_batch[0] > 0, v.state.auto.rows
    result = asyncio.run(_run(svc, "def fibonacci(n):", 32))
    assert "accepted" in result.kinds, result.kinds
