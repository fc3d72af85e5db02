"""The scheduler's side of the idle drafter's catch-up (engine_adapter/vllm_plugin/policy_hooks.py).

The plugin's mixins on a stand-in for vLLM's scheduler that replays scripted steps: each step a
real ``SchedulerOutput`` (vLLM's own dataclasses: new requests with their first position, cached
ones with theirs, the step's K), and the worker's answer on a real ``ModelRunnerOutput``. Checked:
where holes open and grow (K=0), what each K>0 step plans (whole holes, oldest first, within the
budget and the step's unused tokens), that only what the worker re-ran closes, and that a holed
request's drafts are trimmed until then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

from engine_adapter.vllm_plugin.catch_up import (  # noqa: E402
    APPLIED_ATTR,
    PASS_SKIPPED_ATTR,
    PLAN_ATTR,
    ZEROED_ATTR,
    Missed,
)
from engine_adapter.vllm_plugin.paths import IDLE_DRAFTER_WORKERS  # noqa: E402
from engine_adapter.vllm_plugin.policy_hooks import PolicyHooksMixin  # noqa: E402
from engine_adapter.vllm_plugin.tap import TapMixin  # noqa: E402
from engine_adapter.vllm_plugin.wire import CATCH_UP_TOKENS_ENV  # noqa: E402


@dataclass
class Request:
    request_id: str
    num_computed_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)


def step_output(k: int, segments: dict[str, tuple[int, int]], new: frozenset[str] = frozenset()) -> SchedulerOutput:
    """One step: ``segments[rid] = (first position, tokens scheduled)``; ``new`` are first scheduled."""
    new_reqs = [
        NewRequestData(
            req_id=rid,
            prompt_token_ids=[0] * n,
            mm_features=[],
            sampling_params=None,
            pooling_params=None,
            block_ids=([],),
            num_computed_tokens=s0,
            lora_request=None,
        )
        for rid, (s0, n) in segments.items()
        if rid in new
    ]
    cached = [(rid, s0) for rid, (s0, _n) in segments.items() if rid not in new]
    return SchedulerOutput(
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=CachedRequestData(
            req_ids=[rid for rid, _ in cached],
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[None] * len(cached),
            num_computed_tokens=[s0 for _, s0 in cached],
            num_output_tokens=[0] * len(cached),
        ),
        num_scheduled_tokens={rid: n for rid, (_s0, n) in segments.items()},
        total_num_scheduled_tokens=sum(n for _s0, n in segments.values()),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
        num_spec_tokens_to_schedule=k,
    )


class ScriptedScheduler:
    """What the mixins use of vLLM's Scheduler; ``schedule()`` returns the next scripted step."""

    def __init__(self, max_num_batched_tokens: int = 256) -> None:
        self.vllm_config = SimpleNamespace(
            parallel_config=SimpleNamespace(worker_cls=IDLE_DRAFTER_WORKERS["cpu"]),
            speculative_config=SimpleNamespace(uses_draft_model=lambda: True, max_num_new_slots_for_drafting=1),
        )
        self.scheduler_config = SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens)
        self.num_spec_tokens = 3
        self.dynamic_sd_lookup = None  # no table: the lookup correction stays out of these cases
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.script: list[SchedulerOutput] = []
        self.caught_up_seen: list[dict[str, int]] = []  # what the tap would publish, per step
        self.across_seen: list[set[str]] = []  # requests whose verified drafts were made across a hole

    def schedule(self, *args, **kwargs) -> SchedulerOutput:
        return self.script.pop(0)

    def update_from_output(self, scheduler_output, model_runner_output) -> dict:
        context = self.step_context(scheduler_output)
        self.caught_up_seen.append({r: context.caught_up.get(r, 0) for r in scheduler_output.num_scheduled_tokens})
        self.across_seen.append({r for r in scheduler_output.num_scheduled_tokens if r in context.holed})
        return {}

    def shutdown(self) -> None:
        pass


class Plugged(PolicyHooksMixin, TapMixin, ScriptedScheduler):
    """The plugin's order, as in schedulers.py."""


def worker_output(applied: dict[str, int] | None, zeroed: bool = False) -> ModelRunnerOutput:
    out = ModelRunnerOutput(req_ids=[], req_id_to_index={})
    if applied is not None:
        setattr(out, APPLIED_ATTR, applied)
    if zeroed:
        setattr(out, ZEROED_ATTR, True)
    return out


