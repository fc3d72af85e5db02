"""Preset prompts by task (code, math, summarisation, translation, story, QA) for the dropdown.

Contract: takes the ``Preset`` records ``engine_adapter.prompts.load_presets()``
reads from ``prompts/presets.jsonl`` (the one reader of that file);
``preset_choices`` gives the dropdown's labels in file order and
``presets_by_label`` the preset behind each label.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.prompts import Preset


def preset_choices(presets: Sequence[Preset]) -> list[str]:
    return [p.label for p in presets]


def presets_by_label(presets: Sequence[Preset]) -> dict[str, Preset]:
    return {p.label: p for p in presets}
