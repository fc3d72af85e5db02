"""Every file a text names exists: backticked paths in the README, CONTRIBUTING.md and docs/.

A path is a backticked word with a ``/`` that ends in a file extension or a ``/``. It may be
written from the project's root, from a package (``engine/client.py`` for
``engine_adapter/engine/client.py``), from ``docs/``, or as a path inside vLLM
(``v1/core/sched/scheduler.py``): it must name a file or folder of the project or of the
installed vLLM. A line number after a colon (``tap.py:216``) is not part of the path.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

from engine_adapter.package_data import PROJECT_ROOT

TEXTS = [PROJECT_ROOT / "README.md", PROJECT_ROOT / "CONTRIBUTING.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
BACKTICKED = re.compile(r"`([^`\s]+)`")
EXTENSIONS = (".py", ".md", ".js", ".html", ".css", ".sh", ".toml", ".txt", ".csv", ".jsonl", ".json", ".yml", ".yaml")
SKIPPED_DIRS = {".venv", ".git", "__pycache__", "node_modules"}


def named_paths(text: str) -> list[tuple[int, str]]:
    """(line, path) for every backticked path in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in BACKTICKED.finditer(line):
            word = match.group(1).rstrip(".,;)")
            if word.startswith(("http", "/", "~", "$", "-")) or any(c in word for c in "<>{}*?|=%"):
                continue  # a URL, an absolute or home path, a variable, a flag, a pattern
            path = word.split("::")[0].split(":")[0]
            if "/" in path and (path.endswith(EXTENSIONS) or path.endswith("/")):
                found.append((number, path))
    return found


def _tree(root: Path) -> set[str]:
    out = set()
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts):
            continue
        out.add(rel.as_posix() + ("/" if p.is_dir() else ""))
    return out


@cache
def known_files() -> frozenset[str]:
    """Every file and folder of the project and of the installed vLLM, as posix paths ("dir/" for folders)."""
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    vllm_root = Path(spec.origin).parent if spec and spec.origin else None
    return frozenset(_tree(PROJECT_ROOT) | (_tree(vllm_root) if vllm_root else set()))


def exists(path: str) -> bool:
    """Whether ``path`` is a known file or folder, or the end of one's path (written from a package)."""
    suffix = "/" + path
    return path in known_files() or any(f.endswith(suffix) for f in known_files())


def test_the_texts_name_paths() -> None:
    assert sum(len(named_paths(t.read_text())) for t in TEXTS) > 100


@pytest.mark.parametrize("text", TEXTS, ids=[t.relative_to(PROJECT_ROOT).as_posix() for t in TEXTS])
def test_every_path_a_text_names_exists(text: Path) -> None:
    missing = [f"{text.name}:{line}: {path}" for line, path in named_paths(text.read_text()) if not exists(path)]
    assert missing == []


def test_a_missing_path_is_caught() -> None:
    text = "see `engine/client.py`, `engine/no_such_module.py:12` and `docs/` (not `--flag/x.py`)"
    assert [p for _, p in named_paths(text)] == ["engine/client.py", "engine/no_such_module.py", "docs/"]
    assert [exists(p) for _, p in named_paths(text)] == [True, False, True]
