"""The background load's tokens/s: what the engine emitted for its requests in the window, finished or not."""

from __future__ import annotations

import threading
import time

import pytest

from engine_adapter.records import Step
from engine_adapter.service.load import BackgroundLoad


def _step(t: float, n: int) -> Step:
    return Step(index=1, t=t, wall_s=0.1, batch_size=64, k=0, drafted=[], num_drafted=0, accepted=0, emitted=[7] * n)


@pytest.mark.parametrize(
    "ages_and_tokens, expected",
    [
        ([], 0.0),
        ([(1.0, 4), (5.0, 6)], 1.0),  # 10 tokens in the last 10 s, none of their requests finished
        ([(1.0, 4), (15.0, 100)], 0.4),  # a step older than the window does not count
    ],
)
def test_the_rate_counts_tokens_as_the_engine_emits_them(ages_and_tokens, expected):
    load = BackgroundLoad(client=None, prompts=["p"])  # no request is started: only its bookkeeping runs
    now = time.monotonic()
    for age, n in ages_and_tokens:
        load.note_step(_step(now - age, n))
    assert load.tokens_per_second(window_s=10.0) == pytest.approx(expected, rel=1e-3)


def test_the_rate_can_be_read_while_steps_arrive_from_another_thread():
    """A page's handler thread reads the rate while the event loop's thread notes steps (the soak
    saw "deque mutated during iteration" before the log had a lock)."""
    load = BackgroundLoad(client=None, prompts=["p"])
    stop = threading.Event()

    def note() -> None:
        while not stop.is_set():
            load.note_step(_step(time.monotonic(), 1))

    writer = threading.Thread(target=note)
    writer.start()
    try:
        deadline = time.monotonic() + 1.0
        reads = 0
        while time.monotonic() < deadline:
            assert load.tokens_per_second() >= 0.0
            reads += 1
    finally:
        stop.set()
        writer.join()
    assert reads > 10 and load.tokens_per_second() > 0.0
