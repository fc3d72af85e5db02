"""IdleFill: a cell in idle time only after nobody claimed the engine for ``quiet_s`` and while
nobody uses it; a claim stops the cell running and holds new ones back."""

from __future__ import annotations

import asyncio

from engine_adapter.service.idle_fill import IdleFill


class Policy:
    def __init__(self) -> None:
        self.started = 0
        self.stopped = 0

    def start_filling(self) -> bool:
        self.started += 1
        return True

    async def stop_filling(self) -> None:
        self.stopped += 1


def test_cells_start_only_in_quiet_time_and_a_claim_holds_them_back():
    async def scenario() -> tuple[list[int], int]:
        policy, busy = Policy(), [True]
        fill = IdleFill(policy, lambda: busy[0], quiet_s=0.3, period_s=0.05)
        task = asyncio.create_task(fill.run())
        seen = []
        await asyncio.sleep(0.5)  # quiet long enough, but in use
        seen.append(policy.started)
        busy[0] = False
        await asyncio.sleep(0.2)
        seen.append(policy.started)  # in use until now: the quiet time counts from the claim, not from this
        await fill.claim()
        started = policy.started
        await asyncio.sleep(0.2)  # within quiet_s of the claim: nothing new
        seen.append(policy.started - started)
        await asyncio.sleep(0.3)
        seen.append(min(policy.started - started, 1))
        task.cancel()
        return seen, policy.stopped

    seen, stopped = asyncio.run(scenario())
    assert seen[0] == 0 and seen[1] > 0, seen
    assert seen[2] == 0 and seen[3] == 1, seen
    assert stopped == 1
