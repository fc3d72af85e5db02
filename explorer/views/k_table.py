"""The K table editor's cells: read into vLLM's rows, and judged as they are typed.

Contract: ``table_rows(value)`` turns what the editor (a ``gr.Dataframe``: a
DataFrame, the API's ``{"data": ...}`` form, or a list of rows) holds into
integer rows ``[start_bs, end_bs, K]``, skipping empty rows and raising
``ValueError`` with a message a person can act on (at most ``MAX_TABLE_ROWS``
rows); ``table_check(value, k_max)`` is the Markdown line under the editor:
the table vLLM would get, or why not (vLLM's rules and this engine's K cap,
``engine_adapter.engine_config.check_table``). Batch sizes in requests, K in
draft tokens per request per step.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from engine_adapter.engine_config import KTable, check_table

TABLE_HEADERS = ("start_bs", "end_bs", "K")
DEFAULT_TABLE: KTable = ((1, 2, 3), (3, 4, 1), (5, 64, 0))  # what the editor starts with
MAX_TABLE_ROWS = 64


def _blank(cell: Any) -> bool:
    if isinstance(cell, str):
        return not cell.strip()
    return cell is None or (isinstance(cell, float) and math.isnan(cell))


def _whole(name: str, cell: Any, row: int) -> int:
    try:
        f = float(cell)
    except (TypeError, ValueError):
        raise ValueError(f"row {row}: {name} must be a whole number; got {cell!r}") from None
    if not f.is_integer():
        raise ValueError(f"row {row}: {name} must be a whole number; got {cell!r}")
    return int(f)


def table_rows(value: Any) -> list[list[int]]:
    """The editor's cells as integer rows; a clear error for anything else (vLLM's rules come after)."""
    if isinstance(value, pd.DataFrame):
        raw = value.values.tolist()
    elif isinstance(value, dict) and "data" in value:  # the API's serialised form
        raw = value["data"]
    else:
        raw = value or []
    rows = []
    for n, row in enumerate(raw, 1):
        cells = list(row)[:3]
        if all(_blank(c) for c in cells):
            continue  # an empty row left by the editor
        if len(cells) != 3:
            raise ValueError(f"row {n}: needs three cells, start_bs, end_bs and K")
        rows.append([_whole(name, c, n) for name, c in zip(TABLE_HEADERS, cells)])
    if len(rows) > MAX_TABLE_ROWS:
        raise ValueError(f"at most {MAX_TABLE_ROWS} rows")
    return rows


def table_check(rows: Any, k_max: int) -> str:
    """The editor's table judged as it is typed (vLLM's rules, this engine's K cap), before any Apply."""
    try:
        checked = check_table(table_rows(rows), k_max)
    except ValueError as e:
        return f"✕ Not a valid table yet: {e}."
    return f"Valid table {table_value(checked)}: *Apply policy* with 'K table' chosen sends it."


def table_value(table: KTable) -> list[list[int]]:
    """A K table as the editor's rows."""
    return [list(r) for r in table]
