"""IdleFill: a cell in idle time only once, for ``quiet_s``, nobody used or claimed the engine; a
claim stops the cell running and holds new ones back, also while it is under way."""

from __future__ import annotations

import asyncio

from engine_adapter.service.idle_fill import IdleFill

QUIET_S = 1.0
PERIOD_S = 0.05


class Policy:
    def __init__(self) -> None:
        self.started = 0
        self.stopped = 0
        self.release = asyncio.Event()

    def start_filling(self, still_quiet) -> bool:
        self.started += 1
        return True

    async def stop_filling(self) -> None:
        self.stopped += 1
        await self.release.wait()  # a cell's requests take their time to go


def test_cells_start_only_after_quiet_time_from_the_last_use_or_claim():
    async def scenario() -> dict[str, int]:
        policy, busy = Policy(), [True]
        policy.release.set()
        fill = IdleFill(policy, lambda: busy[0], quiet_s=QUIET_S, period_s=PERIOD_S)
        task = asyncio.create_task(fill.run())
        seen = {}
        await asyncio.sleep(QUIET_S + 0.3)  # quiet long since the start, but in use all along
        seen["in use"] = policy.started
        busy[0] = False
        await asyncio.sleep(QUIET_S * 0.4)  # free, but used less than quiet_s ago
        seen["just freed"] = policy.started
        await asyncio.sleep(QUIET_S)
        seen["quiet"] = policy.started
        await fill.claim()
        after_claim = policy.started
        await asyncio.sleep(QUIET_S * 0.4)
        seen["after a claim"] = policy.started - after_claim
        await asyncio.sleep(QUIET_S)
        seen["quiet again"] = policy.started - after_claim
        task.cancel()
        return seen

    seen = asyncio.run(scenario())
    assert seen["in use"] == 0 and seen["just freed"] == 0, seen
    assert seen["quiet"] > 0, seen
    assert seen["after a claim"] == 0 and seen["quiet again"] > 0, seen


def test_no_cell_starts_while_a_claim_is_under_way():
    async def scenario() -> tuple[int, int]:
        policy = Policy()
        fill = IdleFill(policy, lambda: False, quiet_s=0.0, period_s=PERIOD_S)
        task = asyncio.create_task(fill.run())
        claim = asyncio.create_task(fill.claim())  # its cell's requests not gone yet
        await asyncio.sleep(0.01)
        started = policy.started
        await asyncio.sleep(0.3)
        during = policy.started - started
        policy.release.set()
        await claim
        await asyncio.sleep(0.3)
        task.cancel()
        return during, policy.started

    during, total = asyncio.run(scenario())
    assert during == 0 and total > 0, (during, total)


def test_no_cell_starts_inside_a_claimed_block_however_long_it_awaits():
    """A K policy chosen: the cell stopped first, none begins while the policy is sent (its awaits let
    the loop run), even with quiet_s 0; cells begin again after the block."""

    async def scenario() -> tuple[int, int, int]:
        policy = Policy()
        policy.release.set()
        fill = IdleFill(policy, lambda: False, quiet_s=0.0, period_s=PERIOD_S)
        task = asyncio.create_task(fill.run())
        async with fill.claimed():
            stopped, started = policy.stopped, policy.started
            await asyncio.sleep(0.3)  # sending the policy takes a while
            during = policy.started - started
        await asyncio.sleep(0.3)
        task.cancel()
        return stopped, during, policy.started - started

    stopped, during, after = asyncio.run(scenario())
    assert stopped == 1 and during == 0 and after > 0, (stopped, during, after)
