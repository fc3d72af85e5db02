"""The scheduler tap under async scheduling, which vLLM's CPU platform never runs (it forces sync).

On a GPU vLLM schedules step N+1 before it processes step N's output: the scheduler's drafts are
``-1`` placeholders (``AsyncScheduler``), a request that finishes in N is scheduled once more in
N+1 (and skipped there by vLLM), and a control command sent between the two schedules belongs to
N+1. Here the plugin's real mixins run over a stand-in for vLLM's scheduler built from vLLM's own
dataclasses (``SchedulerOutput``, ``ModelRunnerOutput``, ``Request``, ``EngineCoreOutput``), in
that order: schedule N, schedule N+1, update N, update N+1; the tap's messages are read from a
real ZMQ socket and decoded with ``wire.decode_step``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import zmq

pytest.importorskip("vllm")
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from engine_adapter.vllm_plugin.policy_hooks import PolicyHooksMixin  # noqa: E402
from engine_adapter.vllm_plugin.side_channel import VERIFIED_ATTR  # noqa: E402
from engine_adapter.vllm_plugin.tap import TapMixin, exact_drafts, unprocessed  # noqa: E402
from engine_adapter.vllm_plugin.wire import CONTROL_ADDR_ENV, TAP_ADDR_ENV, decode_step, encode_control  # noqa: E402

STOP = 2  # the stand-in's end-of-sequence id
PLACEHOLDER = -1  # vLLM's AsyncScheduler's draft placeholder


class AsyncOrderScheduler:
    """What the mixins use of vLLM's scheduler; ``update_from_output`` follows vLLM 0.32's rules
    for what it skips (gone or finished requests) and what it emits (sampled ids, to a stop)."""

    def __init__(self, num_spec_tokens: int = 3, use_v2_model_runner: bool = False) -> None:
        self.vllm_config = SimpleNamespace(
            parallel_config=SimpleNamespace(worker_cls="vllm.v1.worker.gpu_worker.Worker"),
            speculative_config=SimpleNamespace(uses_draft_model=lambda: True, max_num_new_slots_for_drafting=1),
        )
        self.scheduler_config = SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=256)
        self.num_spec_tokens = num_spec_tokens
        self.dynamic_sd_lookup = [num_spec_tokens] * 9  # a K table (opens the control channel)
        self.use_v2_model_runner = use_v2_model_runner  # vLLM's Scheduler sets it from the config
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.script: list[SchedulerOutput] = []

    def add(self, rid: str) -> None:
        r = Request(
            request_id=rid,
            prompt_token_ids=[1, 1, 1, 1],
            sampling_params=SamplingParams(max_tokens=64),
            pooling_params=None,
        )
        r.status = RequestStatus.RUNNING
        self.requests[rid] = r
        self.running.append(r)

    def schedule(self, *args, **kwargs) -> SchedulerOutput:
        return self.script.pop(0)

    def update_from_output(self, scheduler_output, model_runner_output) -> dict:
        outputs = []
        for rid in scheduler_output.num_scheduled_tokens:
            r = self.requests.get(rid)
            if r is None or r.is_finished():
                continue  # vLLM's rule: already finished (async scheduling) or aborted
            ids = model_runner_output.sampled_token_ids[model_runner_output.req_id_to_index[rid]]
            if STOP in ids:
                ids[:] = ids[: ids.index(STOP) + 1]  # vLLM truncates in place at a stop
                r.status = RequestStatus.FINISHED_STOPPED
                self.running.remove(r)
            outputs.append(
                EngineCoreOutput(
                    request_id=rid,
                    new_token_ids=list(ids),
                    finish_reason=FinishReason.STOP if r.is_finished() else None,
                )
            )
        return {0: EngineCoreOutputs(outputs=outputs)}

    def shutdown(self) -> None:
        pass


class Plugged(PolicyHooksMixin, TapMixin, AsyncOrderScheduler):
    """The plugin's order, as in schedulers.py."""


def scheduled(drafts: dict[str, int], k: int = 3) -> SchedulerOutput:
    """A decode step: each request 1 + its drafts' tokens, the drafts as async placeholders."""
    rids = list(drafts)
    return SchedulerOutput(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData(
            req_ids=rids,
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[None] * len(rids),
            num_computed_tokens=[10] * len(rids),
            num_output_tokens=[0] * len(rids),
        ),
        num_scheduled_tokens={rid: 1 + n for rid, n in drafts.items()},
        total_num_scheduled_tokens=sum(1 + n for n in drafts.values()),
        scheduled_spec_decode_tokens={rid: [PLACEHOLDER] * n for rid, n in drafts.items() if n},
        scheduled_encoder_inputs={},
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
        num_spec_tokens_to_schedule=k,
    )


