"""vllm_plugin/step_context.py: one context per scheduled step, found by the step's identity, in order."""

from __future__ import annotations

from types import SimpleNamespace

from engine_adapter.vllm_plugin.step_context import MAX_IN_FLIGHT, InFlightSteps, StepContext


def test_contexts_are_found_by_the_steps_identity_not_its_equality():
    steps = InFlightSteps()
    a, b = SimpleNamespace(n=1), SimpleNamespace(n=1)  # equal, not the same object
    steps.add(a, StepContext(controls=1))
    steps.add(b, StepContext(controls=2))
    assert steps.get(b).controls == 2 and steps.get(a).controls == 1
    assert steps.get(SimpleNamespace(n=1)) is None
    assert steps.pop(a).controls == 1 and steps.get(a) is None and len(steps) == 1
    assert steps.pop(a) is None


def test_what_the_parts_write_stays_with_its_own_step():
    """Async scheduling: step 2 is scheduled before step 1 is published; each keeps its own facts."""
    steps = InFlightSteps()
    one, two = object(), object()
    steps.add(one, StepContext())
    steps.add(two, StepContext())
    steps.get(one).caught_up["r"] = 4
    steps.get(two).holed = frozenset({"r"})
    first = steps.pop(one)
    assert first.caught_up == {"r": 4} and first.holed == frozenset()
    assert steps.pop(two).caught_up == {}


def test_steps_never_processed_do_not_pile_up():
    steps = InFlightSteps()
    outs = [object() for _ in range(3 * MAX_IN_FLIGHT)]
    for out in outs:
        steps.add(out, StepContext())
    assert len(steps) == MAX_IN_FLIGHT
    assert steps.get(outs[0]) is None and steps.get(outs[-1]) is not None
