"""Scheduler tap: vLLM v1 scheduler subclasses that publish every engine step.

Loaded inside vLLM's engine-core process with
``--scheduler-cls engine_adapter.vllm_plugin.schedulers.TapScheduler`` (or
``TapAsyncScheduler`` when vLLM runs async scheduling). As an observer the tap
leaves vLLM's behaviour alone:

- ``schedule()``: remembers when the step started;
- ``update_from_output()``: after vLLM has processed the step, reads per request
  the draft ids that were verified (``scheduled_spec_decode_tokens``), the ids
  the target sampled (accepted drafts + 1, before any stop truncation) and the
  ids actually appended to the output (``EngineCoreOutput.new_token_ids``), and
  publishes one ``tap_wire`` message on a ZMQ PUB socket.

The socket address comes from the environment (``SPEC_EXPLORER_TAP_ADDR``);
without it the subclasses behave exactly as vLLM's scheduler. Publishing never
blocks the engine: if no reader keeps up, messages are dropped and counted.
The tap's own time per step is measured and sent with the next step, so its
overhead is a measured number, not a claim.

It changes what vLLM does only where it was asked to: with the control channel
(``SPEC_EXPLORER_CONTROL_ADDR``) ``schedule()`` applies live K policies (vLLM's
own batch-size -> K lookup, rewritten) and runs the slot auction; with the idle
drafter (``idle_drafter.py``) it trims the drafts of requests the drafter
dropped and sets a step's K to 0 where ``k_policy.idle_drafter_k`` says so.

This module pins vLLM internals (tested with vllm 0.32.0).
"""

from __future__ import annotations

import os
import time
import traceback
from collections import deque

import zmq
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.k_policy import RECENT_PEAK_S, RECENT_PEAK_STEPS, auction, best_ceiling, idle_drafter_k
from engine_adapter.acceptance import SlotEstimator
from engine_adapter.vllm_plugin.wire import (
    CONTROL_ADDR_ENV,
    IDLE_DRAFTER_WORKER,
    TAP_ADDR_ENV,
    decode_control,
    encode_step,
)


class _StepPublisher:
    """Owns the PUB socket and the per-step bookkeeping of one scheduler."""

    def __init__(self, addr: str) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(addr)  # the adapter binds; engines come and go
        self.seq = 0
        self.dropped = 0
        self.last_tap_s = 0.0
        self.last_end = time.monotonic()
        # id(scheduler_output) -> perf_counter at schedule() start; async
        # scheduling keeps up to two steps in flight.
        self.started: dict[int, float] = {}
        # id(scheduler_output) -> the slot auction's decision for that step
        self.auctions: dict[int, list] = {}
        self.policy_s = 0.0  # time in control commands and the auction since the last publish

    def publish(self, payload: bytes) -> None:
        try:
            self._sock.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._sock.close(0)


