"""Receiving end of the scheduler tap: decode step messages and route them.

Contract: ``TapReceiver(addr)`` binds a ZMQ SUB socket at ``addr`` (the tap in
the engine connects to it) and, once ``start()``-ed inside a running event
loop, delivers:
- to the queue registered for a request (``register(request_id, watched)``) every
  ``(TapStep, TapRequestStep)`` pair that names it, in engine order; within one step, the
  requests registered ``watched`` (a reader's own request) get theirs before all the others
  (background load), so that their consumers wake first;
- to every ``watch()`` queue one ``EngineStep`` summary per engine step.

A message that does not decode (or whose routing fails) is logged, counted in
``bad_messages`` and skipped: the receiver goes on with the next one.

Request ids: the OpenAI server turns our ``request_id`` X into the engine id
``cmpl-X-0-<8 hex>``; ``our_request_id`` undoes that deliberately.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import zmq
import zmq.asyncio

from engine_adapter.acceptance import position_counts
from engine_adapter.engine.step_stream import StreamEvent, TapRow
from engine_adapter.records import EngineStep, RequestInStep, SlotBid, is_profile_request, our_request_id
from engine_adapter.vllm_plugin.wire import TapStep, decode_step

log = logging.getLogger(__name__)


def summarize(step: TapStep) -> EngineStep:
    """Server-wide counts of one step, including acceptance per draft position.

    The per-position counts leave out drafts an idle draft model made across a hole in its KV
    cache (``drafted_across``): they measure the draft model's agreement with the target on the
    text, which the K policies and the acceptance-under-load chart read, while a hole's blank
    tokens are the load's doing. Under a lossy acceptance rule they count vLLM's own verdicts
    (the drafts before the first relaxed one): acceptance stays a property of the text, not of the
    rule. The step's totals (drafted, accepted) count every draft, relaxed ones too, as vLLM
    does."""
    whole = [r for r in step.reqs if not r.drafted_across]
    k = max((r.num_drafted for r in whole), default=0)
    # each request is one "step" of position_counts: position i is tested only if
    # every draft before it was kept
    lossless = [r.lossless_accepted for r in whole]
    acc_pos, reached_pos = position_counts(lossless, [r.num_drafted for r in whole], k)
    drafted = sum(r.num_drafted for r in step.reqs)
    accepted = sum(r.accepted for r in step.reqs)
    emitted = sum(len(r.emitted) for r in step.reqs)
    return EngineStep(
        seq=step.seq,
        t=step.t,
        wall_s=step.wall_s,
        interval_s=step.interval_s,
        batch_size=step.batch_size,
        k=step.k,
        num_tokens=step.num_tokens,
        num_drafted=drafted,
        num_accepted=accepted,
        num_emitted=emitted,
        accepted_per_pos=tuple(acc_pos),
        reached_per_pos=tuple(reached_pos),
        num_drafting=sum(1 for r in step.reqs if r.num_drafted),
        tap_s=step.tap_s,
        controls=step.controls,
        auction_slots=step.auction.slots if step.auction else None,
        auction_ceiling=step.auction.ceiling if step.auction else None,
        bids=tuple(
            SlotBid(our_request_id(b.engine_request_id), tuple(b.scores), b.admitted)
            for b in (step.auction.bids if step.auction else ())
        ),
        profiling_requests=sum(
            1
            for rid in [*(r.engine_request_id for r in step.reqs), *step.skipped]
            if is_profile_request(our_request_id(rid))
        ),
        num_relaxed=sum(len(r.relaxed) for r in step.reqs),
        rule=step.rule,
        requests=tuple(
            RequestInStep(
                # one string per request, shared by all its rows (history keeps thousands of steps)
                request_id=sys.intern(our_request_id(r.engine_request_id)),
                num_drafted=r.num_drafted,
                num_accepted=r.lossless_accepted,
                num_emitted=len(r.emitted),
                drafted_across=r.drafted_across,
            )
            for r in step.reqs
        ),
    )


class TapReceiver:
    def __init__(self, addr: str, watch_maxsize: int = 10_000) -> None:
        self.addr = addr
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.RCVHWM, 100_000)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.bind(addr)
        self._routes: dict[str, asyncio.Queue[StreamEvent]] = {}
        self._watched: set[str] = set()  # request ids served first in each step (register's ``watched``)
        self._watchers: list[asyncio.Queue[EngineStep]] = []
        self._watch_maxsize = watch_maxsize
        self._task: asyncio.Task | None = None
        self.steps_seen = 0
        self.bad_messages = 0  # messages skipped because they did not decode or route
        self.last_step: EngineStep | None = None

    def socket(self, kind: int) -> zmq.asyncio.Socket:
        """A socket in the receiver's ZMQ context (the control channel's PUSH end), closed with it."""
        return self._ctx.socket(kind)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def register(self, request_id: str, watched: bool = False) -> asyncio.Queue[StreamEvent]:
        q: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self._routes[request_id] = q
        if watched:
            self._watched.add(request_id)
        else:
            self._watched.discard(request_id)
        return q

    def unregister(self, request_id: str) -> None:
        self._routes.pop(request_id, None)
        self._watched.discard(request_id)

    def route(self, step: TapStep) -> None:
        """Each request's row of ``step`` onto its queue, the ``first`` requests' before the others
        (asyncio wakes a queue's getter in the order of the puts: at background load 64 the rest
        of a step's rows are 64 consumers' work before a reader's own)."""
        rows = [(our_request_id(r.engine_request_id), r) for r in step.reqs]
        for rid, r in sorted(rows, key=lambda row: row[0] not in self._watched):  # stable: engine order kept
            q = self._routes.get(rid)
            if q is not None:
                q.put_nowait(TapRow(step, r))

    def watch(self) -> asyncio.Queue[EngineStep]:
        q: asyncio.Queue[EngineStep] = asyncio.Queue(maxsize=self._watch_maxsize)
        self._watchers.append(q)
        return q

    def unwatch(self, q: asyncio.Queue[EngineStep]) -> None:
        with contextlib.suppress(ValueError):
            self._watchers.remove(q)

    async def _run(self) -> None:
        while True:
            payload = await self._sock.recv()
            try:
                self.handle(payload)
            except Exception as e:  # one bad message must not end the receiver (every later request would fail)
                self.bad_messages += 1
                log.warning("tap message %d skipped (%d bytes): %r", self.bad_messages, len(payload), e)

    def handle(self, payload: bytes) -> None:
        """Decode one tap message and deliver it (raises on a message that does not decode)."""
        step = decode_step(payload)
        summary = summarize(step)
        self.steps_seen += 1
        self.route(step)
        self.last_step = summary
        for w in self._watchers:
            if w.full():  # a slow watcher loses its oldest steps, not the engine
                w.get_nowait()
            w.put_nowait(summary)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._sock.close(0)
        self._ctx.term()
