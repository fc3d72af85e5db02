"""The seam (engine_adapter/vllm_plugin/vllm_seam.py) against the installed vLLM.

Each listed name must resolve in vLLM (a class, function, method, constant, or an attribute its
class declares or sets in its own code), with the parameter names listed; each constant the plugin
copies must equal vLLM's; every import of vLLM in the plugin must be listed; and every plugin
module that imports vLLM must check its version when it is imported. An upgrade of vLLM fails here,
one test per name that moved.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.vllm_plugin import vllm_seam
from engine_adapter.vllm_plugin.vllm_seam import TOUCHES, UntestedVllm, VllmTouch, require_tested_vllm

PLUGIN = PROJECT_ROOT / "engine_adapter" / "vllm_plugin"


def declares(cls: type, attr: str) -> bool:
    """Whether instances of ``cls`` have ``attr``: a class attribute, a declared field, or ``self.attr``
    assigned in the code of ``cls`` or a vLLM base class."""
    if hasattr(cls, attr):
        return True
    for base in cls.__mro__:
        if not base.__module__.startswith("vllm"):
            continue
        fields = {f.name for f in dataclasses.fields(base)} if dataclasses.is_dataclass(base) else set()
        if (
            attr in fields
            or attr in getattr(base, "__annotations__", {})
            or attr in getattr(base, "__struct_fields__", ())
        ):
            return True
        try:
            source = inspect.getsource(base)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(attr)}\s*(:[^=\n]+)?=", source):
            return True
    return False


def resolve(touch: VllmTouch) -> object:
    obj: object = importlib.import_module(touch.module)
    parts = touch.name.split(".")
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif i == len(parts) - 1 and isinstance(obj, type) and declares(obj, part):
            return None  # an instance attribute, declared by its class
        else:
            raise AssertionError(f"{touch.qualified} ({touch.kind}, by {touch.by}.py) is not in the installed vLLM")
    return obj


@pytest.mark.parametrize("touch", TOUCHES, ids=[f"{t.kind}:{t.qualified}" for t in TOUCHES])
def test_each_name_is_in_vllm_as_listed(touch: VllmTouch) -> None:
    obj = resolve(touch)
    if touch.kind == "subclass":
        assert isinstance(obj, type), f"{touch.qualified} is no longer a class"
    if touch.params is not None:
        assert callable(obj), f"{touch.qualified} is no longer callable"
        params = tuple(inspect.signature(obj).parameters)
        assert params == touch.params, f"{touch.qualified} takes {params}, the plugin expects {touch.params}"
    if touch.copy is not None:
        module, name = touch.copy.rsplit(".", 1)
        ours = getattr(importlib.import_module(f"engine_adapter.vllm_plugin.{module}"), name)
        assert ours == obj, f"{touch.copy} is {ours!r}; vLLM's {touch.qualified} is {obj!r}"


def plugin_module(path: Path) -> str:
    return ".".join(path.relative_to(PLUGIN).with_suffix("").parts)


def test_each_toucher_is_a_plugin_module() -> None:
    assert {t.by for t in TOUCHES} <= {plugin_module(p) for p in PLUGIN.rglob("*.py")}


def vllm_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every import of vLLM in a file; name None for ``import vllm.x``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "vllm"]
    return found


IMPORTERS = sorted(p for p in PLUGIN.rglob("*.py") if vllm_imports(p))


def test_the_plugin_imports_vllm_somewhere() -> None:
    assert len(IMPORTERS) >= 8, [p.name for p in IMPORTERS]


@pytest.mark.parametrize("path", IMPORTERS, ids=[plugin_module(p) for p in IMPORTERS])
def test_every_import_of_vllm_is_listed(path: Path) -> None:
    listed = {(t.module, t.name.split(".")[0]) for t in TOUCHES}
    modules = {t.module for t in TOUCHES}
    missing = [
        f"{module}.{name}" if name else module
        for module, name in vllm_imports(path)
        if ((module, name) not in listed if name else module not in modules)
    ]
    assert missing == [], f"{path.name} imports vLLM names the seam does not list"


@pytest.mark.parametrize("path", IMPORTERS, ids=[plugin_module(p) for p in IMPORTERS])
def test_every_module_that_imports_vllm_checks_its_version(path: Path) -> None:
    calls = [
        node
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require_tested_vllm"
    ]
    assert calls, f"{path.name} imports vLLM without require_tested_vllm()"


def test_the_installed_vllm_is_the_tested_one() -> None:
    installed = vllm_seam.installed_vllm()
    assert installed is not None and vllm_seam.release_of(installed) == vllm_seam.TESTED_VLLM
    require_tested_vllm()


def test_an_untested_vllm_is_refused_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(vllm_seam.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(UntestedVllm) as refused:
        require_tested_vllm("0.33.0")
    said = str(refused.value)
    assert "vLLM 0.33.0 is installed" in said and vllm_seam.TESTED_VLLM in said and vllm_seam.ALLOW_UNTESTED_ENV in said
    require_tested_vllm(f"{vllm_seam.TESTED_VLLM}+cpu")  # the build's label is not the release


def test_the_override_lets_an_untested_vllm_run_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(vllm_seam.ALLOW_UNTESTED_ENV, "1")
    require_tested_vllm("0.34.1")
    assert "0.34.1" in caplog.text and "own risk" in caplog.text


def test_a_moved_name_is_caught() -> None:
    """The checks can fail: a name vLLM does not have, and parameters it does not take."""
    with pytest.raises(AssertionError, match="not in the installed vLLM"):
        resolve(VllmTouch("vllm.v1.core.sched.scheduler", "Scheduler.no_such_hook", "read", "tap"))
    with pytest.raises(AssertionError, match="takes"):
        test_each_name_is_in_vllm_as_listed(
            VllmTouch("vllm.v1.core.sched.scheduler", "Scheduler.shutdown", "override", "tap", params=("self", "now"))
        )