class _TapMixin:
    """Mixed in before a vLLM scheduler class; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        addr = os.environ.get(TAP_ADDR_ENV)
        self._tap = _StepPublisher(addr) if addr else None
        control = os.environ.get(CONTROL_ADDR_ENV)
        self._control = None
        self._controls_applied = 0
        # the slot auction (a live policy): per-request acceptance, kept always
        # so switching the auction on starts from what the engine has seen
        self._estimator = SlotEstimator(k_max=max(self.num_spec_tokens, 1))
        self._auction_cost: CostModel | None = None
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
        scores = {r.request_id: full[r.request_id][:len(r.spec_token_ids)] for r in drafting}
        k_drafted = max(len(r.spec_token_ids) for r in drafting)
        res = auction(scores, cost, batch_size=b, k_drafted=k_drafted)
        for r in drafting:
            n = res.admitted[r.request_id]
            if n < len(r.spec_token_ids):
                r.spec_token_ids = list(r.spec_token_ids[:n])
        return [res.slots, [[rid, [round(x, 4) for x in sc], res.admitted[rid]] for rid, sc in scores.items()],
                ceiling]

    def _step_batch(self) -> tuple[list, int]:
        """The step's new requests and its batch size: the running requests plus the
        waiting ones it can take in (at most max_num_seqs, the lookup's last index)."""
        fresh = list(self.waiting)[:max(self.scheduler_config.max_num_seqs - len(self.running), 0)]
        return fresh, len(self.running) + len(fresh)

    def _recent_peak(self, b: int) -> int:
        """The largest of ``b`` and the batch sizes of the last steps (k_policy.RECENT_PEAK_*)."""
        since = time.monotonic() - RECENT_PEAK_S
        return max([b] + [n for t, n in self._recent_batches if t >= since])

    def _trim_lost(self) -> None:
        """No drafts for requests the idle drafter skipped (a new list: async placeholders are shared)."""
        for r in self.running:
            if r.spec_token_ids and r.request_id in self._drafter_lost:
                r.spec_token_ids = []

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
            if self._tap is not None:  # our policy time counts as the tap's own, not vLLM's
                self._tap.policy_s += time.perf_counter() - t_policy
        lookup = self.dynamic_sd_lookup
        if self._idle_drafter and lookup is not None and self._auction_cost is None:
            # a table policy's K, corrected for what an idle drafter costs (k_policy.idle_drafter_k)
            fresh, b = self._step_batch()
            peak = min(self._recent_peak(b), len(lookup) - 1)
            k = idle_drafter_k(lookup[b], fresh=bool(fresh), k_at_recent_peak=lookup[peak],
                               can_draft=bool(fresh) or any(
                                   r.request_id not in self._drafter_lost for r in self.running))
            if k != lookup[b]:
                self.dynamic_sd_lookup = [k] * len(lookup)  # for this step only
        t0 = time.perf_counter()
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self.dynamic_sd_lookup = lookup
        if self._idle_drafter and out.num_scheduled_tokens:
            self._recent_batches.append((time.monotonic(), len(out.num_scheduled_tokens)))
        if self._idle_drafter and out.num_spec_tokens_to_schedule == 0:
            self._drafter_lost.update(out.num_scheduled_tokens)  # the drafter skips this step
        if self._tap is not None:
            self._tap.started[id(out)] = t0
            if decision is not None:
                self._tap.auctions[id(out)] = decision
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        tap = self._tap
        if tap is None:
            return super().update_from_output(scheduler_output, model_runner_output)
        t_pre = time.perf_counter()
        # vLLM truncates the sampled lists in place at a stop, so count first.
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        num_sampled = {
            rid: len(sampled[i]) for rid, i in index.items()
        } if sampled else {}
        pre_s = time.perf_counter() - t_pre
        result = super().update_from_output(scheduler_output, model_runner_output)
        try:
            self._publish(scheduler_output, num_sampled, t_pre, pre_s, result)
        except Exception:  # an observer must never stop the engine; the gap shows as lost steps
            tap.dropped += 1
            if tap.dropped == 1:  # say why once, in vLLM's log
                traceback.print_exc()
        return result

    def _publish(self, scheduler_output, num_sampled, t_pre, pre_s, result) -> None:
        tap = self._tap
        t_in = time.perf_counter()
        start = tap.started.pop(id(scheduler_output), t_pre)
        decision = tap.auctions.pop(id(scheduler_output), None)
        num_scheduled = scheduler_output.num_scheduled_tokens
        if not num_scheduled:
            return  # an empty step: nothing ran

        # ids appended to each request's output this step, after stop checks
        emitted: dict[str, tuple[list[int], str | None]] = {}
        for outs in result.values():
            for o in outs.outputs:
                reason = o.finish_reason
                emitted[o.request_id] = (
                    list(o.new_token_ids),
                    None if reason is None else str(reason),
                )

        spec = scheduler_output.scheduled_spec_decode_tokens
        reqs = []
        for req_id in num_scheduled:
            drafted = spec.get(req_id) or []
            n_sampled = num_sampled.get(req_id, 0)
            # vLLM's own rule (Scheduler.update_from_output): accepted =
            # sampled - 1, counted only when drafts were verified and sampled.
            accepted = max(n_sampled - 1, 0) if (drafted and n_sampled) else 0
            ids, reason = emitted.get(req_id, ([], None))
            if drafted:
                self._estimator.observe(req_id, len(drafted), accepted)
            lost = req_id in self._drafter_lost
            if reason is not None:
                self._estimator.forget(req_id)
                self._drafter_lost.discard(req_id)
            request = self.requests.get(req_id)
            n_prompt = request.num_prompt_tokens if request is not None else 0
            reqs.append([req_id, list(drafted), accepted, ids, reason, n_prompt, lost])

        if tap.seq % 256 == 0:  # requests aborted by their client never report a finish
            self._drafter_lost &= self.requests.keys()  # (the idle drafter needs the tap)
            for rid in [r for r in self._estimator.per_request if r not in self.requests]:
                self._estimator.forget(rid)
        now = time.monotonic()
        tap.seq += 1
        payload = encode_step(
            tap.seq,
            now,
            t_pre - start + (t_in - t_pre - pre_s),  # vLLM's time, ours excluded
            now - tap.last_end,
            len(num_scheduled),
            scheduler_output.num_spec_tokens_to_schedule,
            scheduler_output.total_num_scheduled_tokens,
            tap.last_tap_s,
            tap.dropped,
            reqs,
            self._controls_applied,
            decision,
        )
        tap.publish(payload)
        tap.last_end = now
        tap.last_tap_s = time.perf_counter() - t_in + pre_s + tap.policy_s
        tap.policy_s = 0.0

    def shutdown(self) -> None:
        if self._tap is not None:
            self._tap.close()
        if self._control is not None:
            self._control.close(0)
        super().shutdown()


class TapScheduler(_TapMixin, Scheduler):
    """vLLM's synchronous scheduler with the tap."""


class TapAsyncScheduler(_TapMixin, AsyncScheduler):
    """vLLM's async scheduler with the tap."""
