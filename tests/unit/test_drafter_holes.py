"""The drafter-holes experiment's comparison (scripts/drafter_holes.py): same token positions, after the gap."""

from __future__ import annotations

import pytest

from scripts.drafter_holes import compare

# rows: [step, token position, K, drafted, accepted]
CONTROL = [[0, 0, 3, 0, 0], [1, 1, 3, 3, 3], [2, 5, 3, 3, 1], [3, 7, 3, 3, 2], [4, 10, 3, 3, 3], [5, 14, 3, 3, 0]]
GAP = [
    [0, 0, 3, 0, 0],
    [1, 1, 3, 3, 3],
    [2, 5, 0, 0, 0],
    [3, 6, 0, 0, 0],
    [4, 7, 3, 3, 0],
    [5, 8, 3, 3, 3],
    [6, 12, 3, 3, 1],
]


@pytest.mark.parametrize(
    "window, expected",
    [
        (100, [4, 9, 5, 9]),  # from token 7 on: the gap run's 3 steps; the control's steps at 7, 10, 14
        (4, [3, 6, 5, 6]),  # tokens 7-10: the gap run's steps at 7 and 8; the control's at 7 and 10
        (1, [0, 3, 2, 3]),  # token 7 only
    ],
)
def test_acceptance_after_the_gap_is_compared_at_the_same_tokens(window, expected):
    assert compare({0: CONTROL, 2: GAP}, window) == {2: expected}


def test_a_run_without_k0_steps_is_not_compared():
    assert compare({0: CONTROL, 2: CONTROL}, 100) == {}