def run_steps(sched: Plugged, steps: list[tuple], blanked: bool = True) -> list[dict | None]:
    """steps: (K, segments, new, worker's applied); returns each step's plan. ``blanked``: the
    worker reports the skipped slots of each K=0 step written with zeros (the idle drafter does)."""
    plans = []
    for k, segments, new, applied in steps:
        sched.script.append(step_output(k, segments, frozenset(new)))
        out = sched.schedule()
        plans.append(getattr(out, PLAN_ATTR, None))
        sched.update_from_output(out, worker_output(applied, zeroed=blanked and k == 0))
    return plans


@pytest.mark.parametrize(
    "budget, slack_tokens, steps, plans, holes",
    [
        # two K=0 decode steps open a hole at 10 and grow it; the K>0 step plans 10-11, the worker re-runs it
        (
            128,
            256,
            [(0, {"a": (10, 1)}, (), None), (0, {"a": (11, 1)}, (), None), (3, {"a": (12, 1)}, (), {"a": 2})],
            [None, None, {"a": (10, 2)}],
            {},
        ),
        # the worker did not re-run it: the hole stays, reaching up to the next segment
        (
            128,
            256,
            [(0, {"a": (10, 1)}, (), None), (3, {"a": (11, 1)}, (), {}), (3, {"a": (12, 1)}, (), {"a": 2})],
            [None, {"a": (10, 1)}, {"a": (10, 2)}],
            {},
        ),
        # a prefill at K=0: the hole is the whole prompt, caught up at the next K>0 step
        (128, 256, [(0, {"p": (0, 5)}, ("p",), None), (3, {"p": (5, 1)}, (), {"p": 5})], [None, {"p": (0, 5)}], {}),
        # over the budget: never planned, the hole stays
        (
            2,
            256,
            [(0, {"a": (10, 3)}, (), None), (3, {"a": (13, 1)}, (), None)],
            [None, None],
            {"a": Missed(10, 12, 1)},
        ),
        # budget 0: the old drop rule
        (
            0,
            256,
            [(0, {"a": (10, 1)}, (), None), (3, {"a": (11, 1)}, (), None)],
            [None, None],
            {"a": Missed(10, 10, 1)},
        ),
        # oldest hole first: b's (opened first, 2 tokens) takes the budget of 2, a's (1 token) waits
        (
            2,
            256,
            [
                (0, {"b": (20, 1)}, (), None),
                (0, {"b": (21, 1), "a": (10, 1)}, (), None),
                (3, {"a": (11, 1), "b": (22, 1)}, (), {"b": 2}),
            ],
            [None, None, {"b": (20, 2)}],
            {"a": Missed(10, 10, 2)},
        ),
        # the step's unused token budget bounds it: 8 - 1 scheduled - 1 draft slot = 6 < 7
        (
            128,
            8,
            [(0, {"a": (10, 7)}, (), None), (3, {"a": (17, 1)}, (), None)],
            [None, None],
            {"a": Missed(10, 16, 1)},
        ),
        # preempted and recomputed from 0 at K>0: the pass rewrites everything, no hole, no plan
        (128, 256, [(0, {"a": (10, 1)}, (), None), (3, {"a": (0, 11)}, ("a",), None)], [None, None], {}),
    ],
)
def test_holes_open_at_k0_and_close_when_the_worker_caught_them_up(
    monkeypatch, budget, slack_tokens, steps, plans, holes
):
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, str(budget))
    sched = Plugged(max_num_batched_tokens=slack_tokens)
    assert run_steps(sched, steps) == plans
    assert sched._missed == holes


def test_the_tap_sees_the_catch_up_in_its_step_only(monkeypatch):
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, "128")
    sched = Plugged()
    run_steps(sched, [(0, {"a": (10, 1)}, (), None), (3, {"a": (11, 1)}, (), {"a": 1}), (3, {"a": (12, 4)}, (), None)])
    assert sched.caught_up_seen == [{"a": 0}, {"a": 1}, {"a": 0}]


