"""The house rules of CONTRIBUTING.md, held: which layer may import which.

Parses every module's imports (not executed) and checks them against one table.
Imports under ``if TYPE_CHECKING:`` are annotations only and are left out, except
for the never-rules (vLLM outside the plugin, a CLI, ``app``), which hold everywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine_adapter.package_data import PROJECT_ROOT

ROOT = PROJECT_ROOT

VOCABULARY = {
    "engine_adapter",
    "engine_adapter.records",
    "engine_adapter.engine_config",
    "engine_adapter.provenance",
    "engine_adapter.acceptance",
    "engine_adapter.acceptance_rule",
    "engine_adapter.ledger",
    "engine_adapter.prompts",
    "engine_adapter.package_data",
    "engine_adapter.torch_extras",
}
PURE_POLICY = {"engine_adapter.policy.cost_model", "engine_adapter.policy.k_policy"}
CLIS = {
    "engine_adapter.record",
    "engine_adapter.bench",
    "engine_adapter.sweep",
    "engine_adapter.sweep_targets",
    "engine_adapter.quant_check",
}

# layer -> what its modules may import from the project (a name, or a "pkg.*" prefix)
ALLOWED: dict[str, set[str]] = {
    "vocabulary": VOCABULARY,
    "vllm_plugin": {
        "engine_adapter.vllm_plugin.*",
        "engine_adapter.acceptance",
        "engine_adapter.acceptance_rule",
        "engine_adapter.records",
        "engine_adapter.torch_extras",
    }
    | PURE_POLICY,
    "engine": VOCABULARY
    | {"engine_adapter.engine.*", "engine_adapter.vllm_plugin.wire", "engine_adapter.vllm_plugin.paths"}
    | {"engine_adapter.policy.cost_model"},
    "policy": VOCABULARY | {"engine_adapter.policy.*", "engine_adapter.engine.*"},
    "service": VOCABULARY
    | {"engine_adapter.engine.*", "engine_adapter.policy.*", "engine_adapter.service.*", "engine_adapter.trace.format"},
    "trace": VOCABULARY | {"engine_adapter.trace.*", "engine_adapter.service.backend"},
    "measure": VOCABULARY | {f"engine_adapter.{p}.*" for p in ("engine", "policy", "service", "trace", "measure")},
    "cli": VOCABULARY | {f"engine_adapter.{p}.*" for p in ("engine", "policy", "service", "trace", "measure")},
    "explorer": VOCABULARY
    | PURE_POLICY
    | {"engine_adapter.service.backend", "engine_adapter.trace.format", "explorer.*"},
    "app": VOCABULARY | {f"engine_adapter.{p}.*" for p in ("engine", "policy", "service", "trace")} | {"explorer.*"},
}
# third-party packages only some layers may touch
ONLY_IN = {"vllm": {"vllm_plugin"}, "gradio": {"explorer", "app"}, "torch": {"vllm_plugin", "engine"}}
# layer -> packages it never imports, not even for annotations (the explorer sees a Backend, never an engine)
NEVER = {"explorer": ("engine_adapter.engine", "engine_adapter.vllm_plugin")}
PURE_MODULES = (
    VOCABULARY
    | PURE_POLICY
    | {
        "engine_adapter.vllm_plugin.wire",
        "engine_adapter.vllm_plugin.paths",
        "engine_adapter.trace.format",
    }
)
NOT_PURE = {"vllm", "torch", "transformers", "gradio", "zmq", "httpx"}


def layer_of(module: str) -> str:
    if module == "app":
        return "app"
    if module.startswith("explorer"):
        return "explorer"
    if module in CLIS:
        return "cli"
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and parts[1] in ALLOWED):
        return parts[1]
    return "vocabulary"


def modules() -> list[tuple[str, Path]]:
    found = [("app", ROOT / "app.py")]
    for pkg in ("engine_adapter", "explorer"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found.append((name, path))
    return found


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, only for type checking) for every absolute import in the file."""
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            typing = typing_only or _type_checking_block(child)
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, typing) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append((child.module, child.lineno, typing))
                # "from engine_adapter.engine import models" imports the module engine_adapter.engine.models
                out.extend(
                    (f"{child.module}.{a.name}", child.lineno, typing)
                    for a in child.names
                    if (ROOT / child.module.replace(".", "/") / f"{a.name}.py").exists()
                )
            visit(child, typing)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def allowed(target: str, rules: set[str]) -> bool:
    return any(target == r or (r.endswith(".*") and (target + ".").startswith(r[:-1])) for r in rules)


