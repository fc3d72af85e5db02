"""The scheduler tap's acting half: live K policies, the slot auction, the idle drafter's rules.

Contract: ``PolicyHooksMixin`` goes before ``tap.TapMixin`` on a vLLM v1 scheduler
(see ``schedulers.py``). It changes what vLLM does only where it was asked to:

- with the control channel (``SPEC_EXPLORER_CONTROL_ADDR``, only for an engine
  started with a K table) ``schedule()`` first applies the commands waiting on it
  (``wire.py``): a new batch-size -> K table, rebuilt with vLLM's own builder, or
  the slot auction, which trims each running request's drafts to the slots it
  admits (``policy.k_policy.auction``) and sets how deep the drafter proposes next;
- with the idle drafter (``idle_drafter.py``, named by vLLM's ``worker_cls``) it
  trims the drafts of requests whose drafter skipped a K=0 step (the drop rule)
  and corrects a table policy's K where ``policy.k_policy.idle_drafter_k`` says so.

It feeds the observing half through the tap's hooks: per-request verdicts go to the
auction's ``SlotEstimator``, and each step's auction decision and the count of
applied commands go into the step's message. Output stays lossless: the target
still verifies every draft that is left. A bad command never stops the engine.

This module pins vLLM internals (tested with vllm 0.32.0).
"""

from __future__ import annotations

import os
import time
from collections import deque

import zmq
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

from engine_adapter.acceptance import SlotEstimator
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.k_policy import RECENT_PEAK_S, RECENT_PEAK_STEPS, auction, best_ceiling, idle_drafter_k
from engine_adapter.records import visitor_count
from engine_adapter.vllm_plugin.paths import IDLE_DRAFTER_WORKER
from engine_adapter.vllm_plugin.wire import CONTROL_ADDR_ENV, decode_control


