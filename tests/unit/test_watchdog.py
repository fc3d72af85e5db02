"""The watchdog's pure parts, as tables: the back-off, exit statuses in words, the health verdicts."""

from __future__ import annotations

import pytest

from engine_adapter.service.watchdog import Backoff, HealthJudge, WatchdogSettings, backoff_delay, describe_exit


@pytest.mark.parametrize(
    "attempt, base, cap, delay",
    [
        (1, 2, 60, 2),
        (2, 2, 60, 4),
        (3, 2, 60, 8),
        (4, 2, 60, 16),
        (5, 2, 60, 32),
        (6, 2, 60, 60),
        (7, 2, 60, 60),
        (500, 2, 60, 60),
        (1, 0.5, 3, 0.5),
        (4, 0.5, 3, 3),
    ],
)
def test_backoff_schedule(attempt, base, cap, delay):
    assert backoff_delay(attempt, base, cap) == delay


def test_backoff_counts_up_and_resets_after_a_healthy_period():
    b = Backoff(base_s=2, cap_s=60, healthy_reset_s=120)
    assert b.next(0.0) == (1, 2)  # first fault
    assert b.next(3.0) == (2, 4)  # the restart failed
    b.healthy(10.0)  # up again ...
    assert b.next(50.0) == (3, 8)  # ... but only 40 s: still counting
    b.healthy(60.0)
    assert b.next(60.0 + 120) == (1, 2)  # healthy for 2 minutes: a fresh count
    b.reset()
    assert b.next(0.0) == (1, 2)
    with pytest.raises(ValueError):
        backoff_delay(0)


@pytest.mark.parametrize(
    "code, words",
    [
        (128 + 9, "killed by signal 9 (SIGKILL)"),
        (128 + 15, "killed by signal 15 (SIGTERM)"),
        (128 + 11, "killed by signal 11 (SIGSEGV)"),
        (-9, "killed by signal 9 (SIGKILL)"),  # the supervisor itself
        (1, "exited with code 1"),
        (0, "exited with code 0"),
    ],
)
def test_exit_status_in_words(code, words):
    assert words in describe_exit(code)


S = WatchdogSettings(hang_after_s=10, dead_after_503=2, stall_after_s=30)


def _verdicts(observations, attached=False):
    """observations: (t, returncode, health, in_flight, steps_seen) -> the kind of each verdict."""
    judge = HealthJudge(S, 0.0, attached=attached)
    out = []
    for t, rc, health, in_flight, steps in observations:
        fault = judge.observe(t, returncode=rc, health=health, in_flight=in_flight, steps_seen=steps)
        out.append(fault.kind if fault else None)
    return out


@pytest.mark.parametrize(
    "observations, kinds",
    [
        ([(1, None, 200, 0, 0), (2, 137, None, 0, 0)], [None, "exited"]),
        ([(1, None, 503, 0, 0), (2, None, 503, 0, 0)], [None, "dead"]),
        ([(1, None, 503, 0, 0), (2, None, 200, 0, 0), (3, None, 503, 0, 0)], [None, None, None]),
        # silent /health: a hang once 10 s passed since the last answer
        (
            [(1, None, 200, 0, 0), (5, None, None, 0, 0), (10, None, None, 0, 0), (11, None, None, 0, 0)],
            [None, None, None, "hung"],
        ),
        (
            [(5, None, None, 0, 0), (9, None, 200, 0, 0), (18, None, None, 0, 0), (19, None, None, 0, 0)],
            [None, None, None, "hung"],
        ),
        # requests in flight and no engine step for 30 s: stalled; steps moving or nothing in flight: fine
        ([(1, None, 200, 2, 5), (20, None, 200, 2, 5), (31, None, 200, 2, 5)], [None, None, "stalled"]),
        ([(1, None, 200, 2, 5), (20, None, 200, 2, 6), (45, None, 200, 2, 7)], [None, None, None]),
        ([(1, None, 200, 0, 5), (40, None, 200, 0, 5), (41, None, 200, 1, 5)], [None, None, None]),
        ([(1, None, 200, 2, None), (100, None, 200, 2, None)], [None, None]),  # no tap: no stall check
    ],
)
def test_health_verdicts(observations, kinds):
    assert _verdicts(observations) == kinds


def test_a_busy_server_streaming_tokens_is_not_hung():
    judge = HealthJudge(S, 0.0)
    # /health times out for 15 s, but the streams kept receiving until t=12: hung only 10 s after that
    verdicts = [judge.observe(t, returncode=None, health=None, http_t=min(t, 12.0)) for t in range(1, 23)]
    assert [v.kind if v else None for v in verdicts].index("hung") == 21
