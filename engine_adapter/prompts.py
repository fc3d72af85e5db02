"""Prompt files: the presets by task (``prompts/presets.jsonl``) and prompt lists for the CLIs.

Contract: ``read_prompts(path)`` reads a prompt file (JSONL, one ``{"prompt": ...}``
per line, other keys ignored) with errors that name the line;
``load_presets(path=PRESETS_FILE, categories=None)`` returns one
``Preset`` (category, title, prompt; ``label`` = "category: title") per line of
the file (``{"category", "title", "prompt"}``), in file order; with
``categories`` only those whose category is listed. Engine-neutral: used by
the benchmark and, through ``explorer.views.presets``, by the UI.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.package_data import prompts_dir

PRESETS_FILE = prompts_dir() / "presets.jsonl"


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
    return [
        Preset(r["category"], r["title"], r["prompt"])
        for r in rows
        if categories is None or r["category"] in categories
    ]


def read_prompts(path: Path) -> list[str]:
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise ValueError(f'{path}:{n}: expected an object with a "prompt" string')
        prompts.append(obj["prompt"])
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts
