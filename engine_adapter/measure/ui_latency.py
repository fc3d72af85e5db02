"""UI latency statistics: engine step -> token view, and the live charts' refresh rate.

Contract (pure: no engine, browser or network; ``scripts/ui_latency.py`` feeds it):

- ``StepSeen``: one engine step of a foreground request as the page first showed it:
  its index (``data-step``), its engine time ``t`` (``data-t``: ``Step.t``, seconds of
  the engine host's ``time.monotonic()``) and ``seen_ms``, the page's clock
  (``performance.timeOrigin + performance.now()``, ms) in the MutationObserver callback where its span first
  appeared in the token view; ``net_ms``, where known, when the page's script first read
  the server-sent event that carried the step (its ``data-t``), on the same clock (the read
  runs on the page's main thread: an upper bound on the event's arrival).
- ``clock_offset(clock, mono)``: ``clock() - time.monotonic()`` in seconds, read
  between two monotonic reads (the narrowest bracket of ``n``); the script passes the
  page's clock, read through the page: valid for the engine's times when the engine, this
  process and the browser share one host (Linux's CLOCK_MONOTONIC is one clock for every
  process, and Chromium's ``performance.now()`` reads it; the wall clock, which a virtual
  machine may step, is not used).
- ``step_latencies(seen, offset_s)``: each (request, step) once, at its first sighting;
  latency in milliseconds = ``seen_ms - (t + offset_s) * 1000`` (and the same for ``net_ms``:
  the part of it spent before the page had the data).
- ``percentile(values, q)``: linear interpolation between closest ranks (numpy's
  default), ``q`` in 0..100; ``None`` for no values.
- ``refresh_rate(times_ms, start_ms, end_ms)``: chart redraws per second inside the window.
- ``busy_share(tasks_ms, start_ms, end_ms)``: the page's main-thread long tasks (Chromium's
  ``longtask`` entries, each (start, duration) in ms of the page's clock) that overlap the window, and
  the share of the window they cover: time the page could not draw a step.
- ``steal_share(before, after)``: the share of the machine's CPU time the hypervisor gave to
  other guests between two ``psutil.cpu_times()`` reads (Linux's ``steal``; 0 on bare metal,
  ``None`` where the platform does not report it): a level measured under steal had less CPU.
- ``summarise_level(...)`` -> ``LevelResult``; ``table(results)`` the printed table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StepSeen:
    request: int  # the benchmark's request number (unique within a run)
    step: int  # the request's step index (data-step)
    t: float  # Step.t: engine host's time.monotonic(), seconds
    seen_ms: float  # the page's clock at first appearance, ms (performance.timeOrigin + performance.now())
    tokens: int = 0  # emitted tokens shown for the step (rejected ghosts left out)
    net_ms: float | None = None  # the page's clock when the event carrying it arrived, ms


@dataclass(frozen=True, slots=True)
class StepLatency:
    request: int
    step: int
    tokens: int
    latency_ms: float  # engine step end -> its span in the token view's DOM
    net_latency_ms: float | None = None  # engine step end -> the browser has the event carrying it


@dataclass(frozen=True, slots=True)
class LevelResult:
    load: int  # background requests asked for (the page's slider)
    requests: int  # foreground requests run at this level
    steps: int  # engine steps measured (each once)
    steps_expected: int  # engine steps the page's footers reported for those requests
    p50_ms: float | None
    p95_ms: float | None
    max_ms: float | None
    net_p50_ms: float | None  # the same, to the event's arrival in the browser (before rendering)
    net_p95_ms: float | None
    chart_refreshes: int  # live-chart redraws inside the window
    window_s: float  # the chart window's length, seconds
    chart_refresh_per_s: float
    max_chart_gap_ms: float | None  # the longest time between two redraws in the window
    running_in_engine: int | None = None  # the readout's figure while the level ran
    # tokens/s: the foreground requests' decoding (engine step times: tokens after each request's first
    # step over the time from its first step to its last), and the background load's (the page's readout)
    foreground_tokens_per_s: float | None = None
    background_tokens_per_s: float | None = None
    # the page's main thread: its long tasks (over 50 ms, Chromium's longtask entries) inside the window
    long_tasks: int | None = None
    long_task_share: float | None = None  # their summed time over the window's, 0..1
    cpu_steal_share: float | None = None  # the machine's CPU time stolen by its hypervisor in the level, 0..1
    # cores used in the level by the app's own process, the engine it started and the browser
    cpu_cores: dict[str, float] | None = None

    @property
    def total_tokens_per_s(self) -> float | None:
        if self.foreground_tokens_per_s is None:
            return None
        return self.foreground_tokens_per_s + (self.background_tokens_per_s or 0.0)


def clock_offset(clock: Callable[[], float], mono: Callable[[], float], n: int = 9) -> tuple[float, float]:
    """(clock - monotonic offset, bracket width) in seconds, from the narrowest of ``n`` brackets."""
    best: tuple[float, float] | None = None
    for _ in range(max(n, 1)):
        a = mono()
        c = clock()
        b = mono()
        cand = (c - (a + b) / 2, b - a)
        if best is None or cand[1] < best[1]:
            best = cand
    assert best is not None
    return best


def step_latencies(seen: Sequence[StepSeen], offset_s: float) -> list[StepLatency]:
    """Each (request, step, t) once, at its earliest sighting, in sighting order."""
    first: dict[tuple[int, int, float], StepSeen] = {}
    for s in seen:
        key = (s.request, s.step, s.t)
        if key not in first or s.seen_ms < first[key].seen_ms:
            first[key] = s
    ordered = sorted(first.values(), key=lambda s: (s.seen_ms, s.request, s.step))
    return [
        StepLatency(
            s.request,
            s.step,
            s.tokens,
            s.seen_ms - (s.t + offset_s) * 1000.0,
            None if s.net_ms is None else s.net_ms - (s.t + offset_s) * 1000.0,
        )
        for s in ordered
    ]


def foreground_rate(seen: Sequence[StepSeen]) -> float | None:
    """Tokens per second of the foreground requests' decoding, pooled: the tokens of every step
    after a request's first (its prefill's token is the time to first token, not decoding) over
    the time from its first step to its last, by the engine's own step times (seconds)."""
    by_request: dict[int, dict[int, StepSeen]] = {}
    for s in seen:
        by_request.setdefault(s.request, {}).setdefault(s.step, s)
    tokens, span = 0, 0.0
    for steps in by_request.values():
        ordered = sorted(steps.values(), key=lambda s: s.t)
        if len(ordered) >= 2:
            tokens += sum(s.tokens for s in ordered[1:])
            span += ordered[-1].t - ordered[0].t
    return tokens / span if span > 0 else None


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * min(max(q, 0.0), 100.0) / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def refresh_rate(times_ms: Sequence[float], start_ms: float, end_ms: float) -> tuple[int, float, float | None]:
    """(redraws, per second, longest gap in ms) inside [start_ms, end_ms]; gaps count the window's edges."""
    inside = sorted(t for t in times_ms if start_ms <= t <= end_ms)
    span_s = (end_ms - start_ms) / 1000.0
    if span_s <= 0:
        return len(inside), 0.0, None
    edges = [start_ms, *inside, end_ms]
    gap = max(b - a for a, b in zip(edges, edges[1:]))
    return len(inside), len(inside) / span_s, gap


