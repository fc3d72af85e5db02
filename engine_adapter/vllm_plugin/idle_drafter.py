"""Idle drafter: a draft model that does no work in steps where K = 0, and catches up after.

vLLM runs a draft model's first pass every step, whatever K the batch-size
table gives, so that the drafter's KV cache keeps up with the target's and it
can resume drafting at any moment (measured: K = 0 did not give the draft
model's cost back, docs/k-policies.md; on this CPU it cost 25-30 % against no speculation). This
module trades that readiness for the cost, and buys it back when drafting pays again:

- the worker (``IdleDrafterMixin`` in the platform's worker class, ``workers_cpu.py`` or
  ``workers_gpu.py``, loaded inside vLLM's worker process with ``--worker-cls``
  ``paths.worker_class_path(platform, idle_drafter=True)``) skips the drafter's forward pass
  whenever the step asks for 0 draft tokens, returning the same empty
  ``(batch, 0)`` proposal vLLM returns after that pass, and writes zeros into the
  draft model's KV cache at the slots it skipped (``zero_kv_slots``, with each
  layer's own KV writer; reported as ``catch_up.ZEROED_ATTR``): a block a request
  gets may hold another request's draft KV, which a hole would otherwise expose;
- the requests of such a step then have a hole in the draft model's KV cache. The
  plugin's policy hooks (``policy_hooks.py``, in the scheduler) keep each hole and,
  in a later step with K > 0, plan its catch-up on the ``SchedulerOutput``
  (``catch_up.PLAN_ATTR``: request id -> (first position, count)), with no drafts
  for the request until then; a hole longer than the per-step budget is drafted
  across instead (zeros where the skipped tokens are);
- in that step's first draft pass the worker puts the request's missed tokens in
  front of its segment (``catch_up.prepend_catch_up``: the pass writes their KV
  before anything reads it) and reports what it re-ran on the ``ModelRunnerOutput``
  (``catch_up.APPLIED_ATTR``); the scheduler closes those holes. A planned range
  that does not check out (position mismatch, no room in the drafter's buffers,
  the pass not run) is simply not reported: the hole stays, conservatively.

Output is unchanged either way (lossless: the target verifies every draft).
Where vLLM 0.32 takes these inputs and why the rewrite has this shape:
``docs/catch-up-design.md``. Draft models only: an EAGLE head would need the
target's hidden states at the missed positions, which nobody kept, so its holes
are never planned (the scheduler plans only for draft models).

The mixin refuses to start on a model runner without a ``drafter`` (vLLM's Model Runner V2 has a
``speculator`` instead, which it never wraps): an idle drafter that silently wraps nothing would
show K=0 steps that still pay the draft model's cost.

This module pins vLLM internals (Model Runner V1; ``vllm_seam`` lists them and checks the
version): the model runner's ``drafter.propose(num_speculative_tokens=..., target_token_ids=...,
target_positions=..., common_attn_metadata=..., ...)`` (all by keyword),
``model_runner.propose_draft_token_ids(scheduler_output, ...)`` and
``input_batch.token_ids_cpu`` / ``req_ids``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from vllm.model_executor.layers.attention.attention import Attention

from engine_adapter.vllm_plugin.catch_up import (
    APPLIED_ATTR,
    PASS_SKIPPED_ATTR,
    PLAN_ATTR,
    ZEROED_ATTR,
    MissedRange,
    prepend_catch_up,
)
from engine_adapter.vllm_plugin.side_channel import attach
from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release

logger = logging.getLogger("vllm").getChild("idle_drafter")  # vLLM's handlers print it in its log

PADDING_SLOT_ID = -1  # vLLM's (v1/spec_decode/utils.py): the first pass recomputes every slot


@dataclass
class StepCatchUp:
    """The catch-up of the step in progress: planned by the scheduler, applied by the drafter."""

    plan: dict[str, tuple[int, int]] | None = None  # request id -> (first position, count)
    applied: dict[str, int] = field(default_factory=dict)  # request id -> tokens re-run
    zeroed: bool = False  # a K=0 step: the draft KV at every skipped slot was written with zeros
    proposed: bool = False  # the drafter's propose ran in the step (vLLM skips it when an input is too long)


def draft_attention_layers(drafter) -> list:
    """The draft model's attention layers, where vLLM's own KV writer can blank a slot, or [] when
    one of them writes its KV inside its forward pass (no separate writer to call)."""
    layers = [m for m in drafter.model.modules() if isinstance(m, Attention)]
    writable = all(
        not m.attn_backend.forward_includes_kv_cache_update and hasattr(m.impl, "do_kv_cache_update") for m in layers
    )
    return layers if writable else []


def zero_kv_slots(layers: list, slot_mapping: torch.Tensor, dtype: torch.dtype) -> bool:
    """Write zeros as keys and values at ``slot_mapping`` [T] (int64; -1 = padding, skipped by the
    writer) in every layer's KV cache, with the layer's own writer (the cache's layout and storage
    dtype are the attention backend's; ``dtype`` is the model's, what the writer takes). Why: a
    block a request gets may hold another request's draft KV, and a position the draft model
    skipped would be read as it is (docs/catch-up-design.md section 7); with zeros there, drafts
    made across a hole come from the request's own text alone."""
    if not layers:
        return False
    n = slot_mapping.numel()
    for layer in layers:
        kv = layer.kv_cache
        zeros_k = torch.zeros(n, layer.num_kv_heads, layer.head_size, dtype=dtype, device=kv.device)
        zeros_v = torch.zeros(n, layer.num_kv_heads, layer.head_size_v, dtype=dtype, device=kv.device)
        layer.impl.do_kv_cache_update(layer, zeros_k, zeros_v, kv, slot_mapping)
    return True


