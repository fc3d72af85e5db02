"""The worker's side channel (engine_adapter/vllm_plugin/side_channel.py) and the worker mixins' checks.

The exact drafts are cut per request; attributes reach a synchronous ``ModelRunnerOutput`` at
once and an async one when vLLM resolves it (the GPU's async scheduling, which the CPU platform
never runs); the rejection sampler's wrapper captures what it verified; the idle drafter refuses
a model runner it cannot wrap (vLLM's Model Runner V2 has a ``speculator``, not a ``drafter``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")
import torch  # noqa: E402
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput  # noqa: E402

from engine_adapter.acceptance_rule import LOSSLESS  # noqa: E402
from engine_adapter.vllm_plugin.idle_drafter import model_drafter  # noqa: E402
from engine_adapter.vllm_plugin.lossy_sampler import RuleStep, report, rule_aware  # noqa: E402
from engine_adapter.vllm_plugin.side_channel import (  # noqa: E402
    VERIFIED_ATTR,
    DeferredAttributes,
    VerifiedDrafts,
    attach,
    split_by_request,
)


@pytest.mark.parametrize(
    "flat, counts, req_ids, expected",
    [
        ([5, 6, 7, 8], [3, 0, 1], ["a", "b", "c"], {"a": [5, 6, 7], "c": [8]}),
        ([], [0, 0], ["a", "b"], {}),
        ([1, 2], [2], ["a", "b"], {"a": [1, 2]}),  # fewer rows than requests
        ([9], [1, 0], ["a"], {"a": [9]}),  # a row beyond the ids is dropped
    ],
)
def test_split_by_request(flat, counts, req_ids, expected) -> None:
    assert split_by_request(flat, counts, req_ids) == expected


def test_split_refuses_counts_that_do_not_add_up() -> None:
    with pytest.raises(ValueError, match="3 draft ids"):
        split_by_request([1, 2, 3], [2, 2], ["a", "b"])


def test_captured_ids_are_a_copy() -> None:
    ids = torch.tensor([4, 5, 6], dtype=torch.int32)
    v = VerifiedDrafts.capture(ids, [2, 1])
    ids.fill_(-1)  # vLLM reuses its input buffers in the next step
    assert v.by_request(["a", "b"]) == {"a": [4, 5], "b": [6]}


def output(req_ids: list[str]) -> ModelRunnerOutput:
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)})


class Pending(AsyncModelRunnerOutput):
    """vLLM's async output stand-in: resolves once, to ``out``."""

    def __init__(self, out: ModelRunnerOutput) -> None:
        self.out, self.calls = out, 0

    def get_output(self) -> ModelRunnerOutput:
        self.calls += 1
        return self.out


def test_attach_sets_now_on_a_sync_output_and_never_on_the_shared_empty_one() -> None:
    out = attach(output(["a"]), lambda o: {VERIFIED_ATTR: {o.req_ids[0]: [1]}})
    assert getattr(out, VERIFIED_ATTR) == {"a": [1]}
    assert attach(EMPTY_MODEL_RUNNER_OUTPUT, lambda o: {VERIFIED_ATTR: {}}) is EMPTY_MODEL_RUNNER_OUTPUT
    assert not hasattr(EMPTY_MODEL_RUNNER_OUTPUT, VERIFIED_ATTR)


def test_attach_defers_on_an_async_output_until_vllm_resolves_it() -> None:
    pending = Pending(output(["a", "b"]))
    wrapped = attach(pending, lambda o: {VERIFIED_ATTR: {r: [] for r in o.req_ids}})
    assert isinstance(wrapped, DeferredAttributes) and isinstance(wrapped, AsyncModelRunnerOutput)
    assert pending.calls == 0 and not hasattr(pending.out, VERIFIED_ATTR)
    resolved = wrapped.get_output()
    assert pending.calls == 1 and getattr(resolved, VERIFIED_ATTR) == {"a": [], "b": []}
    # the worker's two mixins each wrap: both sets of attributes arrive
    twice = attach(attach(Pending(output(["a"])), lambda o: {"x": 1}), lambda o: {"y": 2})
    resolved = twice.get_output()
    assert (resolved.x, resolved.y) == (1, 2)


def test_the_sampler_wrapper_captures_the_verified_drafts() -> None:
    step = RuleStep(rule=LOSSLESS)
    calls = []

    def vllm_rejection_sample(draft_ids, num_draft, *rest, **kwargs):
        calls.append(draft_ids)
        return "vllm's rows"

    wrapped = rule_aware(vllm_rejection_sample, step)
    ids = torch.tensor([11, 12, 21], dtype=torch.int32)
    meta = SimpleNamespace(all_greedy=True)
    assert wrapped(ids, [2, 0, 1], 2, None, None, None, None, meta) == "vllm's rows"
    assert step.verified.by_request(["a", "b", "c"]) == {"a": [11, 12], "c": [21]}
    assert report(["a", "b", "c"], {}, step.verified) == {VERIFIED_ATTR: {"a": [11, 12], "c": [21]}}
    assert report(["a"], {}, VerifiedDrafts(torch.tensor([1, 2]), [1])) == {}  # does not add up: no report


def spec(draft_model: bool = True, eagle: bool = False) -> SimpleNamespace:
    return SimpleNamespace(uses_draft_model=lambda: draft_model, use_eagle=lambda: eagle)


@pytest.mark.parametrize(
    "runner, speculative, wraps",
    [
        (SimpleNamespace(drafter=SimpleNamespace(propose=lambda **kw: None)), spec(), True),  # Model Runner V1
        (SimpleNamespace(drafter=None), spec(draft_model=False), False),  # ngram: nothing to idle
        (SimpleNamespace(), None, False),  # no speculation
    ],
)
def test_model_drafter(runner, speculative, wraps) -> None:
    assert (model_drafter(runner, speculative) is not None) is wraps


@pytest.mark.parametrize(
    "runner",
    [
        SimpleNamespace(speculator=object()),  # Model Runner V2: a speculator, no drafter
        SimpleNamespace(drafter=None),
        SimpleNamespace(drafter=object()),  # no propose() to wrap
    ],
)
def test_the_idle_drafter_refuses_a_runner_without_a_drafter(runner) -> None:
    with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        model_drafter(runner, spec(eagle=True, draft_model=False))
