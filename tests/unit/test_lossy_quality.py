"""What a lossy rule changed, on hand-made texts: final answers and agreement."""

from __future__ import annotations

import pytest

from engine_adapter.measure.lossy_quality import final_answer, quality_columns
from engine_adapter.provenance import text_agreement
from engine_adapter.records import RelaxedDraft, RequestResult, Step


@pytest.mark.parametrize(
    "category, text, answer",
    [
        ("math", "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.", "391"),
        ("math", "The answer is 1,234.5", "1234.5"),
        ("math", "no number here", ""),
        ("qa", "Canberra is the capital.  It was chosen as a compromise.", "canberra is the capital."),
        ("qa", "Paris\nbecause", "paris"),
        ("code", "def f(): return 1", None),
    ],
)
def test_final_answer(category, text, answer):
    assert final_answer(category, text) == answer


@pytest.mark.parametrize(
    "a, b, expected",
    [([1, 2, 3], [1, 2, 3], 1.0), ([1, 2, 3, 4], [1, 9, 3, 4], 0.75), ([1, 2], [1, 2, 3, 4], 0.5), ([], [], 1.0)],
)
def test_text_agreement(a, b, expected):
    assert text_agreement(a, b) == pytest.approx(expected)


def result(prompt: str, ids: list[int], text: str, accepted: int, relaxed: int) -> RequestResult:
    step = Step(1, 0.0, 0.0, 1, 3, ids[:3], 3, accepted, ids, relaxed=[RelaxedDraft(1, 0, 0.1, 0.2)] * relaxed)
    return RequestResult(prompt, prompt, text, ids, [], [step], "tap", None, None, "length", 1, 0.0, 0.0, 1.0)


def test_quality_columns_against_the_lossless_texts():
    reference = {"sum?": ([1, 2, 3, 4], "so 42"), "why?": ([5, 6], "Because."), "code": ([7], "x")}
    categories = {"sum?": "math", "why?": "qa", "code": "code"}
    runs = [result("sum?", [1, 2, 9, 4], "so 41", 3, 1), result("why?", [5, 6], "Because.", 2, 0)]
    q = quality_columns(runs, reference, categories)
    assert q == {"agreement": 0.875, "answers_compared": 2, "answers_changed": 1, "relaxed_share": 0.2}
