"""Slow: what a Space's install (``pip install -r requirements.txt``, no set-up script) puts beside
torch, and that transformers' Qwen2 model still imports in the app's processes.

Contract: pip resolves requirements.txt (``--dry-run --ignore-installed --report``, this machine's
pip configuration, no retries: PyTorch's CPU index may be unreachable and then costs nothing);
the resolved torchvision, torchaudio and torchcodec are installed, exactly those files, with
``--no-deps --target`` into a temporary folder; a subprocess of this environment's Python with
that folder on ``PYTHONPATH`` imports ``transformers.models.qwen2.modeling_qwen2``:
- after ``hide_mismatched_torch_extras()`` (what models.py, token_text.py and the server's main
  module do) the import works, and the names hidden are those the rule finds in the resolved set;
- without it (the controls) each extra the rule calls mismatched fails to import and each other one
  loads, and the Qwen2 import fails when a mismatched torchvision or torchaudio is there.
The environment's torch must be the resolved one (scripts/setup.sh installs the same pins).
Skipped only when PyPI cannot be reached. About a minute, most of it pip's resolution.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.torch_extras import TORCH_EXTRAS, installed_version, mismatched_torch_extras

pytestmark = pytest.mark.slow

PYPI_PROBE = "https://pypi.org/simple/pip/"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--retries", "0", "--timeout", "20"]
RESOLVE_TIMEOUT_S = 600
INSTALL_TIMEOUT_S = 300
IMPORT_TIMEOUT_S = 180

QWEN2 = "transformers.models.qwen2.modeling_qwen2"
IMPORTS = """
import importlib, json, sys
hidden = ()
if sys.argv[1] == "hide":
    from engine_adapter.torch_extras import hide_mismatched_torch_extras
    hidden = hide_mismatched_torch_extras()
errors = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
        errors[name] = None
    except Exception as e:  # torchvision's RuntimeError, torchaudio's OSError, ...
        errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
print(json.dumps({"hidden": list(hidden), "errors": errors}))
"""


def pypi_reachable(timeout_s: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(PYPI_PROBE, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def resolve_requirements(report: Path) -> dict[str, dict]:
    """requirements.txt as pip resolves it here: name -> the report's install entry."""
    cmd = [*PIP, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report)]
    out = subprocess.run(
        [*cmd, "-r", str(PROJECT_ROOT / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=RESOLVE_TIMEOUT_S,
        cwd=PROJECT_ROOT,
    )
    assert out.returncode == 0, f"pip could not resolve requirements.txt:\n{out.stderr[-3000:]}"
    entries = json.loads(report.read_text())["install"]
    return {e["metadata"]["name"].lower(): e for e in entries}


def artifact(entry: dict) -> str:
    """The resolved file's URL, with its hash for pip to check when the report has one."""
    info = entry["download_info"]
    hashes = info.get("archive_info", {}).get("hashes", {})
    return info["url"] + (f"#sha256={hashes['sha256']}" if "sha256" in hashes else "")


def imports(extras: Path, hide: bool, *modules: str) -> dict:
    """In a fresh process with ``extras`` first on the path: {"hidden": [...], "errors": {module: None or why}}."""
    env = os.environ | {"PYTHONPATH": str(extras)}
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS, "hide" if hide else "plain", *modules],
        capture_output=True,
        text=True,
        env=env,
        timeout=IMPORT_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def space_extras(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    """(resolved versions of torch and its extras, a folder holding exactly the resolved extras)."""
    if not pypi_reachable():
        pytest.skip(f"PyPI cannot be reached ({PYPI_PROBE}): cannot resolve requirements.txt")
    tmp = tmp_path_factory.mktemp("space-install")
    resolved = resolve_requirements(tmp / "report.json")
    assert "torch" in resolved, "requirements.txt resolved without torch"
    versions = {name: resolved[name]["metadata"]["version"] for name in ("torch", *TORCH_EXTRAS) if name in resolved}
    extras = tmp / "extras"
    urls = [artifact(resolved[name]) for name in TORCH_EXTRAS if name in resolved]
    if urls:
        cmd = [*PIP, "install", "--quiet", "--no-deps", "--target", str(extras), *urls]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        assert out.returncode == 0, f"installing {urls}:\n{out.stderr[-3000:]}"
    extras.mkdir(exist_ok=True)
    return versions, extras


def test_this_environment_has_the_resolved_torch(space_extras: tuple[dict[str, str], Path]) -> None:
    versions, _ = space_extras
    assert installed_version("torch") == versions["torch"], (
        f"this environment's torch {installed_version('torch')} is not what requirements.txt resolves to "
        f"({versions['torch']}); rerun scripts/setup.sh"
    )


def test_qwen2_imports_beside_the_resolved_extras_once_mismatched_ones_are_hidden(
    space_extras: tuple[dict[str, str], Path],
) -> None:
    versions, extras = space_extras
    expected = [m.name for m in mismatched_torch_extras(versions.get)]
    got = imports(extras, True, QWEN2)
    assert got == {"hidden": expected, "errors": {QWEN2: None}}, f"resolved {versions}"


def test_control_the_rule_names_exactly_the_extras_that_do_not_load(
    space_extras: tuple[dict[str, str], Path],
) -> None:
    """Without hiding: each extra the rule calls mismatched fails to import, each other one loads."""
    versions, extras = space_extras
    mismatched = {m.name for m in mismatched_torch_extras(versions.get)}
    present = [name for name in TORCH_EXTRAS if name in versions]
    errors = imports(extras, False, *present)["errors"]
    assert {name for name in present if errors[name] is not None} == mismatched, f"resolved {versions}: {errors}"


def test_control_without_hiding_qwen2_fails_beside_a_mismatched_torchvision_or_torchaudio(
    space_extras: tuple[dict[str, str], Path],
) -> None:
    """transformers imports torchvision and torchaudio on the way to Qwen2 (a broken torchcodec alone
    does not reach this import: measured; it is hidden because it does not load, above)."""
    versions, extras = space_extras
    breaking = {m.name for m in mismatched_torch_extras(versions.get)} & {"torchvision", "torchaudio"}
    error = imports(extras, False, QWEN2)["errors"][QWEN2]
    if breaking:
        assert error is not None, f"resolved {versions}: Qwen2 imported beside {sorted(breaking)} after all"
    else:
        assert error is None, f"resolved {versions}, no torchvision or torchaudio mismatched: {error}"
