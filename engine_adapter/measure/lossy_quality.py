"""What a lossy acceptance rule changed in a sweep's texts, against the lossless texts.

Contract: ``final_answer(category, text)`` is the answer a math or QA prompt's text ends on
(math: its last number; qa: its first sentence, lower-cased, spaces collapsed), None for other
categories; ``quality_columns(results, reference, categories)`` compares a run's requests with
the lossless text of the same prompt (``reference``: prompt -> token ids and text, greedy) and
returns the sweep CSV's ``LOSSY_COLUMNS``: mean aligned token agreement
(``provenance.text_agreement``), answers compared and changed, and the share of accepted drafts
that only the lossy rule kept. Pure: no engine.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from engine_adapter.provenance import text_agreement
from engine_adapter.records import RequestResult

LOSSY_COLUMNS = [
    "acceptance",
    "acceptance_rule",
    "agreement",
    "answers_compared",
    "answers_changed",
    "relaxed_share",
]
ANSWER_CATEGORIES = ("math", "qa")
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")


def final_answer(category: str, text: str) -> str | None:
    if category == "math":
        numbers = _NUMBER.findall(text)
        return numbers[-1].replace(",", "") if numbers else ""
    if category == "qa":
        first = re.split(r"(?<=[.!?])\s|\n", text.strip(), maxsplit=1)[0]
        return " ".join(first.lower().split())
    return None


def quality_columns(
    results: Sequence[RequestResult],
    reference: Mapping[str, tuple[list[int], str]],
    categories: Mapping[str, str],
) -> dict[str, Any]:
    agree, compared, changed = [], 0, 0
    for r in results:
        if r.prompt not in reference:
            continue
        ids, text = reference[r.prompt]
        agree.append(text_agreement(r.token_ids, ids))
        want = final_answer(categories.get(r.prompt, ""), text)
        if want is not None:
            compared += 1
            changed += final_answer(categories.get(r.prompt, ""), r.text) != want
    accepted = sum(s.accepted for r in results for s in r.steps)
    relaxed = sum(r.num_relaxed for r in results)
    return {
        "agreement": round(statistics.mean(agree), 4) if agree else None,
        "answers_compared": compared,
        "answers_changed": changed,
        "relaxed_share": round(relaxed / accepted, 4) if accepted else 0.0,
    }