def rewrite_first_pass(kwargs: dict, plan: dict[str, tuple[int, int]], input_batch, drafter) -> tuple[dict, dict]:
    """``propose``'s keyword arguments with the planned ranges in front of their segments,
    and {request id: tokens prepended}. Unchanged arguments and {} where nothing applies."""
    cad = kwargs["common_attn_metadata"]
    ids_t, pos_t = kwargs["target_token_ids"], kwargs["target_positions"]
    if pos_t.dim() != 1:  # M-RoPE positions: not a layout catch_up knows
        return kwargs, {}
    b, t = cad.num_reqs, cad.num_actual_tokens
    qsl = cad.query_start_loc_cpu[: b + 1].numpy()
    ids, pos = ids_t[:t].cpu().numpy(), pos_t[:t].cpu().numpy()
    missed: list[MissedRange | None] = [None] * b
    for r, rid in enumerate(input_batch.req_ids[:b]):
        if rid in plan and qsl[r + 1] > qsl[r]:
            first, n = plan[rid]
            if first + n == int(pos[qsl[r]]):  # the range ends just before the segment
                missed[r] = MissedRange(first, input_batch.token_ids_cpu[r, first : first + n].copy())
    room = drafter.max_num_tokens - t - b * drafter.net_num_new_slots_per_request  # its buffers' sizes
    cu = prepend_catch_up(ids, pos, qsl, missed, max(min(sum(n for _, n in plan.values()), room), 0))
    if not cu.caught_up.any():
        return kwargs, {}
    dev = ids_t.device
    total = cu.num_actual_tokens
    qsl_cpu = torch.from_numpy(cu.query_start_loc.astype(np.int32))  # [B+1]
    new_cad = cad.replace(
        query_start_loc=qsl_cpu.to(dev, copy=True),
        query_start_loc_cpu=qsl_cpu,
        num_actual_tokens=total,
        max_query_len=cu.max_query_len,
        slot_mapping=torch.full((total,), PADDING_SLOT_ID, dtype=cad.slot_mapping.dtype, device=dev),
        positions=None,
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )
    hidden = kwargs.get("target_hidden_states")
    if hidden is not None:  # unread by a draft model; kept the right shape, [T', H]
        hidden = hidden[torch.from_numpy(np.maximum(cu.source_index, 0)).to(hidden.device)]
    rewritten = {
        **kwargs,
        "target_token_ids": torch.from_numpy(cu.token_ids).to(dev),  # [T'] int32
        "target_positions": torch.from_numpy(cu.positions).to(dev),  # [T'] int64
        "target_hidden_states": hidden,
        "common_attn_metadata": new_cad,
    }
    applied = {input_batch.req_ids[r]: int(c) for r, c in enumerate(cu.caught_up) if c}
    return rewritten, applied


