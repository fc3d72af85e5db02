"""Background load shared between sessions: fair shares under one cap, idle expiry."""

from __future__ import annotations

import pytest

from engine_adapter.service.fair_share import SessionLoads, fair_shares


@pytest.mark.parametrize(
    "asks, cap, expected",
    [
        ({}, 64, {}),
        ({"a": 8}, 64, {"a": 8}),
        ({"a": 64, "b": 64}, 64, {"a": 32, "b": 32}),
        ({"a": 4, "b": 64}, 64, {"a": 4, "b": 60}),  # a small ask leaves the rest to the big one
        ({"a": 64, "b": 64, "c": 64}, 64, {"a": 21, "b": 21, "c": 22}),
        ({"a": 10, "b": 30, "c": 40}, 64, {"a": 10, "b": 27, "c": 27}),
        ({"a": 5, "b": 5}, 4, {"a": 2, "b": 2}),
        ({"a": 1, "b": 1, "c": 1}, 2, {"a": 0, "b": 1, "c": 1}),  # fewer slots than sessions
        ({"a": -3, "b": 2}, 64, {"a": 0, "b": 2}),
        ({"a": 10}, 0, {"a": 0}),
    ],
)
def test_fair_shares(asks, cap, expected):
    got = fair_shares(asks, cap)
    assert got == expected
    assert sum(got.values()) == min(cap, sum(max(n, 0) for n in asks.values()))


def test_sessions_ask_release_and_expire():
    loads = SessionLoads(cap=64, idle_s=60)
    assert loads.set("a", 100, now=0) == 64  # clamped to the cap
    assert loads.set("b", 32, now=0) == 32
    assert loads.granted() == {"a": 32, "b": 32} and loads.total() == 64
    assert loads.release("b") is True and loads.total() == 64  # a gets the whole cap back
    loads.set("c", 8, now=70)
    loads.touch("a", 55)
    assert loads.expire(now=100) == []
    assert loads.expire(now=116) == ["a"]  # not seen for more than 60 s
    assert loads.granted() == {"c": 8}
    assert loads.set("c", 0, now=120) == 0 and loads.total() == 0
