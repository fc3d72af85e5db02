"""What the worker hands back to the scheduler beside vLLM's output: the exact drafts it verified, and more.

Contract: the worker's mixins (``lossy_sampler.py``, ``idle_drafter.py``) call
``attach(out, attributes)`` on what ``sample_tokens`` returns, where ``attributes(output)`` gives
``{name: value}`` for the resolved ``ModelRunnerOutput``. The names are extra attributes that
pickle with the output to the scheduler's process (``update_from_output`` reads them with
``getattr``); vLLM reads none of them. Two shapes of output, one rule:

- a ``ModelRunnerOutput`` (synchronous scheduling, the only mode vLLM's CPU platform runs): the
  attributes are set at once, never on vLLM's shared ``EMPTY_MODEL_RUNNER_OUTPUT``;
- an ``AsyncModelRunnerOutput`` (async scheduling on a GPU: the sampled ids are still being
  copied to the host): it is wrapped in ``DeferredAttributes``, whose ``get_output`` resolves
  vLLM's output first, then sets them. vLLM's executors call ``get_output`` once per step.

``VerifiedDrafts`` is the step's drafts as the rejection sampler saw them: ``capture`` at the
sampler (``draft_token_ids`` [sum of num_draft_tokens] on the model's device, ``num_draft_tokens``
[num_reqs] in the input batch's order), ``by_request(req_ids)`` once the output is resolved.
On a GPU the ids are copied to the host without waiting (a device event marks the copy's end),
so capturing them does not stall async scheduling. Why: under async scheduling the scheduler's
``spec_token_ids`` are ``-1`` placeholders (vLLM's ``AsyncScheduler``); the worker is the only
place that knows which ids it verified (``VERIFIED_ATTR``).

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput

from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release

# on ModelRunnerOutput: {request id: [draft ids verified in the step]}; requests without drafts absent
VERIFIED_ATTR = "spec_explorer_verified"

Attributes = Callable[[ModelRunnerOutput], dict[str, Any]]


def split_by_request(flat: Sequence[int], num_draft_tokens: Sequence[int], req_ids: Sequence[str]) -> dict[str, list]:
    """``flat`` [sum(num_draft_tokens)] cut into each request's drafts, {request id: ids} for the
    requests with at least one (rows beyond ``req_ids`` are dropped). ValueError when the counts
    do not add up to the ids: a report that does not check out is not sent."""
    if sum(num_draft_tokens) != len(flat):
        raise ValueError(f"{len(flat)} draft ids for counts adding up to {sum(num_draft_tokens)}")
    out: dict[str, list] = {}
    start = 0
    for rid, n in zip(req_ids, num_draft_tokens):
        if n:
            out[rid] = [int(t) for t in flat[start : start + n]]
        start += n
    return out


@dataclass
class VerifiedDrafts:
    """One step's verified drafts on their way to the host."""

    ids: torch.Tensor  # [sum(num_draft_tokens)] on the host (the device copy may still be landing)
    num_draft_tokens: list[int]  # [num_reqs], input-batch order
    ready: Any = None  # a device event the copy completes at; None for ids already on the host

    @classmethod
    def capture(cls, draft_token_ids: torch.Tensor, num_draft_tokens: Sequence[int]) -> VerifiedDrafts:
        counts = [int(n) for n in num_draft_tokens]
        if draft_token_ids.device.type != "cuda":
            return cls(draft_token_ids.detach().to("cpu", copy=True), counts)
        host = torch.empty(draft_token_ids.shape, dtype=draft_token_ids.dtype, pin_memory=True)
        host.copy_(draft_token_ids, non_blocking=True)
        ready = torch.cuda.Event(blocking=True)  # as vLLM's own copies: wait without spinning
        ready.record()
        return cls(host, counts, ready)

    def by_request(self, req_ids: Sequence[str]) -> dict[str, list]:
        if self.ready is not None:
            self.ready.synchronize()
        return split_by_request(self.ids.tolist(), self.num_draft_tokens, req_ids)


class DeferredAttributes(AsyncModelRunnerOutput):
    """vLLM's async output, with our attributes set on what it resolves to."""

    def __init__(self, inner: AsyncModelRunnerOutput, attributes: Attributes) -> None:
        self._inner = inner
        self._attributes = attributes

    def get_output(self) -> ModelRunnerOutput:
        return attach(self._inner.get_output(), self._attributes)


def attach(out, attributes: Attributes):
    """``out`` with ``attributes(output)`` set on its ``ModelRunnerOutput`` (now, or when resolved)."""
    if isinstance(out, AsyncModelRunnerOutput):
        return DeferredAttributes(out, attributes)
    if isinstance(out, ModelRunnerOutput) and out is not EMPTY_MODEL_RUNNER_OUTPUT:
        for name, value in attributes(out).items():
            setattr(out, name, value)
    return out