def skip_at_zero(drafter, model_runner, step: StepCatchUp) -> None:
    """Wrap one drafter instance's ``propose``: K = 0 runs no forward pass (and blanks the draft KV
    it would have written); K > 0 catches up."""
    propose = drafter.propose
    layers = draft_attention_layers(drafter)
    # the keys and values the model writes are in its weights' dtype
    dtype = next((w.dtype for w in drafter.model.parameters()), torch.get_default_dtype())
    skipped = 0
    failed = 0

    @functools.wraps(propose)
    def propose_or_idle(*args, **kwargs):
        nonlocal skipped, failed
        step.proposed = True
        k = kwargs["num_speculative_tokens"] if "num_speculative_tokens" in kwargs else args[0]
        if k != 0:
            if step.plan and not args:
                try:
                    kwargs, step.applied = rewrite_first_pass(kwargs, step.plan, model_runner.input_batch, drafter)
                except Exception:  # never stop the engine: the holes stay, the pass runs as vLLM's
                    failed += 1
                    if failed == 1:
                        logger.exception("idle drafter: a catch-up failed; the requests keep their holes")
                    step.applied = {}
            return propose(*args, **kwargs)
        skipped += 1
        if skipped == 1:
            logger.info("idle drafter: K=0, the draft model's pass is skipped")
        cad = kwargs["common_attn_metadata"]
        try:  # every token of the step at the target's slots (rejected drafts' slots too: more than needed)
            step.zeroed = zero_kv_slots(layers, cad.slot_mapping[: cad.num_actual_tokens], dtype)
        except Exception:  # never stop the engine: unreported, the scheduler keeps these holes undrafted
            step.zeroed = False
            failed += 1
            if failed == 1:
                logger.exception("idle drafter: blanking a hole's draft KV failed; holed requests draft no more")
        # the state vLLM's own K=0 return leaves behind
        drafter.num_speculative_tokens = 0
        drafter._last_draft_probs = None
        batch = cad.batch_size()
        device = kwargs["next_token_ids"].device
        return torch.empty(batch, 0, device=device, dtype=torch.int64)  # [batch, K=0]

    drafter.propose = propose_or_idle


def plan_from_scheduler_output(model_runner, step: StepCatchUp) -> None:
    """Wrap the runner's ``propose_draft_token_ids``: the step's plan rides on its ``scheduler_output``."""
    propose_draft_token_ids = model_runner.propose_draft_token_ids

    @functools.wraps(propose_draft_token_ids)
    def with_plan(scheduler_output, *args, **kwargs):
        step.plan = getattr(scheduler_output, PLAN_ATTR, None)
        try:
            return propose_draft_token_ids(scheduler_output, *args, **kwargs)
        finally:
            step.plan = None

    model_runner.propose_draft_token_ids = with_plan


def model_drafter(model_runner, spec) -> object | None:
    """The drafter the idle drafter wraps: vLLM's V1 ``model_runner.drafter`` for a draft model or an
    EAGLE head; None where there is nothing to idle (no speculation, ngram, suffix). RuntimeError
    for a runner that drafts with a model but has no ``drafter`` (Model Runner V2's ``speculator``)."""
    if spec is None or not (spec.uses_draft_model() or spec.use_eagle()):
        return None
    drafter = getattr(model_runner, "drafter", None)
    if drafter is None or not callable(getattr(drafter, "propose", None)):
        runner = type(model_runner).__name__
        raise RuntimeError(
            f"idle drafter: vLLM's model runner ({runner}) has no drafter with a propose() to wrap "
            "(Model Runner V2 has a speculator instead); start vLLM with VLLM_USE_V2_MODEL_RUNNER=0"
        )
    return drafter


class IdleDrafterMixin:
    """Mixed in before ``lossy_sampler.AcceptanceRuleMixin`` and the platform's vLLM worker (see the
    module docstring and ``workers_cpu.py``/``workers_gpu.py``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._catch_up = StepCatchUp()
        self._wrapped = False  # the drafter's propose is ours (load_model found a model drafter)

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        drafter = model_drafter(self.model_runner, self.vllm_config.speculative_config)
        if drafter is not None:  # model drafters only (an ngram drafter costs nothing at K=0)
            skip_at_zero(drafter, self.model_runner, self._catch_up)
            plan_from_scheduler_output(self.model_runner, self._catch_up)
            self._wrapped = True
            logger.info("idle drafter: %s skips its pass in steps with K=0", type(drafter).__name__)

    def sample_tokens(self, grammar_output):
        step = self._catch_up
        step.applied, step.zeroed, step.proposed = {}, False, False
        out = super().sample_tokens(grammar_output)
        applied, zeroed, skipped = dict(step.applied), step.zeroed, self._wrapped and not step.proposed
        step.applied, step.zeroed, step.proposed = {}, False, False
        return attach(out, lambda output: catch_up_report(output, applied, zeroed, skipped))


def catch_up_report(output, applied: dict[str, int], zeroed: bool, skipped: bool) -> dict:
    """The step's catch-up attributes for the scheduler (pickled back with the output)."""
    attributes: dict = {}
    if applied:
        attributes[APPLIED_ATTR] = applied
    if zeroed:
        attributes[ZEROED_ATTR] = True
    if skipped and output.req_ids:
        attributes[PASS_SKIPPED_ATTR] = True  # nobody's draft KV was written, nor blanked
    return attributes
