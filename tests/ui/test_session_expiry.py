"""Idle sessions forgotten in a launched Gradio server (``explorer.session_expiry`` as the app's
middleware), driven by ``gradio_client``: each client is a session of its own, as a page is."""

from __future__ import annotations

import time

import gradio as gr
import pytest
from gradio_client import Client
from starlette.middleware import Middleware

from engine_adapter.engine.launcher import free_port
from explorer.session_expiry import IdleSessionExpiry
from tests.support.manual_clock import ManualClock

IDLE_S = 2.0
SWEEP_EVERY_S = 0.2


@pytest.fixture(scope="module")
def counter_page():
    """A page whose one event counts its session's calls in a ``gr.State``, and the clock that paces
    the middleware's sweeps: it stands still (no sweep) until the test moves it, so a slow machine's
    set-up of many sessions is never swept before the test has counted them."""
    with gr.Blocks() as page:
        calls = gr.State(0)
        shown = gr.Number()
        bump = gr.Button()
        bump.click(lambda n: (n + 1, n + 1), calls, [calls, shown], api_name="bump")
    sweep_clock = ManualClock()
    expiry = Middleware(IdleSessionExpiry, idle_s=IDLE_S, every_s=SWEEP_EVERY_S, clock=sweep_clock)
    port = free_port()
    page.queue().launch(
        server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, app_kwargs={"middleware": [expiry]}
    )
    yield page, f"http://127.0.0.1:{port}/", sweep_clock
    page.close()


def test_idle_sessions_go_and_a_page_in_use_keeps_its_state(counter_page):
    page, url, sweep_clock = counter_page
    gone = [Client(url, verbose=False) for _ in range(8)]
    for client in gone:
        assert client.predict(api_name="/bump") == 1
    kept = Client(url, verbose=False)
    assert kept.predict(api_name="/bump") == 1
    held = page.state_holder
    assert len(held.session_data) == 9
    deadline = time.monotonic() + 3 * IDLE_S
    calls, polls = 1, 1
    while time.monotonic() < deadline:  # the kept page polls; the eight others are gone
        sweep_clock.t += SWEEP_EVERY_S  # each request may sweep from now on
        calls = kept.predict(api_name="/bump")
        polls += 1
        time.sleep(0.3)
    assert calls == polls  # one state all along: its count never restarted
    assert len(held.session_data) == 1, f"{len(held.session_data)} sessions kept"
    # a forgotten session that comes back is served, from the page's defaults
    assert gone[0].predict(api_name="/bump") == 1
    for client in [*gone, kept]:
        client.close()