def violations() -> list[str]:
    bad = []
    for name, path in modules():
        layer = layer_of(name)
        for target, line, typing_only in imports(path):
            where = f"{path.relative_to(ROOT)}:{line} ({layer}) imports {target}"
            top = target.split(".")[0]
            if target in CLIS or top == "app":
                bad.append(f"{where}: nothing imports a CLI or app.py")
            elif top in ONLY_IN and layer not in ONLY_IN[top]:
                bad.append(f"{where}: {top} belongs to {sorted(ONLY_IN[top])} only")
            elif any(allowed(target, {f"{pkg}.*"}) or target == pkg for pkg in NEVER.get(layer, ())):
                bad.append(f"{where}: the {layer} layer never imports {target}, even for annotations")
            elif name in PURE_MODULES and top in NOT_PURE and not typing_only:
                bad.append(f"{where}: a pure module imports no I/O or engine library")
            elif top in ("engine_adapter", "explorer") and not typing_only and not allowed(target, ALLOWED[layer]):
                bad.append(f"{where}: not allowed for the {layer} layer")
    return bad


def test_every_import_follows_the_layer_rules():
    assert violations() == []


@pytest.mark.parametrize(
    "module, layer",
    [
        ("app", "app"),
        ("explorer.page", "explorer"),
        ("engine_adapter.records", "vocabulary"),
        ("engine_adapter.sweep", "cli"),
        ("engine_adapter.engine.client", "engine"),
        ("engine_adapter.engine", "engine"),
        ("engine_adapter.vllm_plugin.tap", "vllm_plugin"),
        ("engine_adapter.service.backend", "service"),
        ("engine_adapter.measure.throughput", "measure"),
    ],
)
def test_layer_of(module, layer):
    assert layer_of(module) == layer


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import vllm\n", [("vllm", 1, False)]),
        (
            "from engine_adapter.engine import models\n",
            [("engine_adapter.engine", 1, False), ("engine_adapter.engine.models", 1, False)],
        ),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine_adapter.engine.client import X\n",
            [("typing", 1, False), ("engine_adapter.engine.client", 3, True)],
        ),
        ("def f():\n    from explorer.nowhere import thing\n", [("explorer.nowhere", 2, False)]),
    ],
)
def test_imports_are_parsed_with_their_context(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert imports(path) == expected


def test_a_broken_rule_is_caught(tmp_path, monkeypatch):
    """The check is not vacuous: an explorer module importing the engine client fails it."""
    bad = tmp_path / "explorer" / "leak.py"
    bad.parent.mkdir()
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "from engine_adapter.service.load import run_prompts\n"
        "import vllm\n"
        "if TYPE_CHECKING:\n"
        "    from engine_adapter.engine.prometheus import parse_metrics\n"
    )
    monkeypatch.setattr(f"{__name__}.modules", lambda: [("explorer.leak", bad)])
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = violations()
    assert len(found) == 3
    assert "not allowed for the explorer layer" in found[0] and "vllm belongs" in found[1]
    assert "never imports engine_adapter.engine.prometheus, even for annotations" in found[2]


def test_an_import_of_another_test_file_is_caught(tmp_path):
    """The check below is not vacuous: a test importing another test's helpers is found."""
    (tmp_path / "tests" / "ui").mkdir(parents=True)
    (tmp_path / "tests" / "ui" / "test_a.py").write_text("from tests.ui.test_b import helper\nimport tests.support.x\n")
    assert files_importing_test_modules(tmp_path) == ["tests/ui/test_a.py:1 imports tests.ui.test_b"]


def files_importing_test_modules(root: Path) -> list[str]:
    """Files under tests/ that import a test module (``tests.<dir>.test_*``): shared helpers
    belong in tests/support/ (CONTRIBUTING.md)."""
    bad = []
    for path in sorted((root / "tests").rglob("*.py")):
        for target, line, _ in imports(path):
            parts = target.split(".")
            if parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:]):
                bad.append(f"{path.relative_to(root)}:{line} imports {target}")
    return bad


def test_no_test_imports_another_test_file():
    assert files_importing_test_modules(ROOT) == []
