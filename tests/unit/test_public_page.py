"""What a public page must hold by itself: the presenter's lock and its throttle, who a visitor is,
per-visitor run slots and request rates, polls answered once per tick, text without server details."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from engine_adapter.service.backend import RecordingStatus, Visitor
from explorer.panels.poll_cache import PollBound, TickCache
from explorer.panels.presenter import MAX_WRONG_PER_MINUTE, KeyThrottle, Presenter
from explorer.panels.visitors import Exposure, RunSlots, address_of, exposure_for, is_loopback
from explorer.request_limits import NEW_SESSIONS, SESSION_POLLS, Rate, StopCall, TokenBuckets, VisitorGate
from explorer.views.status import for_visitors, recording_banner_markdown
from tests.support.manual_clock import ManualClock


@pytest.mark.parametrize(
    "host, public",
    [("127.0.0.1", False), ("localhost", False), ("::1", False), ("127.0.1.1", False), ("0.0.0.0", True),
     ("192.168.1.5", True), ("::", True), ("myhost.example", True)],
)  # fmt: skip
def test_public_means_anything_but_loopback(host, public, monkeypatch):
    monkeypatch.delenv("SYSTEM", raising=False)
    assert is_loopback(host) is not public
    assert exposure_for(host) == Exposure(public=public, behind_proxy=False)


def test_a_space_is_public_and_behind_its_proxy(monkeypatch):
    monkeypatch.setenv("SYSTEM", "spaces")
    assert exposure_for("0.0.0.0") == Exposure(public=True, behind_proxy=True)


@pytest.mark.parametrize(
    "forwarded, behind_proxy, expected",
    [
        ("203.0.113.9", True, "203.0.113.9"),
        ("1.2.3.4, 203.0.113.9", True, "203.0.113.9"),  # what the client wrote itself stands to the left
        ("", True, "10.0.0.1"),
        ("1.2.3.4", False, "10.0.0.1"),  # off a Space the header is not ours to trust (uvicorn's rule applies)
    ],
)
def test_a_visitors_address(forwarded, behind_proxy, expected):
    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    assert address_of(headers, "10.0.0.1", Exposure(public=True, behind_proxy=behind_proxy)) == expected


def test_without_a_key_everyone_may_act():
    p = Presenter(None)
    assert p.may_act("anyone") and p.refusal("anyone") is None


def test_with_a_key_only_unlocked_sessions_act_and_a_closed_page_forgets():
    p = Presenter("s3cret")
    v = Visitor("s1", "10.0.0.1")
    assert "locked by the presenter" in p.refusal("s1")
    ok, said = p.unlock(v, "s3cret")
    assert ok and "Unlocked" in said and p.may_act("s1") and not p.may_act("s2")
    p.forget("s1")
    assert not p.may_act("s1")


def test_a_wrong_key_makes_the_next_attempt_wait_longer_each_time():
    clock = ManualClock(1000.0)
    p = Presenter("s3cret", KeyThrottle(clock=clock))
    v = Visitor("s1", "10.0.0.1")
    waits = []
    for _ in range(5):
        ok, said = p.unlock(v, "guess")
        assert not ok and "not the presenter key" in said
        ok, said = p.unlock(v, "s3cret")  # even the right key waits its turn
        assert not ok and "try again in" in said
        waits.append(p.throttle.wait_s(["session:s1"]))
        clock.t += waits[-1] + 0.01
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_new_sessions_from_one_address_share_its_wait():
    clock = ManualClock(1000.0)
    p = Presenter("s3cret", KeyThrottle(clock=clock))
    p.unlock(Visitor("a", "10.0.0.9"), "guess")
    ok, said = p.unlock(Visitor("b", "10.0.0.9"), "s3cret")
    assert not ok and "try again" in said
    ok, _ = p.unlock(Visitor("c", "10.0.0.10"), "s3cret")  # another address is not held up
    assert ok


def test_too_many_wrong_keys_on_the_server_make_everyone_wait_for_the_minute():
    clock = ManualClock(1000.0)
    p = Presenter("s3cret", KeyThrottle(clock=clock))
    for i in range(MAX_WRONG_PER_MINUTE):
        p.unlock(Visitor(f"s{i}", f"10.1.{i}.1"), "guess")
        clock.t += 0.1
    ok, said = p.unlock(Visitor("fresh", "10.9.9.9"), "s3cret")
    assert not ok and "try again" in said
    clock.t += 61
    assert p.unlock(Visitor("fresh", "10.9.9.9"), "s3cret")[0]


def test_run_slots_one_per_session_a_few_per_address_presenter_unbounded_by_address():
    slots = RunSlots(per_session=1, per_visitor=2)
    a1, a2, a3 = (Visitor(f"s{i}", "10.0.0.1") for i in range(3))
    assert slots.take(a1) is None
    assert "already has a request running" in slots.take(a1)
    assert slots.take(a2) is None
    assert "from your address are already running" in slots.take(a3)
    assert slots.take(Visitor("p", "10.0.0.1", presenter=True)) is None
    slots.give_back(a1)
    assert slots.take(a3) is None and slots.running() == 3


def test_stop_reaches_only_the_sessions_own_run_and_a_finished_run_leaves_no_signal():
    slots = RunSlots()
    mine, theirs = Visitor("mine", "10.0.0.1"), Visitor("theirs", "10.0.0.1")
    assert slots.take(mine) is None and slots.take(theirs) is None
    my_stop, their_stop = slots.stop_signal("mine"), slots.stop_signal("theirs")
    assert slots.stop("mine") and my_stop.is_set() and not their_stop.is_set()
    assert not slots.stop("nobody")
    slots.give_back(mine)
    assert not slots.stop("mine")  # nothing runs there now: nothing to stop
    assert slots.take(mine) is None and not slots.stop_signal("mine").is_set()  # the next run starts unstopped


def test_token_buckets_refuse_beyond_the_rate_and_refill():
    clock = ManualClock(1000.0)
    buckets = TokenBuckets(clock)
    rate = Rate(per_s=2.0, burst=4.0)
    assert [buckets.take(("a", "polls"), rate) for _ in range(4)] == [0.0] * 4
    assert buckets.take(("a", "polls"), rate) == pytest.approx(0.5)
    assert buckets.take(("b", "polls"), rate) == 0.0  # another visitor has its own bucket
    clock.t += 0.5
    assert buckets.take(("a", "polls"), rate) == 0.0


class Door:
    """A ``VisitorGate`` in front of a stand-in app that records what reached it (and its body)."""

    def __init__(self, **kw) -> None:
        self.reached: list[tuple[str, bytes]] = []
        self.sent: list[dict] = []

        async def app(scope, receive, send):
            body = b""
            while True:
                m = await receive()
                body += m.get("body", b"")
                if not m.get("more_body"):
                    break
            self.reached.append((scope["path"], body))

        self.gate = VisitorGate(app, Exposure(public=True), **kw)

    def call(self, path: str, body: dict | None = None, address: str = "10.0.0.1") -> int:
        import json

        raw = json.dumps(body).encode() if body is not None else b""
        messages = [{"type": "http.request", "body": raw, "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            self.sent.append(message)

        scope = {
            "type": "http",
            "method": "POST" if body is not None else "GET",
            "path": path,
            "headers": [],
            "client": (address, 5000),
        }
        before = len(self.sent)
        asyncio.run(self.gate(scope, receive, send))
        starts = [m for m in self.sent[before:] if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else 200


def test_the_door_answers_its_own_routes_without_the_app():
    door = Door(routes={"/explorer/top_lines": lambda: ["status", "banner"]})
    assert door.call("/explorer/top_lines") == 200 and door.reached == []
    assert door.sent[-1]["body"] == b'["status", "banner"]'


def test_a_poll_reaches_the_app_with_its_body_and_a_sessions_polls_are_bounded(monkeypatch):
    monkeypatch.setattr("explorer.request_limits.TARPIT_S", 0.0)
    door = Door()
    body = {"data": [], "session_hash": "page1"}
    codes = [door.call("/gradio_api/run/charts", body) for _ in range(int(SESSION_POLLS.burst) + 2)]
    assert codes[: int(SESSION_POLLS.burst)] == [200] * int(SESSION_POLLS.burst) and codes[-1] == 429
    assert door.reached[0] == ("/gradio_api/run/charts", b'{"data": [], "session_hash": "page1"}')
    assert door.call("/gradio_api/run/charts", {"data": [], "session_hash": "page2"}) == 200  # another page
    assert door.call("/", None) == 200  # the page itself is never limited


def test_gradios_api_alias_is_bounded_like_its_run_route_and_a_page_over_its_polls_can_still_stop(monkeypatch):
    monkeypatch.setattr("explorer.request_limits.TARPIT_S", 0.0)
    door = Door(stop=StopCall("stop", 7))
    body = {"data": [], "session_hash": "page1"}
    codes = [door.call("/gradio_api/api/charts", body) for _ in range(int(SESSION_POLLS.burst) + 1)]
    assert codes[-1] == 429  # /api/ is Gradio's alias of /run/: the same session's poll bound
    # over its polls, the page can still stop its run: its own call (/run/predict, Stop's fn_index)
    assert door.call("/gradio_api/run/predict", body | {"fn_index": 7}) == 200
    assert door.call("/gradio_api/run/stop", body) == 200  # an API caller's
    assert door.call("/gradio_api/api/stop", body) == 200
    assert door.call("/gradio_api/run/predict", body | {"fn_index": 3}) == 429  # any other fn is a poll
    assert door.call("/gradio_api/run/charts", body | {"fn_index": 7}) == 429  # Gradio runs /charts here
    made_up = [door.call("/gradio_api/api/charts", {"data": [], "session_hash": f"x{i}"}) for i in range(40)]
    assert 429 in made_up  # made-up sessions through the alias are bounded too


def test_made_up_sessions_from_one_address_are_bounded(monkeypatch):
    monkeypatch.setattr("explorer.request_limits.TARPIT_S", 0.0)
    door = Door()
    n = int(NEW_SESSIONS.burst)
    codes = [door.call("/gradio_api/run/charts", {"data": [], "session_hash": f"s{i}"}) for i in range(n + 3)]
    assert codes[:n] == [200] * n and set(codes[n:]) == {429}
    no_session = door.call("/gradio_api/run/charts", {"data": []})  # a new session each time, for Gradio
    assert no_session == 429 and door.gate.refused["new sessions"] == 4
    assert door.call("/gradio_api/run/charts", {"data": []}, address="10.0.0.2") == 200  # another address


def test_a_request_over_its_rate_is_held_before_its_429(monkeypatch):
    monkeypatch.setattr("explorer.request_limits.TARPIT_S", 0.2)
    door = Door(kinds=(("/gradio_api/run/", "polls", Rate(0.5, 1.0)),))
    assert door.call("/gradio_api/run/x", {"data": [], "session_hash": "a"}) == 200
    t = time.monotonic()
    assert door.call("/gradio_api/run/x", {"data": [], "session_hash": "a"}) == 429
    assert time.monotonic() - t >= 0.2  # a flood's thread waits instead of spinning


def test_the_tick_cache_builds_once_for_many_concurrent_pollers():
    cache = TickCache(ttl_s=10.0)
    built = []

    def build() -> int:
        time.sleep(0.05)
        built.append(1)
        return 42

    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", build))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [42] * 16 and len(built) == 1 and cache.builds == 1


def test_the_tick_cache_takes_keys_that_are_not_hashable():
    cache = TickCache(ttl_s=10.0)
    key = ("auto", ((1, 2), [[1, 64, 3]]))  # a K table's rows are lists
    assert cache.get(key, lambda: 1) == 1 and cache.get(key, lambda: 2) == 1


def test_the_tick_cache_builds_again_after_its_tick():
    clock = ManualClock(1000.0)
    cache = TickCache(ttl_s=1.0, clock=clock)
    assert cache.get("k", lambda: 1) == 1
    assert cache.get("k", lambda: 2) == 1
    clock.t += 1.5
    assert cache.get("k", lambda: 3) == 3


def test_the_poll_bound_turns_away_at_once_beyond_its_slots():
    bound = PollBound(max_at_once=1)
    with bound.slot() as first, bound.slot() as second:
        assert first and not second
    assert bound.refused == 1
    with bound.slot() as again:
        assert again


@pytest.mark.parametrize(
    "text, hidden",
    [
        ("could not reach the engine at http://127.0.0.1:43211 (it is not running)", "43211"),
        ("vLLM failed to start: out of memory. Log: /tmp/spec-explorer-x1/vllm.log", "/tmp/"),
        ("converting needs 5 GiB in /root/.cache/spec-explorer; free some space", "/root"),
        ("● **Engine ready** (method **draft**) at `http://127.0.0.1:8000`.", "8000"),
    ],
)
def test_text_for_visitors_names_no_port_and_no_path(text, hidden):
    shown = for_visitors(text)
    assert hidden not in shown and shown.split()[0] == text.split()[0]


def test_text_for_visitors_keeps_ordinary_slashes():
    text = "K 1/2, 3.5 GiB, tokens/s, docs/k-policies.md"
    assert for_visitors(text) == text


def test_a_request_without_http_is_the_local_visitor():
    from explorer.panels.visitors import visitor_of

    assert visitor_of(None, Exposure()) == Visitor("local", "local", False)
    request = SimpleNamespace(session_hash="abc", headers={}, client=SimpleNamespace(host="10.2.3.4"))
    assert visitor_of(request, Exposure(public=True)).address == "10.2.3.4"


def test_the_csv_export_folder_keeps_only_the_newest_files(tmp_path):
    import os

    from explorer.panels.export import prune

    for i in range(12):
        f = tmp_path / f"live_charts_{i}.csv"
        f.write_text("t\n")
        os.utime(f, (1000 + i, 1000 + i))
    assert prune(tmp_path, keep=8) == 4
    assert sorted(p.name for p in tmp_path.glob("*.csv")) == sorted(f"live_charts_{i}.csv" for i in range(4, 12))


@pytest.mark.parametrize(
    "status, says",
    [
        (None, ""),
        (RecordingStatus(True, None, 10, 100), "This session is recorded"),
        (RecordingStatus(False, "the file reached its size cap of 200 MiB", 100, 100), "recording stopped**: the file"),
    ],
)
def test_every_page_says_when_the_session_is_recorded_and_why_it_stopped(status, says):
    shown = recording_banner_markdown(status)
    assert (says in shown) if says else shown == ""
