"""Gradio's session table, its idle sessions forgotten (``explorer.session_expiry``) on a real
``gradio.state_holder.StateHolder`` of a small page."""

from __future__ import annotations

import asyncio
import datetime
from types import SimpleNamespace

import gradio as gr
import pytest
from gradio.state_holder import StateHolder

from explorer.session_expiry import NO_STATE_HOLDER, IdleSessionExpiry, SessionTable
from tests.support.manual_clock import ManualClock

NOW = datetime.datetime(2030, 1, 1, 12, 0, 0)


def holder_with(last_used_s_ago: dict[str, float], now: datetime.datetime = NOW) -> StateHolder:
    with gr.Blocks() as page:
        gr.Number(0)
    holder = StateHolder()
    holder.set_blocks(page)
    for session, ago in last_used_s_ago.items():
        holder[session]  # noqa: B018  (Gradio builds the session's state on first use)
        holder.time_last_used[session] = now - datetime.timedelta(seconds=ago)
    return holder


def test_sessions_idle_longer_than_the_limit_are_forgotten_and_the_others_kept():
    holder = holder_with({"open page": 2.0, "closed tab": 121.0, "script": 3600.0, "just idle": 119.0})
    assert SessionTable(holder).forget_idle(120.0, NOW) == 2
    assert list(holder.session_data) == ["open page", "just idle"]
    assert set(holder.time_last_used) == {"open page", "just idle"}


def test_a_forgotten_session_that_comes_back_starts_from_the_pages_defaults():
    holder = holder_with({"tab": 600.0})
    before = holder["tab"]
    holder.time_last_used["tab"] = NOW - datetime.timedelta(seconds=600)
    SessionTable(holder).forget_idle(120.0, NOW)
    assert "tab" not in holder
    assert holder["tab"] is not before  # a new state, built as Gradio builds any session's


def test_a_gradio_without_the_tables_names_is_refused_by_name():
    with pytest.raises(RuntimeError, match="time_last_used, lock"):
        SessionTable(SimpleNamespace(session_data={}))


def test_the_middleware_sweeps_at_most_once_per_interval_and_passes_every_request_on():
    holder = holder_with({"old": 3600.0}, now=datetime.datetime.now())  # the middleware reads the wall clock
    passed = []

    async def inner(scope, receive, send):
        passed.append(scope["type"])

    clock = ManualClock(100.0)
    expiry = IdleSessionExpiry(inner, idle_s=120.0, every_s=30.0, clock=clock)
    scope = {"type": "http", "path": "/", "app": SimpleNamespace(state_holder=holder)}
    asyncio.run(expiry(scope, None, None))
    assert "old" in holder and expiry.forgotten == 0  # not yet: the first sweep comes every_s after the start
    clock.t += 30.0
    asyncio.run(expiry(scope, None, None))
    assert "old" not in holder and expiry.forgotten == 1
    holder["new"]  # noqa: B018
    holder.time_last_used["new"] = datetime.datetime.now() - datetime.timedelta(hours=1)
    clock.t += 29.0
    asyncio.run(expiry(scope, None, None))
    assert "new" in holder  # within the interval: no sweep
    clock.t += 1.0
    asyncio.run(expiry({"type": "lifespan", "app": scope["app"]}, None, None))
    assert "new" in holder  # only HTTP requests sweep
    asyncio.run(expiry(scope, None, None))
    assert "new" not in holder and expiry.forgotten == 2
    assert passed == ["http", "http", "http", "lifespan", "http"]


def test_an_app_without_gradios_table_is_said_once_and_never_swept(capsys):
    async def inner(scope, receive, send):
        pass

    clock = ManualClock(0.0)
    expiry = IdleSessionExpiry(inner, every_s=30.0, clock=clock)
    scope = {"type": "http", "path": "/", "app": SimpleNamespace()}
    for _ in range(3):
        clock.t += 30.0
        asyncio.run(expiry(scope, None, None))
    assert capsys.readouterr().err.splitlines() == [NO_STATE_HOLDER]
    assert expiry.forgotten == 0