def busy_share(tasks_ms: Sequence[tuple[float, float]], start_ms: float, end_ms: float) -> tuple[int, float]:
    """(tasks that overlap [start_ms, end_ms], the share of the window they cover); a task is
    (start, duration) in ms since the epoch, clipped to the window."""
    span = end_ms - start_ms
    if span <= 0:
        return 0, 0.0
    overlap = [(max(t, start_ms), min(t + d, end_ms)) for t, d in tasks_ms if t < end_ms and t + d > start_ms]
    return len(overlap), sum(b - a for a, b in overlap) / span


# Linux counts a guest's own virtual CPUs inside user and nice as well: summed once, not twice
COUNTED_ELSEWHERE = ("guest", "guest_nice")


def steal_share(before: Any, after: Any) -> float | None:
    """Stolen CPU time over all CPU time between two ``psutil.cpu_times()`` reads (named tuples, seconds)."""
    if not hasattr(before, "steal") or not hasattr(after, "steal"):
        return None
    fields = [f for f in after._fields if f not in COUNTED_ELSEWHERE]
    total = sum(getattr(after, f) - getattr(before, f) for f in fields)
    return (after.steal - before.steal) / total if total > 0 else None


def summarise_level(
    load: int,
    requests: int,
    seen: Sequence[StepSeen],
    offset_s: float,
    steps_expected: int,
    chart_ms: Sequence[float],
    window_ms: tuple[float, float],
    running_in_engine: int | None = None,
    background_tokens_per_s: float | None = None,
    long_tasks_ms: Sequence[tuple[float, float]] | None = None,
    cpu_steal_share: float | None = None,
    cpu_cores: dict[str, float] | None = None,
) -> LevelResult:
    steps = step_latencies(seen, offset_s)
    lat = [s.latency_ms for s in steps]
    net = [s.net_latency_ms for s in steps if s.net_latency_ms is not None]
    n, rate, gap = refresh_rate(chart_ms, *window_ms)
    busy = busy_share(long_tasks_ms, *window_ms) if long_tasks_ms is not None else (None, None)
    return LevelResult(
        load=load,
        requests=requests,
        steps=len(lat),
        steps_expected=steps_expected,
        p50_ms=percentile(lat, 50),
        p95_ms=percentile(lat, 95),
        max_ms=max(lat) if lat else None,
        net_p50_ms=percentile(net, 50),
        net_p95_ms=percentile(net, 95),
        chart_refreshes=n,
        window_s=(window_ms[1] - window_ms[0]) / 1000.0,
        chart_refresh_per_s=rate,
        max_chart_gap_ms=gap,
        running_in_engine=running_in_engine,
        foreground_tokens_per_s=foreground_rate(seen),
        background_tokens_per_s=background_tokens_per_s,
        long_tasks=busy[0],
        long_task_share=busy[1],
        cpu_steal_share=cpu_steal_share,
        cpu_cores=cpu_cores,
    )


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _cores(cores: dict[str, float] | None) -> str:
    if not cores:
        return "-"
    return "/".join(f"{cores.get(k, 0.0):.2f}" for k in ("app", "engine", "browser"))


