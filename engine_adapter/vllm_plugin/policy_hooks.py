"""The scheduler tap's acting half: live K policies, the slot auction, the idle drafter's rules.

Contract: ``PolicyHooksMixin`` goes before ``tap.TapMixin`` on a vLLM v1 scheduler
(see ``schedulers.py``). It changes what vLLM does only where it was asked to:

- with the control channel (``SPEC_EXPLORER_CONTROL_ADDR``, only for an engine
  started with a K table) ``schedule()`` first applies the commands waiting on it
  (``wire.py``): a new batch-size -> K table, rebuilt with vLLM's own builder, or
  the slot auction, which trims each running request's drafts to the slots it
  admits (``policy.k_policy.auction``) and sets how deep the drafter proposes next,
  or the acceptance rule (``acceptance_rule.py``), which it names on every step's
  ``SchedulerOutput`` for the worker (``lossy_sampler.py``) and whose relaxed drafts
  it reads back for the tap;
- with the idle drafter (``idle_drafter.py``, named by vLLM's ``worker_cls``) it
  keeps, per request, the hole a K=0 step left in the draft model's KV cache
  (``catch_up.Missed``), plans each K>0 step's catch-up (whole holes, oldest first,
  within ``SPEC_EXPLORER_CATCH_UP_TOKENS`` and the step's token budget) on the
  ``SchedulerOutput`` for the worker, reads back what the worker re-ran, trims the
  drafts of requests waiting for their catch-up, lets a request whose hole is longer
  than the budget draft across it once the worker reported the hole blanked (zeros
  at the skipped slots: its drafts come from its own text alone; ``_hole``), and
  corrects a table policy's K where ``policy.k_policy.idle_drafter_k`` says so.

It writes what it did in each step into the step's ``step_context.StepContext`` (the
tap's ``step_context``), which the tap publishes: the auction's decision, the catch-up
re-run, the requests whose drafts were made across a hole, the acceptance rule and the
drafts it relaxed. Per-request lossless verdicts come back through the tap's
``_observe_request`` hook to the auction's ``SlotEstimator`` (under a lossy rule, the
drafts before the first relaxed one; that one the lossless rule rejected). Output stays lossless
unless a lossy acceptance rule was asked for: the target still verifies every draft
that is left. A bad command never stops the engine.

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

import os
import time
from collections import deque

import zmq
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

from engine_adapter.acceptance import SlotEstimator
from engine_adapter.acceptance_rule import AcceptanceRule
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.k_policy import (
    RECENT_PEAK_S,
    RECENT_PEAK_STEPS,
    auction,
    best_ceiling,
    equal_slots,
    idle_drafter_k,
)
from engine_adapter.records import visitor_count
from engine_adapter.vllm_plugin.acceptance_rules import RELAXED_ATTR, RULE_ATTR
from engine_adapter.vllm_plugin.catch_up import (
    APPLIED_ATTR,
    PASS_SKIPPED_ATTR,
    PLAN_ATTR,
    ZEROED_ATTR,
    Missed,
    select_within_budget,
    update_missed,
)
from engine_adapter.vllm_plugin.paths import is_idle_drafter_worker
from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm
from engine_adapter.vllm_plugin.wire import (
    CATCH_UP_TOKENS_ENV,
    CONTROL_ADDR_ENV,
    DEFAULT_CATCH_UP_TOKENS,
    AuctionRow,
    BidRow,
    decode_control,
)

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release


def _segment_starts(out) -> dict[str, int]:
    """Each scheduled request's first position in the step (``num_computed_tokens`` at its start)."""
    starts = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    starts.update(zip(cached.req_ids, cached.num_computed_tokens))
    return starts


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
        # how the auction's slots are spent: "auction" (best-first, the machine's tokens/s) or
        # "equal" (the same number of slots, shared alike: k_policy.equal_slots)
        self._allocation = "auction"
        # requests whose draft model skipped their tokens at a K=0 step (idle_drafter.py):
        # its cache has a hole for them (what that means for their drafts: ``_hole``)
        self._idle_drafter = is_idle_drafter_worker(self.vllm_config.parallel_config.worker_cls)
        self._missed: dict[str, Missed] = {}
        # requests whose hole may hold another request's draft KV: a K=0 step of theirs whose slots the
        # worker did not report blanked (ZEROED_ATTR); they never draft across it, only after a catch-up
        self._unblanked: set[str] = set()
        spec = self.vllm_config.speculative_config
        # draft models only: an EAGLE head would need the target's hidden states at the missed tokens
        self._draft_model = spec is not None and spec.uses_draft_model()
        budget = int(os.environ.get(CATCH_UP_TOKENS_ENV, DEFAULT_CATCH_UP_TOKENS))
        self._catch_up_tokens = max(budget, 0) * self._draft_model
        self._steps_scheduled = 0
        # the acceptance rule, engine-wide (None = vLLM's lossless rule): named on every step's
        # SchedulerOutput for the worker (lossy_sampler.py), which says what it relaxed
        self._acceptance: dict | None = None
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
                payload = self._control.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = decode_control(payload)
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
                    self._allocation = "equal" if a.get("allocation") == "equal" else "auction"
                elif "catch_up" in msg:
                    self._catch_up_tokens = max(int(msg["catch_up"]), 0) * self._draft_model
                elif "acceptance" in msg:
                    rule = AcceptanceRule.from_dict(msg["acceptance"])
                    self._acceptance = rule.to_dict() if rule.lossy else None
            except Exception:  # the adapter validates first; a bad command (or bytes) must never stop the engine
                pass
            self._controls_applied += 1

    def _set_table(self, rows: list[tuple[int, int, int]]) -> None:
        # vLLM's own builder: its rules, K capped at num_speculative_tokens
        self.dynamic_sd_lookup = build_dynamic_sd_schedule_lookup(
            rows,
            vllm_max_batch_size=self.scheduler_config.max_num_seqs,
            vllm_num_speculative_tokens=self.num_spec_tokens,
        )

    # --- the slot auction -------------------------------------------------------
    def _run_auction(self) -> AuctionRow | None:
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
        # the ceiling pays off only for requests that can draft: not those with a hole too long to
        # catch up, and the new ones at the pooled estimate (so drafting resumes when load falls)
        able, engaging = self._able_to_draft(fresh)
        full = {r.request_id: est.scores(r.request_id, self.num_spec_tokens) for r in able + fresh}
        # engaging a request's drafter (a new one's prefill, a holed one's catch-up) is priced at
        # the load that just was, as the table policies do (k_policy.idle_drafter_k): it pays back
        # over many steps
        b_priced = self._recent_peak(b) if engaging and self._idle_drafter else b
        ceiling = best_ceiling(full, cost, b_priced)[0] if full else 0
        self.dynamic_sd_lookup = [ceiling] * len(self.dynamic_sd_lookup)
        drafting = [r for r in self.running if r.spec_token_ids]  # lost ones were trimmed already
        if not drafting:
            return AuctionRow(slots=0, bids=[], ceiling=ceiling)
        scores = {r.request_id: full[r.request_id][: len(r.spec_token_ids)] for r in drafting}
        k_drafted = max(len(r.spec_token_ids) for r in drafting)
        res = auction(scores, cost, batch_size=b, k_drafted=k_drafted)
        admitted = res.admitted
        if self._allocation == "equal":  # the auction's number of slots, shared alike
            admitted = equal_slots({rid: len(sc) for rid, sc in scores.items()}, res.slots)
        for r in drafting:
            n = admitted[r.request_id]
            if n < len(r.spec_token_ids):
                r.spec_token_ids = list(r.spec_token_ids[:n])
        bids = [
            BidRow(engine_request_id=rid, scores=[round(x, 4) for x in sc], admitted=admitted[rid])
            for rid, sc in scores.items()
        ]
        return AuctionRow(slots=sum(admitted.values()), bids=bids, ceiling=ceiling)

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

    def _hole(self, request) -> str:
        """What a request's hole in the draft KV means for its drafts this step:

        - ``"none"``: no hole; it drafts;
        - ``"catch_up"``: one that fits the per-step budget: caught up in a step to come, no drafts
          until then (the catch-up rewrites what the drafts would have been made from);
        - ``"drafts_across"``: one longer than the budget, blanked at every K=0 step (zeros where the
          skipped tokens are, ``idle_drafter.zero_kv_slots``): it drafts across the hole, from its
          own text alone, and its acceptance estimate prices those drafts;
        - ``"no_drafts"``: one longer than the budget that may hold another request's draft KV: no
          drafts, since rejected drafts are shown to users.
        """
        m = self._missed.get(request.request_id)
        m = m.refreshed(request.num_computed_tokens) if m is not None else None
        if m is None:
            return "none"
        if m.count <= self._catch_up_tokens:
            return "catch_up"
        return "no_drafts" if request.request_id in self._unblanked else "drafts_across"

    def _trim_lost(self) -> None:
        """No drafts for requests whose hole is to be caught up or may hold another's KV (a new
        list: async placeholders are shared)."""
        for r in self.running:
            if r.spec_token_ids and r.request_id in self._missed and self._hole(r) in ("catch_up", "no_drafts"):
                r.spec_token_ids = []

    def _able_to_draft(self, fresh: list) -> tuple[list, bool]:
        """The running requests that can draft this step, and whether a drafter is to be engaged
        (a new request's prefill, or a holed one's catch-up)."""
        holes = {r.request_id: self._hole(r) for r in self.running}
        able = [r for r in self.running if holes[r.request_id] != "no_drafts"]
        return able, bool(fresh) or "catch_up" in holes.values()

    def _track_holes(self, out) -> dict[str, tuple[int, int]]:
        """After vLLM scheduled a step: open or grow holes at K=0, plan their catch-up at K>0;
        returns the plan (request -> (first position, count)), also set on ``out`` for the worker."""
        self._steps_scheduled += 1
        ran = out.num_spec_tokens_to_schedule > 0
        if ran and not self._missed:
            return {}  # the usual step: nothing to open, nothing to plan
        starts = _segment_starts(out)
        if not ran:
            self._open_holes(out, starts)
            return {}
        holed = []
        for rid in out.num_scheduled_tokens:
            if rid in self._missed:
                m = self._missed[rid].refreshed(starts[rid])
                if m is None:  # recomputed from before its hole (preempted): this pass rewrites it
                    del self._missed[rid]
                    self._unblanked.discard(rid)
                else:
                    self._missed[rid] = m
                    holed.append((rid, m))
        if not holed or not self._catch_up_tokens:
            return {}
        # what the scheduler left of the step's token budget (a draft model takes one slot a request)
        slack = (
            self.scheduler_config.max_num_batched_tokens
            - out.total_num_scheduled_tokens
            - len(out.num_scheduled_tokens) * self.vllm_config.speculative_config.max_num_new_slots_for_drafting
        )
        budget = max(min(self._catch_up_tokens, slack), 0)
        take = select_within_budget([m.count for _, m in holed], [m.since_step for _, m in holed], budget)
        plan = {rid: (m.first, m.count) for (rid, m), t in zip(holed, take) if t}
        if plan:
            setattr(out, PLAN_ATTR, plan)
        return plan

    def _open_holes(self, out, starts: dict[str, int]) -> None:
        """The draft model skipped every request of the step ``out``: open or grow their holes."""
        for rid, n in out.num_scheduled_tokens.items():
            self._missed[rid] = update_missed(
                self._missed.get(rid),
                segment_start=starts[rid],
                num_scheduled=n,
                drafter_ran=False,
                caught_up=False,
                step=self._steps_scheduled,
            )

    def _idle_drafter_lookup(self, lookup: list[int]) -> list[int] | None:
        """A table policy's K for this step, corrected for what an idle drafter costs
        (k_policy.idle_drafter_k); None when it stands."""
        fresh, b = self._step_batch()
        peak = min(self._recent_peak(b), len(lookup) - 1)
        able, engaging = self._able_to_draft(fresh)
        k = idle_drafter_k(lookup[b], fresh=engaging, k_at_recent_peak=lookup[peak], can_draft=bool(fresh or able))
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
        context = self.step_context(out)
        if self._idle_drafter:
            # the drafts this step verifies were proposed with these holes open (the step that opens a
            # hole verifies drafts made before it)
            context.holed = frozenset(self._missed)
            context.plan = self._track_holes(out)
        context.decision = decision
        if self._acceptance is not None:
            setattr(out, RULE_ATTR, self._acceptance)  # reaches the worker's execute_model
            context.rule = self._acceptance["name"]
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        """The worker says which planned holes it re-ran (``catch_up.APPLIED_ATTR``); those close.
        After a K=0 step it says whether it blanked the skipped slots (``ZEROED_ATTR``)."""
        context = self.step_context(scheduler_output)
        if context.plan:
            applied = getattr(model_runner_output, APPLIED_ATTR, None) or {}
            for rid, (_first, count) in context.plan.items():
                if applied.get(rid) == count:
                    self._missed.pop(rid, None)
                    self._unblanked.discard(rid)
                    context.caught_up[rid] = count
        if self._idle_drafter and getattr(model_runner_output, PASS_SKIPPED_ATTR, False):
            # vLLM skipped the draft pass at K > 0 (an input too long for the drafter): holes, not blanked
            self._open_holes(scheduler_output, _segment_starts(scheduler_output))
            self._unblanked.update(scheduler_output.num_scheduled_tokens)
        if (
            self._idle_drafter
            and scheduler_output.num_spec_tokens_to_schedule == 0
            and not getattr(model_runner_output, ZEROED_ATTR, False)
        ):
            self._unblanked.update(rid for rid in scheduler_output.num_scheduled_tokens if rid in self._missed)
        context.relaxed = getattr(model_runner_output, RELAXED_ATTR, None) or {}
        return super().update_from_output(scheduler_output, model_runner_output)

    def shutdown(self) -> None:
        if self._control is not None:
            self._control.close(0)
        super().shutdown()

    # --- the tap's hooks ----------------------------------------------------------
    def _observe_request(self, req_id: str, num_drafted: int, accepted: int, finished: bool, across: bool) -> bool:
        lost = req_id in self._missed
        if num_drafted:
            self._estimator.observe(req_id, num_drafted, accepted, pooled=not across)
        if finished:
            self._estimator.forget(req_id)
            self._missed.pop(req_id, None)
            self._unblanked.discard(req_id)
        return lost

    def _forget_gone(self) -> None:
        for rid in [r for r in self._missed if r not in self.requests]:  # (the idle drafter needs the tap)
            del self._missed[rid]
        self._unblanked &= self._missed.keys()
        for rid in [r for r in self._estimator.per_request if r not in self.requests]:
            self._estimator.forget(rid)