def worker_output(sampled: dict[str, list[int]], verified: dict[str, list[int]] | None) -> ModelRunnerOutput:
    rids = list(sampled)
    out = ModelRunnerOutput(
        req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)}, sampled_token_ids=[sampled[r] for r in rids]
    )
    if verified is not None:
        setattr(out, VERIFIED_ATTR, verified)
    return out


@pytest.fixture
def sockets(tmp_path, monkeypatch):
    ctx = zmq.Context.instance()
    sub, push = ctx.socket(zmq.SUB), ctx.socket(zmq.PUSH)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    tap_addr, control_addr = f"ipc://{tmp_path}/tap", f"ipc://{tmp_path}/control"
    sub.bind(tap_addr)
    push.bind(control_addr)
    monkeypatch.setenv(TAP_ADDR_ENV, tap_addr)
    monkeypatch.setenv(CONTROL_ADDR_ENV, control_addr)
    yield sub, push
    sub.close(0)
    push.close(0)


def received(sub, n: int) -> list:
    steps = []
    while len(steps) < n and sub.poll(2000):
        steps.append(decode_step(sub.recv()))
    return steps


def started(sockets) -> Plugged:
    sched = Plugged()
    for rid in ("a", "b"):
        sched.add(rid)
    # a bound SUB attaches a connecting PUB (and sends it the subscription) only when it is used
    sockets[0].poll(300)
    time.sleep(0.1)
    return sched


def test_async_order_publishes_exact_drafts_skips_finished_and_acknowledges_per_step(sockets) -> None:
    sub, push = sockets
    sched = started(sockets)
    # schedule N: a and b draft 3 each (placeholders on the scheduler's side)
    sched.script.append(scheduled({"a": 3, "b": 3}))
    out_n = sched.schedule()
    # a control command arrives between the two schedules: it belongs to step N+1
    push.send(encode_control({"catch_up": 64}))
    time.sleep(0.2)
    sched.script.append(scheduled({"a": 3, "b": 3}))
    out_n1 = sched.schedule()
    # update N: a keeps 2 of [11, 12, 13] and stops (its third sampled id is the stop); b keeps 1
    sched.update_from_output(
        out_n, worker_output({"a": [11, 12, STOP], "b": [21, 99]}, {"a": [11, 12, 13], "b": [21, 22, 23]})
    )
    # update N+1: a finished in N (vLLM skips it); b's report is missing: counts only
    sched.update_from_output(out_n1, worker_output({"a": [7], "b": [31, 32, 33, 34]}, None))
    step_n, step_n1 = received(sub, 2)

    a, b = step_n.reqs
    assert (a.drafted, a.num_drafted, a.accepted, a.emitted, a.finish_reason) == (
        [11, 12, 13],
        3,
        2,
        [11, 12, STOP],
        "stop",
    )
    assert (b.drafted, b.accepted, b.emitted) == ([21, 22, 23], 1, [21, 99])
    assert [r.engine_request_id for r in step_n1.reqs] == ["b"]  # a was not published again
    assert (step_n1.batch_size, step_n1.skipped, step_n.skipped) == (2, ["a"], [])  # scheduled, named as skipped
    (b1,) = step_n1.reqs
    assert (b1.drafted, b1.num_drafted, b1.accepted) == (None, 3, 3)  # a count, never a placeholder
    assert PLACEHOLDER not in [t for s in (step_n, step_n1) for r in s.reqs for t in (r.drafted or [])]
    assert (step_n.controls, step_n1.controls) == (0, 1)  # the command acknowledged by N+1 only


def test_tap_refuses_model_runner_v2() -> None:
    with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        Plugged(use_v2_model_runner=True)


@pytest.mark.parametrize(
    "verified, rid, num_drafted, expected",
    [
        ({"a": [1, 2, 3]}, "a", 3, [1, 2, 3]),  # the worker's ids
        ({"a": [1, 2, 3]}, "a", 0, []),  # no drafts verified
        (None, "a", 3, None),  # no report: the count only
        ({}, "a", 3, None),  # not in the report
        ({"a": [1, 2]}, "a", 3, None),  # a report that does not match vLLM's count
    ],
)
def test_exact_drafts(verified, rid, num_drafted, expected) -> None:
    assert exact_drafts(verified, rid, num_drafted) == expected


def test_unprocessed_are_the_requests_vllm_skips() -> None:
    sched = AsyncOrderScheduler()
    for rid in ("live", "done", "stale"):
        sched.add(rid)
    sched.requests["done"].status = RequestStatus.FINISHED_LENGTH_CAPPED
    sched.requests["stale"].num_stale_output_tokens, sched.requests["stale"].drop_stale_output = 1, True
    out = scheduled({"live": 1, "done": 1, "stale": 1, "gone": 1})
    assert unprocessed(out, sched.requests) == {"done", "stale", "gone"}
