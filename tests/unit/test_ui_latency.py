"""The UI latency benchmark's statistics (engine_adapter/measure/ui_latency.py) and the token view's step times."""

from __future__ import annotations

import itertools
from collections import namedtuple

import pytest

from engine_adapter.measure.ui_latency import (
    StepSeen,
    busy_share,
    clock_offset,
    foreground_rate,
    percentile,
    refresh_rate,
    steal_share,
    step_latencies,
    summarise_level,
    table,
)
from engine_adapter.records import Step, Token
from explorer.views.token_view import token_view_value
from scripts.ui_latency import readout_tokens_per_s
from tests.support.token_view_markup import view_steps


@pytest.mark.parametrize(
    "values, q, expected",
    [
        ([], 50, None),
        ([7.0], 95, 7.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),  # between the middle two
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([4.0, 1.0, 3.0, 2.0], 50, 2.5),  # unsorted input
        (list(map(float, range(1, 21))), 95, 19.05),  # numpy's linear: 1 + 19 * 0.95
        ([1.0, 2.0], 150, 2.0),  # q clamped
    ],
)
def test_percentile(values, q, expected):
    got = percentile(values, q)
    assert got == pytest.approx(expected) if expected is not None else got is None


OFFSET = 1_000_000.0  # epoch = monotonic + 1e6 s


@pytest.mark.parametrize(
    "seen, expected",
    [
        ([], []),
        # one step: seen 25 ms after the engine's step ended
        ([StepSeen(0, 0, 5.0, (5.0 + OFFSET) * 1000 + 25, 1)], [(0, 0, 25.0)]),
        # the same step seen twice (a re-render): the first sighting counts
        (
            [StepSeen(0, 1, 5.0, (5.0 + OFFSET) * 1000 + 40), StepSeen(0, 1, 5.0, (5.0 + OFFSET) * 1000 + 10)],
            [(0, 1, 10.0)],
        ),
        # two requests with the same step index are two steps; sighting order kept
        (
            [StepSeen(1, 0, 9.0, (9.0 + OFFSET) * 1000 + 5), StepSeen(0, 0, 2.0, (2.0 + OFFSET) * 1000 + 7)],
            [(0, 0, 7.0), (1, 0, 5.0)],
        ),
        # two updates coalesced: steps 2 and 3 appear at once, step 2 waited longer
        (
            [StepSeen(0, 2, 3.0, (3.2 + OFFSET) * 1000), StepSeen(0, 3, 3.1, (3.2 + OFFSET) * 1000)],
            [(0, 2, 200.0), (0, 3, 100.0)],
        ),
        # a clock problem shows as a negative latency, not hidden
        ([StepSeen(0, 0, 5.0, (5.0 + OFFSET) * 1000 - 3)], [(0, 0, -3.0)]),
    ],
    ids=["none", "one", "re-render", "two-requests", "coalesced", "negative"],
)
def test_step_latencies_match_each_step_once(seen, expected):
    got = [(s.request, s.step, round(s.latency_ms, 6)) for s in step_latencies(seen, OFFSET)]
    assert got == expected


@pytest.mark.parametrize(
    "net_ms, expected",
    [
        (None, None),  # the event's arrival was not seen: unknown, not zero
        ((5.0 + OFFSET) * 1000 + 12, 12.0),  # the event came 12 ms after the step, the DOM 25 ms after
    ],
)
def test_the_network_share_of_a_latency(net_ms, expected):
    (got,) = step_latencies([StepSeen(0, 0, 5.0, (5.0 + OFFSET) * 1000 + 25, 1, net_ms)], OFFSET)
    assert got.latency_ms == pytest.approx(25.0)
    assert got.net_latency_ms == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    "times, window, expected",
    [
        ([], (0.0, 10_000.0), (0, 0.0, 10_000.0)),
        ([1000.0 * i for i in range(1, 11)], (0.0, 10_000.0), (10, 1.0, 1000.0)),
        ([-500.0, 2000.0, 4000.0, 12_000.0], (0.0, 10_000.0), (2, 0.2, 6000.0)),  # outside the window: not counted
        ([5.0], (10.0, 10.0), (0, 0.0, None)),  # an empty window
    ],
)
def test_refresh_rate(times, window, expected):
    n, rate, gap = refresh_rate(times, *window)
    assert (n, pytest.approx(rate), gap) == (expected[0], expected[1], expected[2])


@pytest.mark.parametrize(
    "tasks, window, expected",
    [
        ([], (0.0, 1000.0), (0, 0.0)),
        ([(100.0, 100.0), (500.0, 50.0)], (0.0, 1000.0), (2, 0.15)),
        ([(-60.0, 100.0), (980.0, 100.0)], (0.0, 1000.0), (2, 0.06)),  # clipped to the window's edges
        ([(-200.0, 100.0), (1000.0, 70.0)], (0.0, 1000.0), (0, 0.0)),  # outside: not counted
        ([(5.0, 10.0)], (10.0, 10.0), (0, 0.0)),  # an empty window
    ],
)
def test_busy_share_of_the_pages_main_thread(tasks, window, expected):
    n, share = busy_share(tasks, *window)
    assert (n, share) == (expected[0], pytest.approx(expected[1]))