class PolicyHooksMixin:
    """Mixed in before ``TapMixin`` and a vLLM scheduler class; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        control = os.environ.get(CONTROL_ADDR_ENV)
        self._control = None
        # the slot auction (a live policy): per-request acceptance, kept always
        # so switching the auction on starts from what the engine has seen
        self._estimator = SlotEstimator(k_max=max(self.num_spec_tokens, 1))
        self._auction_cost: CostModel | None = None
        self._decisions: dict[int, list] = {}  # id(scheduler_output) -> the auction's decision
        # requests whose draft model skipped their tokens at a K=0 step (idle_drafter.py):
        # its cache has holes for them, so they are never drafted again
        self._idle_drafter = self.vllm_config.parallel_config.worker_cls == IDLE_DRAFTER_WORKER
        self._drafter_lost: set[str] = set()
        # (monotonic s, batch size) of the last steps, for k_policy.idle_drafter_k
        self._recent_batches: deque[tuple[float, int]] = deque(maxlen=RECENT_PEAK_STEPS)
        if control and self.dynamic_sd_lookup is not None:
            # Live K policies rewrite vLLM's own dense batch-size -> K lookup,
            # which exists only when the engine started with a K table.
            self._control = zmq.Context.instance().socket(zmq.PULL)
            self._control.setsockopt(zmq.LINGER, 0)
            self._control.connect(control)

    # --- the control channel ----------------------------------------------------
    def _apply_control(self) -> None:
        while True:
            try:
                msg = decode_control(self._control.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            try:
                if "table" in msg:
                    self._set_table([tuple(r) for r in msg["table"]])
                    self._auction_cost = None
                elif "auction" in msg:
                    a = msg["auction"]
                    cost = CostModel.from_dict(a["cost"])
                    # the drafter proposes k_max; the auction trims per request
                    self._set_table([(1, self.scheduler_config.max_num_seqs, self.num_spec_tokens)])
                    self._estimator.prior = float(a.get("prior", self._estimator.prior))
                    self._estimator.strength = float(a.get("strength", self._estimator.strength))
                    self._auction_cost = cost
            except (ValueError, TypeError, KeyError):
                pass  # the adapter validates first; a bad command must never stop the engine
            self._controls_applied += 1

    def _set_table(self, rows: list[tuple[int, int, int]]) -> None:
        # vLLM's own builder: its rules, K capped at num_speculative_tokens
        self.dynamic_sd_lookup = build_dynamic_sd_schedule_lookup(
            rows,
            vllm_max_batch_size=self.scheduler_config.max_num_seqs,
            vllm_num_speculative_tokens=self.num_spec_tokens,
        )

    # --- the slot auction -------------------------------------------------------
    def _run_auction(self) -> list | None:
        """Trim each running request's drafts to its admitted slots (before vLLM schedules),
        and set how deep the drafter proposes next (the ceiling).

        In sync mode ``spec_token_ids`` are the real drafts; in async mode they
        are placeholders whose count is what gets verified (vLLM trims the
        worker's drafts to it), so trimming the list trims verification alike.
        The ceiling goes into vLLM's batch-size -> K lookup, which sizes the
        drafter's next proposal: a draft model pays for every position it
        proposes, admitted or not.
        """
        cost = self._auction_cost
        if cost is None or not (self.running or self.waiting):
            return None
        est = self._estimator
        fresh, b = self._step_batch()
        # the ceiling pays off only for requests that can draft: not those an idle drafter
        # dropped, and the new ones at the pooled estimate (so drafting resumes when load falls)
        able = [r for r in self.running if r.request_id not in self._drafter_lost] + fresh
        full = {r.request_id: est.scores(r.request_id, self.num_spec_tokens) for r in able}
        # engaging a new request's drafter is priced at the load that just was, as the
        # table policies do (k_policy.idle_drafter_k): its prefill pays back over many steps
        b_priced = self._recent_peak(b) if fresh and self._idle_drafter else b
        ceiling = best_ceiling(full, cost, b_priced)[0] if full else 0
        self.dynamic_sd_lookup = [ceiling] * len(self.dynamic_sd_lookup)
        drafting = [r for r in self.running if r.spec_token_ids]  # lost ones were trimmed already
        if not drafting:
            return [0, [], ceiling]
        scores = {r.request_id: full[r.request_id][: len(r.spec_token_ids)] for r in drafting}
        k_drafted = max(len(r.spec_token_ids) for r in drafting)
        res = auction(scores, cost, batch_size=b, k_drafted=k_drafted)
        for r in drafting:
            n = res.admitted[r.request_id]
            if n < len(r.spec_token_ids):
                r.spec_token_ids = list(r.spec_token_ids[:n])
        bids = [[rid, [round(x, 4) for x in sc], res.admitted[rid]] for rid, sc in scores.items()]
        return [res.slots, bids, ceiling]

    def _step_batch(self) -> tuple[list, int]:
        """The step's new requests and its batch size: the running requests plus the
        waiting ones it can take in (at most max_num_seqs, the lookup's last index)."""
        fresh = list(self.waiting)[: max(self.scheduler_config.max_num_seqs - len(self.running), 0)]
        return fresh, len(self.running) + len(fresh)

    # --- the idle drafter's rules ---------------------------------------------
    def _recent_peak(self, b: int) -> int:
        """The largest of ``b`` and the batch sizes of the last steps (k_policy.RECENT_PEAK_*)."""
        since = time.monotonic() - RECENT_PEAK_S
        return max([b] + [n for t, n in self._recent_batches if t >= since])

    def _trim_lost(self) -> None:
        """No drafts for requests the idle drafter skipped (a new list: async placeholders are shared)."""
        for r in self.running:
            if r.spec_token_ids and r.request_id in self._drafter_lost:
                r.spec_token_ids = []

    def _idle_drafter_lookup(self, lookup: list[int]) -> list[int] | None:
        """A table policy's K for this step, corrected for what an idle drafter costs
        (k_policy.idle_drafter_k); None when it stands."""
        fresh, b = self._step_batch()
        peak = min(self._recent_peak(b), len(lookup) - 1)
        can_draft = bool(fresh) or any(r.request_id not in self._drafter_lost for r in self.running)
        k = idle_drafter_k(lookup[b], fresh=bool(fresh), k_at_recent_peak=lookup[peak], can_draft=can_draft)
        return [k] * len(lookup) if k != lookup[b] else None  # for this step only

    # --- vLLM's scheduler API ---------------------------------------------------
    def schedule(self, *args, **kwargs):
        decision = None
        if self._idle_drafter:
            self._trim_lost()
        if self._control is not None:
            t_policy = time.perf_counter()
            self._apply_control()
            try:
                decision = self._run_auction()
            except Exception:  # never stop the engine: the step runs with vLLM's drafts
                decision = None
            self._note_policy_time(time.perf_counter() - t_policy)
        lookup = self.dynamic_sd_lookup
        if self._idle_drafter and lookup is not None and self._auction_cost is None:
            self.dynamic_sd_lookup = self._idle_drafter_lookup(lookup) or lookup
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self.dynamic_sd_lookup = lookup
        # the load that just was, the profiler's requests left out: its last cell (16 requests at
        # K=0) is no guide to the visitor who comes next, and would keep that visitor from drafting
        if self._idle_drafter and (visitors := visitor_count(out.num_scheduled_tokens)):
            self._recent_batches.append((time.monotonic(), visitors))
        if self._idle_drafter and out.num_spec_tokens_to_schedule == 0:
            self._drafter_lost.update(out.num_scheduled_tokens)  # the drafter skips this step
        if decision is not None and self.tap_enabled:
            self._decisions[id(out)] = decision
        return out

    def shutdown(self) -> None:
        if self._control is not None:
            self._control.close(0)
        super().shutdown()

    # --- the tap's hooks ----------------------------------------------------------
    def _observe_request(self, req_id: str, num_drafted: int, accepted: int, finished: bool) -> bool:
        if num_drafted:
            self._estimator.observe(req_id, num_drafted, accepted)
        lost = req_id in self._drafter_lost
        if finished:
            self._estimator.forget(req_id)
            self._drafter_lost.discard(req_id)
        return lost

    def _step_decision(self, scheduler_output) -> list | None:
        return self._decisions.pop(id(scheduler_output), None)

    def _forget_gone(self) -> None:
        self._drafter_lost &= self.requests.keys()  # (the idle drafter needs the tap)
        for rid in [r for r in self._estimator.per_request if r not in self.requests]:
            self._estimator.forget(rid)
