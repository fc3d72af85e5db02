"""Preset prompts by task (code, math, summarisation, translation, story, QA).

Contract: ``load_presets()`` reads ``prompts/presets.jsonl`` (one
``{"category", "title", "prompt"}`` per line) into ``Preset`` records (both from
``engine_adapter.prompts``, the one reader of that file); ``preset_choices``
gives dropdown labels in file order.
"""

from __future__ import annotations

from engine_adapter.prompts import PRESETS_FILE, Preset, load_presets

__all__ = ["PRESETS_FILE", "Preset", "load_presets", "preset_choices"]


def preset_choices(presets: list[Preset]) -> list[str]:
    return [p.label for p in presets]
