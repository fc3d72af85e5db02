"""Hugging Face Space files: README's YAML header and requirements.txt agree with the project."""

from __future__ import annotations

import re
import tomllib

import gradio
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from engine_adapter.package_data import PROJECT_ROOT

ROOT = PROJECT_ROOT
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
REQUIREMENTS = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()

TORCH_CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
SETUP_COMMANDS = [
    "bash scripts/setup.sh && .venv/bin/python app.py",
    "bash scripts/setup.sh --dev && .venv/bin/ruff check && .venv/bin/ruff format --check"
    " && .venv/bin/python -m pytest",
]
SPACE_EXTRAS = ("cpu", "packaged")


def split_front_matter(text: str) -> tuple[dict, str]:
    m = re.match(r"---\n(.*?)\n---\n", text, re.DOTALL)
    assert m, "README.md must start with a YAML header between '---' lines"
    return yaml.safe_load(m.group(1)), text[m.end() :]


HEADER, BODY = split_front_matter(README)


def requirement_lines(lines: list[str]) -> list[str]:
    """Requirement lines of a requirements file: no comments, blanks or pip options."""
    out = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append(line)
    return out


def by_name(reqs: list[str]) -> dict[str, SpecifierSet]:
    parsed = [Requirement(r) for r in reqs]
    names = [canonicalize_name(r.name) for r in parsed]
    assert len(names) == len(set(names)), f"duplicate requirement: {sorted(names)}"
    return {canonicalize_name(r.name): r.specifier for r in parsed}


SPACE_DEPS = by_name(
    PYPROJECT["project"]["dependencies"]
    + [d for extra in SPACE_EXTRAS for d in PYPROJECT["project"]["optional-dependencies"][extra]]
)
REQUIRED = by_name(requirement_lines(REQUIREMENTS))


@pytest.mark.parametrize(
    "key",
    [
        "title",
        "emoji",
        "colorFrom",
        "colorTo",
        "sdk",
        "sdk_version",
        "app_file",
        "python_version",
        "pinned",
        "license",
        "short_description",
    ],
)
def test_header_has_key(key):
    assert HEADER.get(key) not in (None, ""), f"README header lacks {key!r}"


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("sdk", "gradio"),
        ("sdk_version", gradio.__version__),
        ("app_file", "app.py"),
        ("license", "apache-2.0"),
        ("pinned", False),
    ],
)
def test_header_value(key, expected):
    assert HEADER[key] == expected


@pytest.mark.parametrize(
    ("check", "ok"),
    [
        ("app_file exists", lambda h: (ROOT / h["app_file"]).is_file()),
        ("python_version is a string (YAML reads 3.10 as 3.1)", lambda h: isinstance(h["python_version"], str)),
        (
            "python_version satisfies requires-python",
            lambda h: SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(h["python_version"]),
        ),
        ("short_description fits the Hub's 60 characters", lambda h: len(h["short_description"]) <= 60),
    ],
)
def test_header_consistent(check, ok):
    assert ok(HEADER), check


def test_readme_opens_with_title_and_the_two_setup_commands():
    body = BODY.lstrip("\n")
    assert body.startswith("# Speculative decoding explorer\n")
    block = re.search(r"```bash\n(.*?)```", body, re.DOTALL)
    assert block, "no bash block after the title"
    assert [line for line in block.group(1).splitlines() if line.strip()] == SETUP_COMMANDS


def test_requirements_carry_the_torch_cpu_index():
    assert TORCH_CPU_INDEX in [line.strip() for line in REQUIREMENTS]


@pytest.mark.parametrize("name", sorted(SPACE_DEPS))
def test_pyproject_dependency_in_requirements_with_same_specifier(name):
    assert name in REQUIRED, f"{name} is in pyproject.toml but not in requirements.txt"
    assert REQUIRED[name] == SPACE_DEPS[name]


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_requirement_comes_from_pyproject(name):
    assert name in SPACE_DEPS, (
        f"{name} is in requirements.txt but not in pyproject.toml's dependencies or extras {SPACE_EXTRAS}"
    )
