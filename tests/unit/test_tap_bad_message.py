"""A bad message on the scheduler tap is logged, counted and skipped: the receiver goes on."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import zmq
import zmq.asyncio

from engine_adapter.engine.tap_receiver import TapReceiver
from engine_adapter.vllm_plugin.wire import encode_step
from tests.support.tap_records import tap_row, tap_step


def _good(seq: int) -> bytes:
    row = tap_row("cmpl-r1-0-0123abcd", drafted=[5], accepted=1, emitted=[5, 6])
    return encode_step(tap_step(seq=seq, t=10.0 + seq, batch_size=1, k=1, num_tokens=2, reqs=[row]))


def test_the_receiver_skips_a_message_that_does_not_decode_and_delivers_the_next():
    async def run() -> tuple[list[int], int, int]:
        addr = f"ipc:///tmp/spec-explorer-test-{uuid.uuid4().hex}"
        tap = TapReceiver(addr)
        tap.start()
        watch = tap.watch()
        queue = tap.register("r1")
        ctx = zmq.asyncio.Context()
        pub = ctx.socket(zmq.PUB)
        pub.connect(addr)
        try:
            await asyncio.sleep(0.3)  # a subscriber sees only what is published after it is connected
            # msgpack but not a step; not msgpack; a step whose row has 2 draft ids for num_drafted=1
            bad_row = ["cmpl-r1-0-0123abcd", [5, 6], 1, [5, 6], None, 4, 1]
            bad_step = msgspec.msgpack.encode([9, 19.0, 0.1, 0.1, 1, 1, 2, 0.0, 0, [bad_row]])
            for payload in (_good(1), b"\x93not a step", _good(2), b"\xc1", bad_step, _good(3)):
                await pub.send(payload)
            seqs = []
            for _ in range(3):
                step = await asyncio.wait_for(watch.get(), 5)
                seqs.append(step.seq)
            rows = [(await asyncio.wait_for(queue.get(), 5)).step.seq for _ in range(3)]
            assert rows == seqs
            return seqs, tap.bad_messages, tap.steps_seen
        finally:
            pub.close(0)
            ctx.term()
            await tap.close()

    seqs, bad, seen = asyncio.run(run())
    assert seqs == [1, 2, 3] and bad == 3 and seen == 3
