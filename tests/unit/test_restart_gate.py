"""Restarts people ask for coalesce: a burst is one restart with its last settings, a request
during a restart replaces the pending one, and restarts keep a minimum interval."""

from __future__ import annotations

import asyncio

from engine_adapter.service.restart_gate import RestartGate


def run_gate(script, settle_s=0.05, min_interval_s=0.3, restart_s=0.2):
    """Run ``script(gate)`` (a coroutine function) and return the restarts run, in order."""
    ran: list[str] = []

    async def main() -> list[str]:
        async def restart(what: str) -> None:
            ran.append(what)
            await asyncio.sleep(restart_s)

        gate = RestartGate(restart, settle_s=settle_s, min_interval_s=min_interval_s)
        await script(gate)
        for _ in range(200):  # until nothing is pending or running
            if gate.pending is None and not gate.running:
                break
            await asyncio.sleep(0.02)
        await gate.close()
        return ran

    return asyncio.run(main())


def test_three_quick_requests_give_one_restart_with_the_last_settings():
    tickets = []

    async def script(gate):
        for what in ("K=2", "K=3", "K=4"):
            tickets.append(gate.request(what))

    assert run_gate(script) == ["K=4"]
    assert [t.replaced for t in tickets] == [False, True, True]


def test_requests_during_a_restart_replace_each_other_and_wait_for_the_interval():
    times: dict[str, float] = {}

    async def script(gate):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        gate.request("a")
        await asyncio.sleep(0.1)  # "a" runs now (settle 0.05 s), for 0.2 s
        assert gate.running
        ticket = gate.request("b")
        gate.request("c")
        assert ticket.behind_running
        while gate.pending is not None:
            await asyncio.sleep(0.01)
        times["c"] = loop.time() - t0

    assert run_gate(script) == ["a", "c"]
    # "a" ended at about 0.25 s; "c" waited the minimum interval (0.3 s) after it
    assert times["c"] >= 0.5


def test_nothing_pending_means_no_due_time():
    async def script(gate):
        assert gate.due_in_s() is None
        gate.request("x")
        assert 0 < gate.due_in_s() <= 0.05

    assert run_gate(script) == ["x"]
