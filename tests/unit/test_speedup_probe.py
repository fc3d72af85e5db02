"""The page's speed measurement, its arithmetic and its order: plain and the policy interleaved
(neither always first), the policy in force restored after a failure too, the rates read from
each request's own stream, the table with its settings line."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from engine_adapter.policy.controller import PolicySpec
from engine_adapter.prompts import Preset
from engine_adapter.records import RequestResult
from engine_adapter.service.history import EngineHistory
from engine_adapter.service.speedup_probe import (
    ProbeEngine,
    SpeedSettings,
    SpeedupProbe,
    check_probe_args,
    decode_rate,
    probe_prompts,
    speedup_rows,
)

AUTO = PolicySpec("auto")
PROMPTS = [Preset("code", "a", "def f():"), Preset("story", "b", "Once")]
TODAY = time.strftime("%Y-%m-%d")
SETTINGS = SpeedSettings("AMD EPYC, 2 cores", "bfloat16", "1.5b / 0.5b", "draft", "auto table", 8, TODAY)


def result(tokens: int, first: float, end: float) -> RequestResult:
    return RequestResult(
        request_id="r",
        prompt="p",
        text="",
        token_ids=[1] * tokens,
        kinds=[],
        steps=[],
        provenance="tap",
        spec_decode_metrics=None,
        tap_metrics=None,
        finish_reason="length",
        num_prompt_tokens=1,
        t_start=0.0,
        t_first_token=first,
        t_end=end,
    )


def test_the_decode_rate_leaves_the_first_token_out() -> None:
    assert decode_rate(result(11, 2.0, 4.0)) == 5.0  # 10 tokens in the 2 s after the first
    assert decode_rate(result(1, 2.0, 2.0)) == 0.0
    assert decode_rate(replace(result(5, 2.0, 4.0), t_first_token=None)) == 0.0


def test_rows_are_the_median_ratio_per_task() -> None:
    (code,) = speedup_rows({"code": [(5.0, 10.0), (5.0, 6.0), (4.0, 8.0), (0.0, 9.0)]})
    assert (code.speedup, code.speedup_min, code.speedup_max, code.repeats) == (2.0, 1.2, 2.0, 3)
    assert code.plain_tokens_per_s == 5.0 and code.policy_tokens_per_s == 8.0


def test_plain_and_the_policy_alternate_and_the_policy_is_restored() -> None:
    said: list[str] = []

    async def switch(spec: PolicySpec) -> None:
        said.append(spec.kind)

    async def generate(prompt: str, n: int) -> RequestResult:
        said.append(prompt)
        # plain at 5 tokens/s, the policy at 10 (the last switch says which is in force)
        rate = 5.0 if [x for x in said if x in ("off", "auto")][-1] == "off" else 10.0
        return result(n + 1, 1.0, 1.0 + n / rate)

    probe = SpeedupProbe()
    probe.begin(8, SETTINGS)
    asyncio.run(probe.run(generate, switch, AUTO, PROMPTS, repeats=2, max_tokens=20))
    assert said == [
        *("off", "def f():", "auto", "def f():", "off", "Once", "auto", "Once"),
        *("auto", "def f():", "off", "def f():", "auto", "Once", "off", "Once"),
        "auto",
    ]
    view = probe.view()
    assert view.state == "done" and view.done_runs == 8
    assert [(r.task, r.speedup, r.repeats) for r in view.rows] == [("code", 2.0, 2), ("story", 2.0, 2)]
    table = view.markdown()
    assert "| code | 2.00x | 2.00-2.00x | 2 | 5.00 | 10.00 |" in table
    assert "Measured on AMD EPYC, 2 cores, bfloat16; 1.5b / 0.5b; method draft, policy auto table; " in table
    assert view.csv().splitlines()[1].startswith("code,2.000,2.000,2.000,2,5.000,10.000,")


def test_a_failure_is_said_and_the_policy_still_restored() -> None:
    switched: list[str] = []

    async def switch(spec: PolicySpec) -> None:
        switched.append(spec.kind)

    async def generate(prompt: str, n: int) -> RequestResult:
        raise RuntimeError("the engine restarted during the measurement")

    probe = SpeedupProbe()
    probe.begin(4, SETTINGS)
    with pytest.raises(RuntimeError, match="running already"):
        probe.begin(4, SETTINGS)
    asyncio.run(probe.run(generate, switch, AUTO, PROMPTS, repeats=1, max_tokens=20))
    assert probe.view().state == "failed" and "restarted" in probe.view().message
    assert switched == ["off", "auto"]


def test_bounds_and_prompts() -> None:
    with pytest.raises(ValueError, match="repeats"):
        check_probe_args(0, 64)
    with pytest.raises(ValueError, match="tokens per request"):
        check_probe_args(2, 100_000)
    presets = [*PROMPTS, Preset("code", "c", "for i"), Preset("", "x", "no kind")]
    assert [p.title for p in probe_prompts(presets)] == ["a", "b"]
    with pytest.raises(RuntimeError, match="no preset prompts"):
        probe_prompts([Preset("", "x", "no kind")])


def test_a_policy_that_drafts_nothing_is_refused() -> None:
    async def never(*_args) -> None:
        raise AssertionError("nothing runs")

    engine = ProbeEngine(client=None, still_running=lambda: True, apply=never, acknowledged=never)
    with pytest.raises(RuntimeError, match="drafts nothing"):
        SpeedupProbe().start(engine, PolicySpec("off"), PROMPTS, SETTINGS, 1, 16)
    probe = SpeedupProbe()
    run = probe.start(engine, AUTO, PROMPTS, SETTINGS, 2, 16)
    assert probe.view().state == "running" and probe.view().total_runs == 8
    run.close()  # not run: the coroutine is dropped without a "never awaited" warning


def test_the_engine_wrapper_stops_once_the_engine_changed() -> None:
    async def never(*_args) -> None:
        raise AssertionError("nothing runs")

    gone = ProbeEngine(client=None, still_running=lambda: False, apply=never, acknowledged=never)
    with pytest.raises(RuntimeError, match="engine restarted"):
        asyncio.run(gone.switch(AUTO))


async def test_an_idle_engine_takes_a_policy_switch_at_once():
    """With no request in flight the engine's next step runs under the command: no waiting for a step
    that would never come (each of a measurement's switches at load 0 waited 10 s before)."""
    history = EngineHistory()
    t0 = time.monotonic()
    await history.acknowledged(3, timeout_s=5.0, idle=lambda: True)
    assert time.monotonic() - t0 < 0.5
    await history.acknowledged(3, timeout_s=0.3, idle=lambda: False)  # busy and no step under it: the timeout
    assert time.monotonic() - t0 >= 0.3
