"""vLLM's classes are built by keyword wherever the project builds them (the plugin and the tests):
a vLLM upgrade that adds, drops or reorders a field then fails by name, not by a shifted value."""

from __future__ import annotations

import ast
from pathlib import Path

from engine_adapter.package_data import PROJECT_ROOT

WHERE = ("engine_adapter", "tests", "scripts")


def _vllm_classes(tree: ast.AST) -> set[str]:
    """Names a module imports from vLLM that are classes by vLLM's naming (CapWords)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            names |= {a.asname or a.name for a in node.names if a.name[:1].isupper() and not a.name.isupper()}
    return names


def positional_builds(path: Path, root: Path = PROJECT_ROOT) -> list[str]:
    """``file:line Class(...)`` for each vLLM class (imported by name) called with positional arguments."""
    tree = ast.parse(path.read_text(), str(path))
    classes = _vllm_classes(tree)
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.func.id}(...)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes and node.args
    ]


def test_every_vllm_class_the_project_builds_is_built_by_keyword():
    files = [p for top in WHERE for p in sorted((PROJECT_ROOT / top).rglob("*.py"))]
    assert len(files) > 100
    found = [hit for p in files for hit in positional_builds(p)]
    assert found == [], "vLLM classes built with positional arguments:\n" + "\n".join(found)


def test_the_check_sees_a_positional_build(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from vllm.v1.request import Request\nRequest('a', [1], None, None)\nRequest(request_id='b')\n")
    assert positional_builds(probe, tmp_path) == ["probe.py:2 Request(...)"]