def test_a_holed_request_gets_no_drafts_until_caught_up(monkeypatch):
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, "128")
    sched = Plugged()
    a = Request("a", 11, [7, 8, 9])
    sched.running = [a]
    run_steps(sched, [(0, {"a": (10, 1)}, (), None)])
    a.spec_token_ids = [7, 8, 9]  # the drafter proposed for it anyway (a K>0 pass with the hole)
    run_steps(sched, [(3, {"a": (11, 1)}, (), {})])  # planned, not re-run
    assert a.spec_token_ids == []  # trimmed at the step's start
    a.spec_token_ids = [7, 8, 9]
    run_steps(sched, [(3, {"a": (12, 1)}, (), {"a": 2})])  # trimmed again, then caught up
    assert a.spec_token_ids == []
    a.spec_token_ids = [7, 8, 9]  # proposed after the catch-up: kept
    run_steps(sched, [(3, {"a": (13, 4)}, (), None)])
    assert a.spec_token_ids == [7, 8, 9] and not sched._missed


@pytest.mark.parametrize(
    "budget, computed, blanked, hole",
    [
        (128, 14, True, "catch_up"),  # a hole of 4 from position 10: caught up in the next step
        (4, 14, True, "catch_up"),
        (3, 14, True, "drafts_across"),  # longer than the budget, zeros in it: drafts across it
        (3, 14, False, "no_drafts"),  # longer than the budget, and maybe another request's KV in it
        (0, 14, True, "drafts_across"),  # no catch-up at all
        (0, 14, False, "no_drafts"),
        (0, 10, True, "none"),  # recomputed from the hole's start (preempted): no hole
    ],
)
def test_what_a_hole_means_for_a_requests_drafts(monkeypatch, budget, computed, blanked, hole):
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, str(budget))
    sched = Plugged()
    run_steps(sched, [(0, {"a": (10, 1)}, (), None)], blanked=blanked)
    assert sched._hole(Request("a", computed)) == hole


@pytest.mark.parametrize("blanked, kept", [(True, [7, 8, 9]), (False, [])])
def test_a_hole_over_the_budget_is_drafted_across_only_when_blanked(monkeypatch, blanked, kept):
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, "2")
    sched = Plugged()
    a = Request("a", 13)
    sched.running = [a]
    run_steps(sched, [(0, {"a": (10, 1)}, (), None), (0, {"a": (11, 1)}, (), None)], blanked=blanked)
    a.spec_token_ids = [7, 8, 9]  # a hole of 3 (10-12) > 2: never planned
    assert run_steps(sched, [(3, {"a": (13, 1)}, (), None)]) == [None]
    assert a.spec_token_ids == kept and "a" in sched._missed  # the hole stays, drafted across or not


def test_a_catch_up_clears_an_unblanked_hole(monkeypatch):
    """Once re-run, the hole's slots hold the request's own KV, blanked or not before."""
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, "128")
    sched = Plugged()
    a = Request("a", 12)
    sched.running = [a]
    run_steps(sched, [(0, {"a": (10, 1)}, (), None), (0, {"a": (11, 1)}, (), None)], blanked=False)
    assert sched._hole(a) == "catch_up"
    run_steps(sched, [(3, {"a": (12, 1)}, (), {"a": 2})])
    a.num_computed_tokens = 13
    assert sched._hole(a) == "none" and not sched._unblanked


def test_drafts_verified_where_a_hole_opens_were_made_before_it(monkeypatch):
    """The step that opens a hole (K=0) verifies drafts proposed before it; the next step's were
    proposed across it (a hole over the budget of 0: drafted across)."""
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, "0")
    sched = Plugged()
    run_steps(sched, [(3, {"a": (10, 4)}, (), None), (0, {"a": (14, 2)}, (), None), (3, {"a": (16, 1)}, (), None)])
    assert sched.across_seen == [set(), set(), {"a"}]


@pytest.mark.parametrize("budget, hole", [(128, "catch_up"), (0, "no_drafts")])
def test_a_draft_pass_vllm_skipped_at_k_above_0_opens_unblanked_holes(monkeypatch, budget, hole):
    """vLLM skips the draft pass for the whole batch when one input is too long for the drafter:
    nothing was written or blanked for anyone, so each request has a hole that may hold stale KV."""
    monkeypatch.setenv(CATCH_UP_TOKENS_ENV, str(budget))
    sched = Plugged()
    sched.script.append(step_output(3, {"a": (10, 1), "b": (20, 1)}))
    out = sched.schedule()
    skipped = worker_output(None)
    setattr(skipped, PASS_SKIPPED_ATTR, True)
    sched.update_from_output(out, skipped)
    assert sched._missed == {"a": Missed(10, 10, 1), "b": Missed(20, 20, 1)}
    assert sched._unblanked == {"a", "b"}
    assert sched._hole(Request("a", 11)) == hole
