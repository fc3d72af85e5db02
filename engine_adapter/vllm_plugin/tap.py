"""The scheduler tap's observing half: publish every engine step, change nothing.

Contract: ``TapMixin`` goes before a vLLM v1 scheduler class (see ``schedulers.py``)
and, when ``SPEC_EXPLORER_TAP_ADDR`` is set, publishes one ``wire`` message per
engine step on a ZMQ PUB socket:

- ``schedule()``: remembers when the step started;
- ``update_from_output()``: after vLLM has processed the step, reads per request
  the draft ids the worker verified (``side_channel.VERIFIED_ATTR`` on the worker's
  output; where the worker sent none, only their count, from
  ``scheduled_spec_decode_tokens``: under async scheduling the scheduler's copies are
  ``-1`` placeholders, so they are never published as ids), the ids the target sampled
  (accepted drafts + 1, before any stop truncation) and the ids actually appended to the
  output (``EngineCoreOutput.new_token_ids``).

Async scheduling (vLLM's default on a GPU; its CPU platform forces it off) schedules step
N+1 before step N's output is processed: a request that finishes in N is scheduled once
more in N+1, and vLLM's ``update_from_output`` skips it there. The tap skips exactly the
requests vLLM skips (``unprocessed``), so its counts keep equalling vLLM's metrics, and
each message carries the count of control commands applied when ITS step was scheduled
(not when it was published), so an acknowledgement is never read one step early.

Without the address it behaves exactly as vLLM's scheduler. Publishing never
blocks the engine: if no reader keeps up, messages are dropped and counted. The
tap's own time per step is measured and sent with the next step, so its overhead
is a measured number, not a claim.

Each step has one ``step_context.StepContext``, made here in ``schedule()`` and kept in
``InFlightSteps`` until the step is published: the policy half (``policy_hooks.py``) fills
in the auction's decision, the catch-up, the holes and the acceptance rule and its relaxed
drafts (``step_context(scheduler_output)`` finds it), and the message is built from it.
Two hooks with neutral defaults here remain: ``_observe_request`` (each request's lossless
verdict; returns whether its drafter is idle) and ``_forget_gone`` (housekeeping for
requests vLLM no longer holds); ``_controls_applied`` counts the control commands applied.

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

import os
import time
import traceback

import zmq

from engine_adapter.acceptance_rule import lossless_accepted
from engine_adapter.vllm_plugin.side_channel import VERIFIED_ATTR
from engine_adapter.vllm_plugin.step_context import InFlightSteps, StepContext
from engine_adapter.vllm_plugin.wire import TAP_ADDR_ENV, TapRequestStep, TapStep, encode_step

HOUSEKEEPING_STEPS = 256  # every this many published steps, forget requests vLLM no longer holds


class StepPublisher:
    """Owns the PUB socket and the per-step bookkeeping of one scheduler."""

    def __init__(self, addr: str) -> None:
        self._sock = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(addr)  # the adapter binds; engines come and go
        self.seq = 0
        self.dropped = 0
        self.last_tap_s = 0.0
        self.last_end = time.monotonic()
        self.policy_s = 0.0  # time in control commands and the auction since the last publish

    def publish(self, payload: bytes) -> None:
        try:
            self._sock.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self._sock.close(0)


def unprocessed(scheduler_output, requests: dict) -> set[str]:
    """The step's requests that vLLM's ``Scheduler.update_from_output`` skips (vllm 0.32): gone or
    finished before it runs (async scheduling schedules a request once more after the step that
    finishes it), or whose stale output after a preemption it drops. Read before vLLM's update.
    Not mirrored: vLLM's skip of requests whose KV load failed, which needs a KV connector (the
    explorer never configures one)."""
    skipped = set()
    for rid in scheduler_output.num_scheduled_tokens:
        r = requests.get(rid)
        if r is None or r.is_finished() or (r.num_stale_output_tokens > 0 and r.drop_stale_output):
            skipped.add(rid)
    return skipped


def exact_drafts(verified: dict | None, req_id: str, num_drafted: int) -> list[int] | None:
    """The draft ids the worker verified for a request, [num_drafted]; [] for none; None where the
    worker's report is missing or does not match vLLM's count (the count is then all that is known)."""
    if not num_drafted:
        return []
    ids = verified.get(req_id) if verified is not None else None
    return list(ids) if ids is not None and len(ids) == num_drafted else None


class TapMixin:
    """Mixed in before a vLLM scheduler class; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self, "use_v2_model_runner", False):  # vLLM's Scheduler sets it from the config
            raise RuntimeError(
                "the explorer's plugin needs vLLM's Model Runner V1 (its worker hooks the V1 drafter and "
                "rejection sampler): start vLLM with VLLM_USE_V2_MODEL_RUNNER=0"
            )
        addr = os.environ.get(TAP_ADDR_ENV)
        self._tap = StepPublisher(addr) if addr else None
        self._controls_applied = 0
        self._in_flight = InFlightSteps()

    # --- hooks for the policy half (neutral here) ----------------------------
    def _observe_request(self, req_id: str, num_drafted: int, accepted: int, finished: bool, across: bool) -> bool:
        """One request's verdict this step (``across``: its drafts were made across a hole);
        returns whether its drafter is idle."""
        return False

    def _forget_gone(self) -> None:
        pass

    def step_context(self, scheduler_output) -> StepContext:
        """The context of a step scheduled and not yet published (a fresh one if it was lost)."""
        return self._in_flight.get(scheduler_output) or StepContext()

    def _note_policy_time(self, seconds: float) -> None:
        """Our policy's time counts as the tap's own, not vLLM's."""
        if self._tap is not None:
            self._tap.policy_s += seconds

    # --- vLLM's scheduler API ---------------------------------------------------
    def schedule(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = super().schedule(*args, **kwargs)
        # the policy half applied its control commands before
        self._in_flight.add(out, StepContext(started=t0, controls=self._controls_applied))
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        tap = self._tap
        if tap is None:
            try:
                return super().update_from_output(scheduler_output, model_runner_output)
            finally:
                self._in_flight.pop(scheduler_output)
        t_pre = time.perf_counter()
        # vLLM truncates the sampled lists in place at a stop, so count first.
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        num_sampled = {rid: len(sampled[i]) for rid, i in index.items()} if sampled else {}
        skipped = unprocessed(scheduler_output, self.requests)
        pre_s = time.perf_counter() - t_pre
        try:
            result = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            context = self._in_flight.pop(scheduler_output)
        context = context or StepContext(started=t_pre, controls=self._controls_applied)
        try:
            verified = getattr(model_runner_output, VERIFIED_ATTR, None)
            self._publish(scheduler_output, context, num_sampled, pre_s, result, skipped, verified)
        except Exception:  # an observer must never stop the engine; the gap shows as lost steps
            tap.dropped += 1
            if tap.dropped == 1:  # say why once, in vLLM's log
                traceback.print_exc()
        return result

    def shutdown(self) -> None:
        if self._tap is not None:
            self._tap.close()
        super().shutdown()

    # --- the message ----------------------------------------------------------
    def _request_rows(
        self,
        scheduler_output,
        context: StepContext,
        num_sampled: dict[str, int],
        result,
        skipped: set[str],
        verified: dict | None,
    ) -> list[TapRequestStep]:
        """One ``wire.TapRequestStep`` per request vLLM processed in the step."""
        # ids appended to each request's output this step, after stop checks
        emitted: dict[str, tuple[list[int], str | None]] = {}
        for outs in result.values():
            for o in outs.outputs:
                reason = o.finish_reason
                emitted[o.request_id] = (list(o.new_token_ids), None if reason is None else str(reason))
        spec = scheduler_output.scheduled_spec_decode_tokens
        rows = []
        for req_id in scheduler_output.num_scheduled_tokens:
            if req_id in skipped:
                continue
            num_drafted = len(spec.get(req_id) or ())  # vLLM's count (async: of placeholders)
            n_sampled = num_sampled.get(req_id, 0)
            # vLLM's own rule (Scheduler.update_from_output): accepted = sampled - 1, counted only when
            # drafts were verified and sampled
            accepted = max(n_sampled - 1, 0) if (num_drafted and n_sampled) else 0
            ids, reason = emitted.get(req_id, ([], None))
            relaxed = context.relaxed.get(req_id, [])
            across = bool(num_drafted) and req_id in context.holed
            # the estimators learn vLLM's own verdict, not the lossy rule's
            kept = lossless_accepted(accepted, [r.position for r in relaxed])
            idle = self._observe_request(req_id, num_drafted, kept, reason is not None, across)
            request = self.requests.get(req_id)
            rows.append(
                TapRequestStep(
                    engine_request_id=req_id,
                    drafted=exact_drafts(verified, req_id, num_drafted),
                    accepted=accepted,
                    emitted=ids,
                    finish_reason=reason,
                    num_prompt_tokens=request.num_prompt_tokens if request is not None else 0,
                    num_drafted=num_drafted,
                    drafter_idle=idle,
                    caught_up=context.caught_up.get(req_id, 0),
                    drafted_across=across,
                    relaxed=relaxed,
                )
            )
        return rows

    def _publish(self, scheduler_output, context: StepContext, num_sampled, pre_s, result, skipped, verified) -> None:
        tap = self._tap
        t_in = time.perf_counter()
        num_scheduled = scheduler_output.num_scheduled_tokens
        if not num_scheduled:
            return  # an empty step: nothing ran
        reqs = self._request_rows(scheduler_output, context, num_sampled, result, skipped, verified)
        if tap.seq % HOUSEKEEPING_STEPS == 0:  # requests aborted by their client never report a finish
            self._forget_gone()
        now = time.monotonic()
        tap.seq += 1
        step = TapStep(
            seq=tap.seq,
            t=now,
            wall_s=t_in - context.started - pre_s,  # vLLM's time, ours excluded
            interval_s=now - tap.last_end,
            batch_size=len(num_scheduled),
            k=scheduler_output.num_spec_tokens_to_schedule,
            num_tokens=scheduler_output.total_num_scheduled_tokens,
            tap_s=tap.last_tap_s,
            dropped=tap.dropped,
            reqs=reqs,
            controls=context.controls,
            auction=context.decision,
            rule=context.rule,
            skipped=sorted(skipped),
        )
        payload = encode_step(step)
        tap.publish(payload)
        tap.last_end = now
        tap.last_tap_s = time.perf_counter() - t_in + pre_s + tap.policy_s
        tap.policy_s = 0.0
