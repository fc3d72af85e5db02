"""A bad message on the scheduler tap is logged, counted and skipped: the receiver goes on."""

from __future__ import annotations

import asyncio
import uuid

import zmq
import zmq.asyncio

from engine_adapter.engine.tap_receiver import TapReceiver
from engine_adapter.vllm_plugin.wire import encode_step


def _good(seq: int) -> bytes:
    row = ["cmpl-r1-0-0123abcd", [5], 1, [5, 6], None, 4]
    return encode_step(seq, 10.0 + seq, 0.1, 0.1, 1, 1, 2, 0.0, 0, [row])


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
            for payload in (_good(1), b"\x93not a step", _good(2), b"\xc1", _good(3)):
                await pub.send(payload)
            seqs = []
            for _ in range(3):
                step = await asyncio.wait_for(watch.get(), 5)
                seqs.append(step.seq)
            rows = [(await asyncio.wait_for(queue.get(), 5))[0].seq for _ in range(3)]
            assert rows == seqs
            return seqs, tap.bad_messages, tap.steps_seen
        finally:
            pub.close(0)
            ctx.term()
            await tap.close()

    seqs, bad, seen = asyncio.run(run())
    assert seqs == [1, 2, 3] and bad == 2 and seen == 3
