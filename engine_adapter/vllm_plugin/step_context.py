"""One scheduled engine step as the plugin knows it, from ``schedule()`` to its publication.

Contract: ``StepContext`` holds what the plugin's parts learn of one step: when it was
scheduled and how many control commands were applied by then (the tap), the slot
auction's decision (the auction), the catch-up plan and the requests that had a hole in
the draft model's cache when it was scheduled (the idle drafter's hole tracker), the
acceptance rule it is verified under (the rule relay), and, once the worker reported, the
tokens each request's draft model re-ran and each request's relaxed drafts. The tap makes
one per step in ``schedule()``; the policy half fills it; the tap publishes from it.

``InFlightSteps`` keeps the contexts of the steps scheduled and not yet processed, in
order, found by the identity of vLLM's ``SchedulerOutput`` (async scheduling keeps two in
flight); ``get`` leaves one there, ``pop`` takes it out. Nothing rides on vLLM's objects
but what the worker must read (``catch_up.PLAN_ATTR``, ``acceptance_rules.RULE_ATTR``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine_adapter.vllm_plugin.wire import AuctionRow, RelaxedRow

MAX_IN_FLIGHT = 8  # contexts kept at most (vLLM keeps two steps in flight; a step never processed is dropped)


@dataclass
class StepContext:
    started: float = 0.0  # time.perf_counter() when schedule() began
    controls: int = 0  # control commands applied when the step was scheduled
    decision: AuctionRow | None = None  # the slot auction's, where it ran
    plan: dict[str, tuple[int, int]] = field(default_factory=dict)  # request -> (first position, count) to re-run
    holed: frozenset[str] = frozenset()  # requests with a hole when scheduled: their drafts were made across it
    rule: str = "lossless"  # the acceptance rule the step is verified under
    caught_up: dict[str, int] = field(default_factory=dict)  # request -> tokens its draft model re-ran
    relaxed: dict[str, list[RelaxedRow]] = field(default_factory=dict)  # request -> drafts kept by a lossy rule


class InFlightSteps:
    def __init__(self) -> None:
        self._steps: deque[tuple[object, StepContext]] = deque(maxlen=MAX_IN_FLIGHT)

    def add(self, scheduler_output: object, context: StepContext) -> None:
        self._steps.append((scheduler_output, context))

    def get(self, scheduler_output: object) -> StepContext | None:
        return next((c for out, c in self._steps if out is scheduler_output), None)

    def pop(self, scheduler_output: object) -> StepContext | None:
        for i, (out, context) in enumerate(self._steps):
            if out is scheduler_output:
                del self._steps[i]
                return context
        return None

    def __len__(self) -> int:
        return len(self._steps)
