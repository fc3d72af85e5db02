"""Bad input, table-driven, against the launched app through gradio_client.

Each case gets a clear answer and breaks nothing: after the whole table the
app still serves a normal request. (Byte-level tokens that are not valid UTF-8
on their own are covered at the token level in tests/test_token_text.py.)
"""

from __future__ import annotations

import json
import re

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from tests.support.token_view_markup import view_steps

# Gradio's own check of a slider value sent through the API (a clear refusal too)
SLIDER = r"(greater than maximum|less than minimum) value"


def answer(client: Client, *args, api_name: str):
    """The handler's reply, or Gradio's refusal message before the handler ran."""
    try:
        return client.predict(*args, api_name=api_name)
    except AppError as e:
        return str(e)


# (case, prompt, temperature, max_tokens, expected message or None for "runs")
RUN_CASES = [
    ("empty", "", 0.0, 16, "Type a prompt"),
    ("blank", " \n\t ", 0.0, 16, "Type a prompt"),
    ("too many characters", "x" * 9000, 0.0, 16, "characters long"),
    ("longer than the context", "word " * 1500, 0.0, 16, "maximum context length"),
    ("temperature too high", "hi", 9.0, 16, SLIDER),
    ("temperature negative", "hi", -1.0, 16, SLIDER),
    ("no tokens", "hi", 0.0, 0, SLIDER),
    ("too many tokens", "hi", 0.0, 100_000, SLIDER),
    ("fractional tokens", "hi", 0.0, 12.5, "Max tokens must be"),
    ("emoji and other scripts", "🙂🚀 café naïve 你好 مرحبا नमस्ते", 0.0, 16, None),
    ("control characters", "a\x00b\x07c\x1b[31m d\x7f e\u200bf", 0.0, 16, None),
    ("html and script", "<script>alert(1)</script><img src=x onerror=alert(1)> ${1+1} `x` \\u0041", 0.0, 16, None),
    ("sampling", "Once upon a time", 1.2, 16, None),
]


@pytest.mark.parametrize("case, prompt, temperature, max_tokens, expected", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_run_inputs(app_url, case, prompt, temperature, max_tokens, expected):
    client = Client(app_url, verbose=False)
    got = answer(client, prompt, temperature, max_tokens, api_name="/run")
    if expected is not None:
        said = got if isinstance(got, str) else (got[0].get("message") or "")
        assert re.search(expected, said), (case, said)
        return
    view, _card, _hist, _pos, trace = got
    trace = json.loads(trace)
    assert view.get("level") != "error", view.get("message")
    assert trace and isinstance(trace["text"], str)
    assert len(trace["kinds"]) == len(trace["token_ids"])
    # greedy runs to max_tokens here; a sampled request may draw the end-of-text token sooner
    if temperature == 0:
        assert len(trace["token_ids"]) == max_tokens
    else:
        assert 0 < len(trace["token_ids"]) <= max_tokens
        assert len(trace["token_ids"]) == max_tokens or trace["finish_reason"] == "stop", trace["finish_reason"]
    for s in view_steps(view):
        for t in s["t"] + s["r"]:  # every token and ghost rendered as inert text
            # the only markup is the view's own (spans marking whitespace and empty tokens)
            assert all(re.fullmatch(r'</?span( class="tv-[a-z]+")?>', tag) for tag in re.findall(r"<[^>]*>", t["h"]))
            assert "${" not in t["h"] and "`" not in t["h"]
            assert "<" not in t["tip"] and "${" not in t["tip"]


# (case, value, expected in the readout)
LOAD_CASES = [
    ("negative", -5, SLIDER),
    ("above the cap", 1000, SLIDER),
    ("fraction", 3.5, "not a whole number between 0 and 64"),
    ("zero", 0, "No background load"),
]


@pytest.mark.parametrize("case, value, expected", LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_load_values_through_the_api(app_url, case, value, expected):
    client = Client(app_url, verbose=False)
    said = answer(client, value, api_name="/set_load")
    assert re.search(expected, said), said


# (case, policy, K, table rows, expected message)
POLICY_CASES = [
    ("first row not at 1", "table", 3, [[2, 8, 3]], "first row must start at batch size 1"),
    ("overlap", "table", 3, [[1, 4, 2], [3, 8, 1]], "overlap"),
    ("negative K", "table", 3, [[1, 2, -1]], "K must be >= 0"),
    ("start after end", "table", 3, [[1, 1, 1], [9, 4, 1]], "greater than end"),
    ("K above num_speculative_tokens", "table", 3, [[1, 2, 9]], "above this engine's num_speculative_tokens"),
    ("not a number", "table", 3, [[1, "x", 3]], "must be a whole number"),
    ("fixed K too large", "fixed", 9, [[1, 1, 1]], "K must be between 0 and|" + SLIDER),
    ("unknown policy", "bogus", 3, [[1, 1, 1]], "✕"),
]


@pytest.mark.parametrize("case, policy, k, rows, expected", POLICY_CASES, ids=[c[0] for c in POLICY_CASES])
def test_invalid_policies_are_refused(app_url, case, policy, k, rows, expected):
    client = Client(app_url, verbose=False)
    said = answer(client, policy, k, {"headers": ["start_bs", "end_bs", "K"], "data": rows}, api_name="/set_policy")
    if case == "unknown policy":  # Gradio's own check of a Radio value refuses it
        assert "bogus" in said, said
        return
    assert re.search(expected, said), said


def test_the_app_still_serves_after_the_table(app_url):
    client = Client(app_url, verbose=False)
    assert "Sent to the engine" in client.predict(
        "fixed", 2, {"headers": ["start_bs", "end_bs", "K"], "data": [[1, 1, 1]]}, api_name="/set_policy"
    )
    view, *_, trace = client.predict("def add(a, b):", 0.0, 16, api_name="/run")
    trace = json.loads(trace)
    assert len(trace["token_ids"]) == 16 and trace["kinds"][0] == "prefill"
    assert re.search(SLIDER, answer(client, "draft", 99, api_name="/apply"))  # K out of range: no restart
    assert "int3" in answer(client, "draft", 3, "int3", api_name="/apply")  # no such model variant: no restart
    assert "● **Engine ready**" in client.predict(api_name="/status")
