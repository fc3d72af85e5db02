"""The run's size as the page says it: counts with their nouns, singular for one."""

from __future__ import annotations

import pytest

from explorer.views.token_view import run_tally


@pytest.mark.parametrize(
    ("tokens", "steps", "said"),
    [
        (1, 1, "1 token, 1 engine step"),
        (0, 0, "0 tokens, 0 engine steps"),
        (78, 50, "78 tokens, 50 engine steps"),
        (2, 1, "2 tokens, 1 engine step"),
    ],
)
def test_run_tally_says_singular_only_for_one(tokens: int, steps: int, said: str) -> None:
    assert run_tally(tokens, steps) == said
