"""The plugin's control channel: bytes that do not decode, or a command that is not one, are
skipped inside the plugin's guard; the engine's K table still takes the next good command."""

from __future__ import annotations

import types
import uuid

import zmq

from engine_adapter.vllm_plugin.policy_hooks import PolicyHooksMixin
from engine_adapter.vllm_plugin.wire import encode_control


class ControlOnly(PolicyHooksMixin):
    """The mixin's control channel alone: what ``_apply_control`` reads, without a scheduler."""

    def __init__(self, addr: str) -> None:
        self.scheduler_config = types.SimpleNamespace(max_num_seqs=8)
        self.num_spec_tokens = 3
        self.dynamic_sd_lookup = [3] * 9
        self._auction_cost = None
        self._catch_up_tokens = 0
        self._draft_model = True
        self._acceptance = None
        self._controls_applied = 0
        self._control = zmq.Context.instance().socket(zmq.PULL)
        self._control.setsockopt(zmq.LINGER, 0)
        self._control.bind(addr)


def test_bad_control_messages_are_skipped_and_the_next_applies():
    addr = f"inproc://control-{uuid.uuid4().hex}"
    hooks = ControlOnly(addr)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(addr)
    try:
        for payload in (b"\xc1 not msgpack", encode_control([1, 2]), encode_control({"table": "x"})):
            push.send(payload)
        push.send(encode_control({"table": [[1, 8, 1]]}))
        for _ in range(50):  # the messages are in flight for a moment
            hooks._apply_control()
            if hooks._controls_applied == 4:
                break
            zmq.Poller().poll(10)
        assert hooks._controls_applied == 4
        assert hooks.dynamic_sd_lookup[1:] == [1] * 8  # the good table is in force
    finally:
        push.close(0)
        hooks._control.close(0)
