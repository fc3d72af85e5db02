"""validate_k_table and k_for_batch_size against vLLM's own Dynamic SD rules."""

from __future__ import annotations

import json

import pytest
from vllm.v1.spec_decode.dynamic.utils import (
    build_dynamic_sd_schedule_lookup,
    validate_and_normalize_dynamic_sd_schedule,
)

from engine_adapter.engine_config import k_for_batch_size, validate_k_table

# vLLM's validator int()s every value, so it silently takes 3.0, "3", True (=1)
# and even 2.5 (as 2). Ours refuses anything but a real int on purpose: a K
# table with a typo should fail with a clear message, not be truncated.
VLLM_TRUNCATES = "vllm-accepts-via-int()"

K_TABLE_CASES = [
    # (table, expected error substring or None, how vLLM differs or None)
    pytest.param([[1, 64, 3]], None, None, id="single-row"),
    pytest.param([(1, 64, 3)], None, None, id="tuple-row"),
    pytest.param([[1, 4, 3], [8, 64, 1]], None, None, id="gap"),
    pytest.param([[1, 4, 3], [5, 16, 0], [17, 64, 2]], None, None, id="k0-row"),
    pytest.param([[1, 64, 0]], None, None, id="all-k0"),
    pytest.param([[1, 1, 1]], None, None, id="single-batch-size"),
    pytest.param([[8, 64, 1], [1, 4, 3]], None, None, id="unsorted-non-overlapping"),
    pytest.param("[[1, 64, 3]]", None, None, id="json-valid"),
    pytest.param("[[1, 4, 3], [8, 64, 1]]", None, None, id="json-gap"),
    pytest.param("[[1, 64, 3]", "not valid JSON", None, id="json-invalid"),
    pytest.param("", "not valid JSON", None, id="json-empty-string"),
    pytest.param("[]", "non-empty list", None, id="json-empty-list"),
    pytest.param('{"1": 3}', "non-empty list", None, id="json-object"),
    pytest.param([], "non-empty list", None, id="empty-list"),
    pytest.param(None, "non-empty list", None, id="none"),
    pytest.param(5, "non-empty list", None, id="not-a-list-int"),
    pytest.param({"rows": [[1, 64, 3]]}, "non-empty list", None, id="not-a-list-dict"),
    pytest.param([[1, 64]], "must be [start_bs, end_bs, K]", None, id="row-of-2"),
    pytest.param([[1, 64, 3, 4]], "must be [start_bs, end_bs, K]", None, id="row-of-4"),
    pytest.param([5], "must be [start_bs, end_bs, K]", None, id="row-not-a-list"),
    pytest.param([[1, 64, 3.0]], "must be integers", VLLM_TRUNCATES, id="float-integral"),
    pytest.param([[1, 64, 2.5]], "must be integers", VLLM_TRUNCATES, id="float-fraction"),
    pytest.param([[1, "64", 3]], "must be integers", VLLM_TRUNCATES, id="string-number"),
    pytest.param([[1, "x", 3]], "must be integers", None, id="string-word"),
    pytest.param([[1, 64, None]], "must be integers", None, id="none-value"),
    pytest.param([[True, 64, 3]], "must be integers", VLLM_TRUNCATES, id="bool"),
    pytest.param([[0, 64, 3]], "must be positive", None, id="start-0"),
    pytest.param([[-1, 64, 3]], "must be positive", None, id="start-negative"),
    pytest.param([[1, -4, 3]], "must be positive", None, id="end-negative"),
    pytest.param([[10, 4, 3]], "greater than end", None, id="start-gt-end"),
    pytest.param([[1, 64, -1]], "K must be >= 0", None, id="k-negative"),
    pytest.param([[1, 8, 3], [8, 64, 1]], "overlap", None, id="overlap-touching"),
    pytest.param([[1, 16, 3], [4, 64, 1]], "overlap", None, id="overlap"),
    pytest.param([[8, 64, 1], [1, 10, 3]], "overlap", None, id="unsorted-overlapping"),
    pytest.param([[2, 64, 3]], "must start at batch size 1", None, id="first-not-1"),
    pytest.param([[8, 64, 1], [2, 4, 3]], "must start at batch size 1", None, id="unsorted-first-not-1"),
]


@pytest.mark.parametrize("table, error, vllm_differs", K_TABLE_CASES)
def test_validate_k_table(table, error, vllm_differs):
    if error is None:
        rows = validate_k_table(table)
        parsed = json.loads(table) if isinstance(table, str) else table
        assert rows == sorted((tuple(r) for r in parsed), key=lambda r: r[0])
    else:
        with pytest.raises(ValueError) as e:
            validate_k_table(table)
        assert error in str(e.value)

    if isinstance(table, str):
        return  # JSON text is our own convenience; vLLM gets parsed lists
    if vllm_differs == VLLM_TRUNCATES:
        validate_and_normalize_dynamic_sd_schedule(table)  # vLLM accepts; we refuse
        return
    if error is None:
        assert validate_and_normalize_dynamic_sd_schedule(table) == validate_k_table(table)
    else:
        with pytest.raises((ValueError, TypeError)):
            validate_and_normalize_dynamic_sd_schedule(table)


LOOKUP_CASES = [
    # (table, num_speculative_tokens)
    pytest.param([[1, 64, 3]], 3, id="single-row"),
    pytest.param([[1, 4, 3], [8, 64, 1]], 3, id="gap-carries-previous-k"),
    pytest.param([[1, 4, 3], [5, 16, 0], [17, 64, 2]], 3, id="k0-middle"),
    pytest.param([[1, 16, 3], [17, 64, 0]], 3, id="k0-tail"),
    pytest.param([[1, 8, 5], [9, 32, 3], [48, 64, 1]], 2, id="kmax-below-table"),
    pytest.param([[1, 1, 4], [2, 100, 2]], 3, id="past-max-batch"),
    pytest.param([[1, 8, 2]], 4, id="tail-carries-last-k"),
    pytest.param([[1, 2, 6], [10, 12, 1], [30, 40, 4]], 6, id="several-gaps"),
    pytest.param([[33, 64, 1], [1, 16, 4]], 4, id="unsorted"),
]


@pytest.mark.parametrize("table, kmax", LOOKUP_CASES)
def test_k_for_batch_size_equals_vllm_lookup(table, kmax):
    dense = build_dynamic_sd_schedule_lookup(table, vllm_max_batch_size=64, vllm_num_speculative_tokens=kmax)
    rows = validate_k_table(table)
    ours = [k_for_batch_size(rows, bs, kmax) for bs in range(1, 65)]
    assert ours == dense[1:]
