"""The request card, its charts and the token tooltips: what they say when an idle drafter
dropped the request or no draft was tested."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine_adapter.records import RequestResult, Step, Token
from engine_adapter.service.backend import SpeedSettings
from explorer.views.lossless import compare, verdict_markdown
from explorer.views.request_card import card_markdown, histogram_figure, position_figure
from explorer.views.token_view import token_view_value
from tests.support.token_view_markup import view_steps

METRICS = {
    "mean_acceptance_length": 1.5,
    "draft_acceptance_rate": 0.5,
    "acceptance_histogram": [1, 1],
    "num_spec_steps": 2,
    "num_accepted_draft_tokens": 1,
    "num_draft_tokens": 2,
    "num_spec_tokens": 1,
}


def _step(index: int, emitted: list[int], drafted: list[int], accepted: int, idle: bool) -> Step:
    kinds = ["prefill"] if index == 0 else (["accepted"] * accepted + ["recovered" if drafted else "plain"])
    tokens = [
        Token(id=t, text=f"t{t}", kind=k, step=index, draft_pos=None, k=len(drafted), batch_size=2)
        for t, k in zip(emitted, kinds)
    ]
    return Step(
        index=index,
        t=float(index),
        wall_s=0.01,
        batch_size=2,
        k=len(drafted),
        drafted=drafted,
        num_drafted=len(drafted),
        accepted=accepted,
        emitted=emitted,
        tokens=tokens,
        drafter_idle=idle,
    )


def _result(steps: list[Step]) -> RequestResult:
    ids = [t for s in steps for t in s.emitted]
    return RequestResult(
        request_id="r",
        prompt="p",
        text="",
        token_ids=ids,
        kinds=[],
        steps=steps,
        provenance="tap",
        spec_decode_metrics=METRICS,
        tap_metrics=None,
        finish_reason="length",
        num_prompt_tokens=3,
        t_start=0.0,
        t_first_token=0.1,
        t_end=1.0,
    )


@pytest.mark.parametrize(
    "idle_from, says",
    [
        (None, None),
        (2, "drafter idle from step 2"),  # steps 2 and 3: 1 + 1 tokens from the target alone
        (1, "drafter idle from step 1"),
    ],
    ids=["never", "late", "early"],
)
def test_the_card_says_when_the_drafter_went_idle(idle_from, says):
    steps = [
        _step(0, [1], [], 0, False),
        _step(1, [2, 3], [9], 1, idle_from == 1),
        _step(2, [4], [], 0, idle_from is not None),
        _step(3, [5], [], 0, idle_from is not None),
    ]
    card = card_markdown(_result(steps))
    tips = [t["tip"] for s in view_steps(token_view_value(steps)) for t in s["t"]]
    if says is None:
        assert "drafter idle" not in card and not any("drafter idle" in t for t in tips)
    else:
        assert says in card
        n_after = sum(len(s.emitted) for s in steps if s.index >= idle_from)
        assert f"the last {n_after} tokens came from the target alone" in card
        assert sum("drafter idle" in t for t in tips) == n_after


def test_the_card_and_the_tooltips_say_when_the_drafter_caught_up():
    steps = [
        _step(0, [1], [], 0, False),
        _step(1, [2], [], 0, True),  # K=0: the hole opens
        _step(2, [3], [], 0, True),
        _step(3, [4], [], 0, False),  # caught up 2 tokens here (its drafts start at the next step)
        _step(4, [5, 6], [7], 1, False),
    ]
    steps[3].caught_up = 2
    card = card_markdown(_result(steps))
    assert "drafter caught up 2 tokens at step 3" in card and "K was 0 at step 1" in card
    assert "drafts for this request again from step 4" in card
    assert "drafter idle from step" not in card  # the hole was filled
    tips = [[t["tip"] for t in s["t"]] for s in view_steps(token_view_value(steps))]  # per step
    assert all("drafter caught up 2 tokens at step 3" in t for t in tips[3])
    assert sum("drafter idle" in t for ts in tips for t in ts) == 2  # the tokens of steps 1 and 2
    assert not any("drafter caught up" in t for n in (0, 1, 2, 4) for t in tips[n])


def test_the_card_and_the_tooltips_say_when_the_drafter_drafted_across_its_hole():
    """A hole longer than the catch-up budget: the request drafts again without a catch-up."""
    steps = [
        _step(0, [1], [], 0, False),
        _step(1, [2], [], 0, True),  # K=0: the hole opens
        _step(2, [3], [], 0, True),
        _step(3, [4, 5], [8, 9], 1, True),  # drafts made at the end of step 2, across the hole
        _step(4, [6], [7], 0, True),
    ]
    card = card_markdown(_result(steps))
    assert "drafter idle from step 1, drafting across the hole from step 3" in card
    assert "came from the target alone" not in card and "caught up" not in card
    tips = [[t["tip"] for t in s["t"]] for s in view_steps(token_view_value(steps))]
    assert all("drafted across a hole" in t for n in (3, 4) for t in tips[n])
    assert not any("drafted across" in t for n in (0, 1, 2) for t in tips[n])
    assert all("drafter idle for this request" in t for n in (1, 2) for t in tips[n])


def test_a_second_hole_after_a_catch_up_is_told_apart_from_drafting_across_the_first():
    steps = [
        _step(0, [1], [], 0, False),
        _step(1, [2], [], 0, True),  # a hole opens ...
        _step(2, [3, 4], [8], 1, True),  # ... drafted across (the budget was lower then)
        _step(3, [5], [], 0, False),  # caught up here (the budget was raised)
        _step(4, [6], [], 0, True),  # a second hole, never filled nor drafted across
        _step(5, [7], [], 0, True),
    ]
    steps[3].caught_up = 3
    card = card_markdown(_result(steps))
    assert "drafter caught up 3 tokens at step 3" in card
    assert "drafter idle from step 4" in card and "the last 2 tokens came from the target alone" in card
    assert "drafting across the hole from step 2" not in card  # it was caught up since


@pytest.mark.parametrize(
    "ks, says",
    [
        ([1, 1, 1], None),  # K in force = num_spec_tokens (1): nothing to add
        ([0, 0, 0], "K in force for this request's steps: **0**"),
        ([0, 1, 0], "K in force for this request's steps: **0–1**"),
    ],
    ids=["same", "all-zero", "range"],
)
def test_the_card_says_which_k_the_steps_ran_with(ks, says):
    steps = [_step(0, [1], [], 0, False)] + [
        replace(_step(i + 1, [i + 2], [], 0, False), k=k) for i, k in enumerate(ks)
    ]
    card = card_markdown(_result(steps))
    assert "num_spec_tokens (K) **1**" in card
    assert (says in card) if says else "K in force" not in card


SPEC_OFF = None
NO_VERIFY = {
    **METRICS,
    "acceptance_histogram": [0, 0],
    "num_spec_steps": 0,
    "num_accepted_draft_tokens": 0,
    "num_draft_tokens": 0,
    "per_step_accepted": [],
    "per_step_drafted": [],
}
DRAFTED = {**METRICS, "per_step_accepted": [1, 0], "per_step_drafted": [1, 1]}


@pytest.mark.parametrize(
    "metrics, hist_says, pos_says",
    [
        ("no run", "Run a prompt", "Run a prompt"),
        (SPEC_OFF, "Speculation is off", "Speculation is off"),
        (NO_VERIFY, "No verify steps: K was 0", "No verify steps: K was 0"),
        ("one token", "ended at its first token", "ended at its first token"),
        ({**METRICS}, None, "No per-step drafts recorded"),  # totals only (no tap)
        (DRAFTED, None, None),
    ],
    ids=["no-run", "spec-off", "k0-throughout", "one-token", "totals-only", "drafted"],
)
def test_an_empty_draft_chart_says_why(metrics, hist_says, pos_says):
    steps = [_step(0, [1], [], 0, False), _step(1, [2, 3], [9], 1, False)]
    if metrics == "one token":
        steps, metrics = steps[:1], NO_VERIFY
    result = None if metrics == "no run" else replace(_result(steps), spec_decode_metrics=metrics)
    for fig, says in ((histogram_figure(result), hist_says), (position_figure(result), pos_says)):
        notes = [a.text for a in fig.layout.annotations]
        if says is None:
            assert notes == [] and len(fig.data) == 1  # the bars
        else:
            assert len(notes) == 1 and says in notes[0] and len(fig.data) == 0


def test_a_running_requests_charts_say_when_they_come():
    for fig in (histogram_figure(None, running=True), position_figure(None, running=True)):
        notes = [a.text for a in fig.layout.annotations]
        assert notes == ["Drawn when this request ends."] and len(fig.data) == 0


def test_the_cards_speed_comes_with_its_settings_line():
    settings = SpeedSettings("a CPU, 2 cores", "bfloat16", "t / d", "draft", "auto table", 4, "today")
    result = _result([_step(0, [5], [], 0, False), _step(1, [6, 7], [6], 1, False)])
    text = card_markdown(result, settings=settings)
    assert "*Measured on* a CPU, 2 cores, bfloat16; t / d; method draft, policy auto table; 4 background" in text
    assert "Measured on" not in card_markdown(result)
    plain = replace(result, spec_decode_metrics=None, t_end=2.0)
    verdict = verdict_markdown(compare(result, plain, 0.0), result, plain, settings)
    assert "(on a CPU, 2 cores" in verdict and "the speculation-off twin runs alone" in verdict, verdict
