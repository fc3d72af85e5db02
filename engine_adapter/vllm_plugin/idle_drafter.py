"""Idle drafter: a draft model that does no work in steps where K = 0.

vLLM runs a draft model's first pass every step, whatever K the batch-size
table gives, so that the drafter's KV cache keeps up with the target's and it
can resume drafting at any moment (measured: K = 0 did not give the draft
model's cost back, docs/k-policies.md; on this CPU it cost 25-30 % against no speculation). This
module trades that readiness for the cost:

- the worker (``IdleDrafterWorker``, loaded inside vLLM's worker process with
  ``--worker-cls`` ``paths.IDLE_DRAFTER_WORKER``) skips the
  drafter's forward pass whenever the step asks for 0 draft tokens, returning
  the same empty ``(batch, 0)`` proposal vLLM returns after that pass;
- the requests of such a step are then out of step with the drafter (its KV
  cache misses their tokens), so the plugin's policy hooks (``policy_hooks.py``)
  marks them and trims their drafts to nothing for the rest of their lives.
  Their drafts would be guesses from a cache with holes; the target still
  verifies every token, so output is unchanged either way (lossless), and not
  verifying them saves the verify cost too.

New requests prefilled in a step with K > 0 draft normally. Catching a stale
request's drafter cache up (re-running its missed tokens) would let it draft
again; that is not done here.

This module pins vLLM internals (tested with vllm 0.32.0): the model runner's
``drafter.propose(num_speculative_tokens=..., common_attn_metadata=..., ...)``.
"""

from __future__ import annotations

import functools
import logging

import torch
from vllm.platforms import current_platform

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as _PlatformWorker
else:
    from vllm.v1.worker.gpu_worker import Worker as _PlatformWorker

logger = logging.getLogger("vllm").getChild("idle_drafter")  # vLLM's handlers print it in its log


def skip_at_zero(drafter) -> None:
    """Wrap one drafter instance's ``propose`` so that K = 0 runs no forward pass."""
    propose = drafter.propose
    skipped = 0

    @functools.wraps(propose)
    def propose_or_idle(*args, **kwargs):
        nonlocal skipped
        k = kwargs["num_speculative_tokens"] if "num_speculative_tokens" in kwargs else args[0]
        if k != 0:
            return propose(*args, **kwargs)
        skipped += 1
        if skipped == 1:
            logger.info("idle drafter: K=0, the draft model's pass is skipped")
        # the state vLLM's own K=0 return leaves behind
        drafter.num_speculative_tokens = 0
        drafter._last_draft_probs = None
        batch = kwargs["common_attn_metadata"].batch_size()
        device = kwargs["next_token_ids"].device
        return torch.empty(batch, 0, device=device, dtype=torch.int64)  # [batch, K=0]

    drafter.propose = propose_or_idle


class IdleDrafterWorker(_PlatformWorker):
    """The platform's vLLM worker, with the drafter idle at K = 0 (see the module docstring)."""

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        drafter = getattr(self.model_runner, "drafter", None)
        spec = self.vllm_config.speculative_config
        # model drafters only, by vLLM's own test (an ngram drafter costs nothing at K=0)
        if drafter is not None and spec is not None and (spec.uses_draft_model() or spec.use_eagle()):
            skip_at_zero(drafter)
            logger.info("idle drafter: %s skips its pass in steps with K=0", type(drafter).__name__)
