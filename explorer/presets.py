"""Preset prompts by task (code, math, summarisation, translation, story, QA).

Contract: ``load_presets()`` reads ``prompts/presets.jsonl`` (one
``{"category", "title", "prompt"}`` per line) into ``Preset`` records;
``preset_choices`` gives dropdown labels in file order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PRESETS_FILE = Path(__file__).resolve().parent.parent / "prompts" / "presets.jsonl"


@dataclass(frozen=True)
class Preset:
    category: str
    title: str
    prompt: str

    @property
    def label(self) -> str:
        return f"{self.category}: {self.title}"


def load_presets(path: Path = PRESETS_FILE) -> list[Preset]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Preset(r["category"], r["title"], r["prompt"]) for r in rows]


def preset_choices(presets: list[Preset]) -> list[str]:
    return [p.label for p in presets]
