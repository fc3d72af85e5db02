"""Code text is timeless (CONTRIBUTING.md): no dates and no commit hashes in the project's ``.py`` files.

History and measurements live in ``docs/`` and git; a docstring or comment points to a section of
``docs/`` by its topic. Scanned: every ``.py`` file of the project outside virtual environments.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine_adapter.package_data import PROJECT_ROOT

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# a word of 7 to 12 hex digits with a digit and a letter in it, as git abbreviates commits
COMMIT = re.compile(r"(?<![\w#.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}(?![\w-])")
SKIPPED_DIRS = {".venv", ".git", "node_modules", "__pycache__", "build", "dist"}


def project_python_files() -> list[Path]:
    return sorted(
        p
        for p in PROJECT_ROOT.rglob("*.py")
        if not SKIPPED_DIRS.intersection(p.relative_to(PROJECT_ROOT).parts)
        and not any(part.startswith(".") for part in p.relative_to(PROJECT_ROOT).parts[:-1])
    )


def findings(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for path in project_python_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "sha256" in line or "0x" in line:  # digests and hex constants are not commits
                continue
            found += [f"{path.relative_to(PROJECT_ROOT)}:{number}: {m.group(0)}" for m in pattern.finditer(line)]
    return found


def test_the_scan_sees_the_project() -> None:
    names = {p.relative_to(PROJECT_ROOT).as_posix() for p in project_python_files()}
    assert {"app.py", "engine_adapter/records.py", "tests/unit/test_code_text.py"} <= names


@pytest.mark.parametrize("pattern", [DATE, COMMIT], ids=["dates", "commit hashes"])
def test_no_python_file_holds_history(pattern: re.Pattern[str]) -> None:
    assert findings(pattern) == []


@pytest.mark.parametrize(
    "text, pattern, hits",
    [
        ("measured 2026-" + "12-03 on 2 cores", DATE, 1),  # split here, or this file would hold one
        ("fixed in e77f" + "b99, reverted in f33c" + "0f4", COMMIT, 2),
        ("a cafe of 1234567 deadbeef ids", COMMIT, 0),
        ("--allowed-origins and ab-12cd345", COMMIT, 0),
    ],
)
def test_the_patterns(text: str, pattern: re.Pattern[str], hits: int) -> None:
    assert len(pattern.findall(text)) == hits
