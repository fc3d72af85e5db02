"""Preset prompts by task, the one reader of ``prompts/presets.jsonl``.

Contract: ``load_presets(path=PRESETS_FILE, categories=None)`` returns one
``Preset`` (category, title, prompt; ``label`` = "category: title") per line of
the file (``{"category", "title", "prompt"}``), in file order; with
``categories`` only those whose category is listed. Engine-neutral: used by
the benchmark and, through ``explorer.presets``, by the UI.
"""

from __future__ import annotations

import json
from collections.abc import Collection
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


def load_presets(path: Path = PRESETS_FILE, categories: Collection[str] | None = None) -> list[Preset]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [Preset(r["category"], r["title"], r["prompt"]) for r in rows
            if categories is None or r["category"] in categories]