def table(results: Sequence[LevelResult]) -> str:
    head = (
        "load  running  requests  steps (of)  p50 ms  p95 ms  max ms  net p50  net p95  chart/s  max gap ms"
        "  fg tok/s  bg tok/s  total tok/s  busy  steal  cores app/engine/browser"
    )
    rows = [
        f"{r.load:>4}  {r.running_in_engine if r.running_in_engine is not None else '-':>7}  {r.requests:>8}  "
        f"{r.steps:>5} ({r.steps_expected:>3})  {_ms(r.p50_ms):>6}  {_ms(r.p95_ms):>6}  {_ms(r.max_ms):>6}  "
        f"{_ms(r.net_p50_ms):>7}  {_ms(r.net_p95_ms):>7}  {r.chart_refresh_per_s:>7.2f}  {_ms(r.max_chart_gap_ms):>10}"
        f"  {_rate(r.foreground_tokens_per_s):>8}  {_rate(r.background_tokens_per_s):>8}"
        f"  {_rate(r.total_tokens_per_s):>11}"
        f"  {'-' if r.long_task_share is None else f'{r.long_task_share:.2f}':>4}"
        f"  {'-' if r.cpu_steal_share is None else f'{r.cpu_steal_share:.2f}':>5}"
        f"  {_cores(r.cpu_cores)}"
        for r in results
    ]
    return "\n".join([head, *rows])