CpuTimes = namedtuple("CpuTimes", "user system idle steal")  # psutil.cpu_times() on Linux, in part
NoSteal = namedtuple("NoSteal", "user system idle")  # a platform that does not report steal
LinuxTimes = namedtuple("LinuxTimes", "user nice system idle steal guest guest_nice")  # guest: inside user/nice


@pytest.mark.parametrize(
    "before, after, expected",
    [
        (CpuTimes(10, 5, 80, 5), CpuTimes(30, 15, 110, 25), 0.25),  # 20 of 80 s stolen
        (CpuTimes(10, 5, 80, 5), CpuTimes(20, 5, 90, 5), 0.0),
        (CpuTimes(10, 5, 80, 5), CpuTimes(10, 5, 80, 5), None),  # no time passed
        (NoSteal(10, 5, 80), NoSteal(20, 5, 90), None),
        (LinuxTimes(10, 0, 5, 80, 5, 0, 0), LinuxTimes(30, 10, 15, 100, 25, 10, 10), 0.25),  # 20 of 80 s
    ],
)
def test_steal_share_of_the_machines_cpu(before, after, expected):
    assert steal_share(before, after) == (None if expected is None else pytest.approx(expected))


def test_clock_offset_takes_the_narrowest_bracket():
    mono = iter([10.0, 10.5, 20.0, 20.002, 30.0, 30.1]).__next__
    wall = iter([1010.3, 1020.0, 1030.0]).__next__  # the second bracket is 2 ms wide
    offset, width = clock_offset(wall, mono, n=3)
    assert (offset, width) == (pytest.approx(999.999), pytest.approx(0.002))


def test_summarise_level_and_table():
    seen = [StepSeen(0, i, float(i), (i + OFFSET) * 1000 + 10 * (i + 1), 2, (i + OFFSET) * 1000 + i) for i in range(10)]
    r = summarise_level(16, 1, seen, OFFSET, 10, [1000.0, 2000.0, 3000.0], (0.0, 4000.0), running_in_engine=17)
    assert (r.steps, r.steps_expected, r.max_ms, r.chart_refreshes) == (10, 10, pytest.approx(100.0), 3)
    assert r.p50_ms == pytest.approx(55.0) and r.p95_ms == pytest.approx(95.5)
    assert r.net_p50_ms == pytest.approx(4.5) and r.net_p95_ms == pytest.approx(8.55)
    assert r.chart_refresh_per_s == pytest.approx(0.75) and r.window_s == 4.0
    assert table([r]).splitlines()[1].split()[:3] == ["16", "17", "1"]
    # 2 tokens a step, one step a second: steps 1-9 give 18 tokens over 9 s
    assert r.foreground_tokens_per_s == pytest.approx(2.0) and r.total_tokens_per_s == pytest.approx(2.0)


@pytest.mark.parametrize(
    "seen, expected",
    [
        ([], None),
        ([StepSeen(0, 0, 5.0, 0.0, 1)], None),  # a prefill alone: nothing decoded yet
        # two requests: (3 + 3) tokens over 1.5 s, then 4 over 0.5 s, pooled: 10 / 2
        (
            [
                StepSeen(0, 0, 1.0, 0.0, 1),
                StepSeen(0, 1, 2.0, 0.0, 3),
                StepSeen(0, 1, 2.0, 9.0, 3),  # seen twice: counted once
                StepSeen(0, 2, 2.5, 0.0, 3),
                StepSeen(1, 0, 4.0, 0.0, 1),
                StepSeen(1, 1, 4.5, 0.0, 4),
            ],
            5.0,
        ),
    ],
)
def test_foreground_rate_counts_decoding_by_the_engines_step_times(seen, expected):
    got = foreground_rate(seen)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_the_readout_gives_the_background_rate():
    text = (
        "Your background load: 16 requested, 16 granted. All sessions: 16 in flight, 3 done, 0 failed; 41.5 tokens/s."
    )
    assert readout_tokens_per_s(text) == pytest.approx(41.5) and readout_tokens_per_s("No background load.") is None


def test_the_token_view_carries_each_steps_engine_time():
    """data-t: the step's Step.t as a plain number (inert as it is), for scripts/ui_latency.py."""
    tok = Token(id=1, text="<b>", kind="prefill", step=0, draft_pos=None, k=3, batch_size=1)
    steps = [
        Step(index=i, t=t, wall_s=0.01, batch_size=1, k=3, drafted=[], num_drafted=0, accepted=0, emitted=[1])
        for i, t in zip(itertools.count(), [12345.6789012345, 7.0])
    ]
    steps[0].tokens.append(tok)
    steps_shown = view_steps(token_view_value(steps))
    assert [s["ts"] for s in steps_shown] == ["12345.678901", "7.000000"]
    assert steps_shown[0]["t"][0]["h"] == "&lt;b&gt;"
