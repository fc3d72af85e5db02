"""The launched app, driven through gradio_client as a remote user would."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from gradio_client import Client

from tests.support.token_view_markup import view_steps

GOES_ON_S = 0.3  # how long a run streams on after another session's Stop, before its own
N_TOKENS = 512  # "def fibonacci(n):" runs to the length limit on the tiny pair ("def add" stops at 161)


def test_run_streams_coloured_tokens_and_the_card(app_url):
    client = Client(app_url, verbose=False)
    # 512 tokens: the page redraws at most every MIN_UPDATE_S (0.1 s), and 32 tokens of the tiny
    # models took under 0.2 s on the CI machine, 128 tokens 0.4 s with 2 updates seen
    job = client.submit("def fibonacci(n):", 0.0, N_TOKENS, api_name="/run")
    updates = list(job)
    view, card, _hist, _pos, trace = updates[-1]
    trace = json.loads(trace)  # the recorder's JSON line, as text
    streamed_s = float(trace["steps"][-1]["t"]) - float(trace["steps"][0]["t"])
    print(f"{len(updates)} updates over {streamed_s:.2f} s of engine steps")
    assert len(updates) >= 3, f"the token view should update while the request streams ({streamed_s:.2f} s)"
    # the view grows, step by step, from an empty one at once (the click's feedback) while it streams
    partial = [len([t for s in view_steps(u[0]) for t in s["t"]]) for u in updates if u[0]["streaming"]]
    assert partial[0] == 0 and len(partial) >= 3, partial
    assert partial == sorted(partial) and partial[-1] < N_TOKENS, partial
    kinds = [t["k"] for s in view_steps(view) for t in s["t"]]
    assert "prefill" in kinds and set(kinds) & {"accepted", "recovered", "bonus"}
    assert len(kinds) == N_TOKENS
    # the page shows the engine's own numbers for this very request
    assert kinds == trace["kinds"]
    m = trace["spec_decode_metrics"]
    assert f"draft_acceptance_rate = {m['draft_acceptance_rate']:.3f}" in card
    assert f"mean_acceptance_length = {m['mean_acceptance_length']:.3f}" in card
    assert f"drafted **{m['num_draft_tokens']}**" in card
    assert [len(s["r"]) for s in view_steps(view)] == [
        len(s["drafted"]) - s["accepted"] if s["drafted"] else 0 for s in trace["steps"]
    ]


def test_stop_ends_the_callers_own_run_with_a_stopped_view_and_no_error(app_url):
    """/stop stops the run of the session that calls it, and no other: after another client's /stop
    the run takes new engine steps (their times, ``data-t``, are CLOCK_MONOTONIC, system-wide, so
    later than the moment that /stop returned here); its own /stop, GOES_ON_S later, ends it
    normally (the tiny pair needs 3-8 s for its 1000 tokens), with a last update that says how far
    it got. Both Stops are plain calls to ``/run/stop`` with the session's hash, as the page sends
    them outside the queue: through gradio_client each would go through its client's message
    stream (opened at its first call), a latency of the client's, not the app's, against a run of
    a few seconds."""
    runner, other = Client(app_url, verbose=False), Client(app_url, verbose=False)

    def stop(client: Client) -> None:
        url = f"{app_url.rstrip('/')}/gradio_api/run/stop"
        httpx.post(url, json={"data": [], "session_hash": client.session_hash}).raise_for_status()

    job = runner.submit("Write a very long essay about the sea.", 0.0, 1000, api_name="/run")
    other_stopped_at: float | None = None
    for view, *_ in job:
        if view["streaming"] and view["steps"] >= 1 and other_stopped_at is None:
            stop(other)
            other_stopped_at = time.monotonic()
            time.sleep(GOES_ON_S)
            stop(runner)
    view, card, *_ = job.outputs()[-1]
    assert other_stopped_at is not None and job.exception() is None
    assert view["footer"].startswith("Stopped: ") and not view["streaming"], view["footer"]
    tokens = int(view["footer"].split()[1])
    assert 0 < tokens < 1000 and "Stopped** after" in card
    went_on = [s for s in view_steps(view) if float(s["ts"]) > other_stopped_at]
    assert went_on, "the run took no engine step after the other session's Stop"
    for client in (runner, other):
        client.close()


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("", "Type a prompt"),
        ("   \n ", "Type a prompt"),
        ("x" * 9000, "characters long"),
    ],
)
def test_bad_prompts_get_a_clear_message(app_url, prompt, expected):
    client = Client(app_url, verbose=False)
    view, *_ = client.predict(prompt, 0.0, 16, api_name="/run")
    assert expected in view["message"]


def test_html_in_the_prompt_is_inert(app_url):
    client = Client(app_url, verbose=False)
    view, *_ = client.predict("<img src=x onerror=alert(1)> ${alert(2)} `x`", 0.0, 8, api_name="/run")
    for s in view_steps(view):
        for t in s["t"] + s["r"]:
            assert "<img" not in t["h"] and "${" not in t["h"] and "`" not in t["h"]
            assert "<" not in t["tip"] and "${" not in t["tip"]


def test_lossless_check_compares_with_speculation_off(app_url):
    client = Client(app_url, verbose=False)
    *_, trace = client.predict("The quick brown fox", 0.0, 24, api_name="/run")
    trace = json.loads(trace)
    verdict, spec_text, plain_text = client.predict(0.0, api_name="/lossless")
    assert "Identical: all 24 tokens match" in verdict, verdict
    assert spec_text == plain_text == trace["text"]
    assert "tokens/s with speculation" in verdict and "x**" in verdict


def test_lossless_check_without_a_run_says_what_to_do(app_url):
    client = Client(app_url, verbose=False)
    verdict, *_ = client.predict(0.0, api_name="/lossless")
    assert "Run a prompt first" in verdict


TABLE = {"headers": ["start_bs", "end_bs", "K"]}


@pytest.mark.parametrize(
    "policy, k, rows, shown",
    [
        ("table", 3, [[1, 2, 1], [3, 64, 0]], ("table", None, [[1, 2, 1], [3, 64, 0]])),
        ("fixed", 2, [[1, 1, 1]], ("fixed", 2, None)),
        ("off", 3, [[1, 1, 1]], ("off", None, None)),
        ("fixed", 3, [[1, 1, 1]], ("fixed", 3, None)),  # last: the app's own default again
    ],
)
def test_a_page_loaded_later_shows_the_policy_in_force(app_url, policy, k, rows, shown):
    """The policy is engine-wide: a page opened (or reloaded) after someone applied one shows it."""
    setter = Client(app_url, verbose=False)
    assert "Sent to the engine" in setter.predict(policy, k, {**TABLE, "data": rows}, api_name="/set_policy")
    kind, k_shown, table = Client(app_url, verbose=False).predict(api_name="/policy_controls")
    assert kind == shown[0]
    if shown[1] is not None:
        assert k_shown == shown[1]
    if shown[2] is not None:
        assert table["data"] == shown[2]
