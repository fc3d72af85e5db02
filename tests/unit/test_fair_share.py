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
    loads = SessionLoads(cap=64, idle_s=60, visitor_cap=64)
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


@pytest.mark.parametrize(
    "asks, visitor_cap, expected",
    [
        # one address opening many sessions gets what one visitor gets, however many it opens
        ({("x", f"s{i}"): 64 for i in range(10)} | {("y", "t"): 64}, 16, {"x": 16, "y": 16}),
        # under the cap a visitor's sessions share its part fairly
        ({("x", "a"): 4, ("x", "b"): 20, ("y", "c"): 8}, 16, {"x": 16, "y": 8}),
        # the cap is shared between visitors before it is shared between sessions
        ({("x", f"s{i}"): 64 for i in range(5)} | {("y", "t"): 64}, 64, {"x": 32, "y": 32}),
    ],
)
def test_visitors_share_first_then_their_sessions(asks, visitor_cap, expected):
    loads = SessionLoads(cap=64, visitor_cap=visitor_cap)
    for (visitor, session), n in asks.items():
        loads.set(session, n, now=0, visitor=visitor)
    grants = loads.granted()
    per_visitor: dict[str, int] = {}
    for (visitor, session), _ in asks.items():
        per_visitor[visitor] = per_visitor.get(visitor, 0) + grants[session]
    assert per_visitor == expected
    of_x = {s: n for (v, s), n in asks.items() if v == "x"}
    assert {s: grants[s] for s in of_x} == fair_shares(of_x, expected["x"])  # max-min fair within the visitor


def test_a_presenter_is_not_held_to_the_visitor_cap():
    loads = SessionLoads(cap=64, visitor_cap=16)
    loads.set("p", 48, now=0, visitor="x", privileged=True)
    loads.set("v", 64, now=0, visitor="y")
    assert loads.granted() == {"p": 48, "v": 16}


def test_a_load_not_asked_for_again_stops_and_says_why_while_polling_keeps_the_session():
    loads = SessionLoads(cap=64, idle_s=120, max_age_s=3600)
    loads.set("a", 8, now=0)
    for t in range(60, 3600, 60):  # the page polls every minute: the session stays
        loads.touch("a", t)
        assert loads.expire(t) == []
    loads.touch("a", 3660)
    assert loads.expire(3660) == ["a"]
    assert loads.total() == 0 and "move it to start the load again" in loads.ended["a"]
    loads.set("a", 8, now=3700)  # moving the slider starts it again, renewed
    assert loads.total() == 8 and "a" not in loads.ended
