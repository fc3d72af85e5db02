"""torch's companion packages that do not match torch: the rule, and hiding them from a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_adapter.package_data import PROJECT_ROOT as ROOT
from engine_adapter.torch_extras import (
    TORCH_EXTRAS,
    Mismatch,
    hide_mismatched_torch_extras,
    is_cpu_build,
    local_label,
    mismatched_torch_extras,
)
from engine_adapter.vllm_plugin.paths import SERVER_MODULE, STARTUP_DIR

PYPI_SET = {"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.11.1", "torchcodec": "0.17.0"}
CPU_INDEX_SET = {
    "torch": "2.13.0+cpu",
    "torchvision": "0.28.0+cpu",
    "torchaudio": "2.13.0+cpu",
    "torchcodec": "0.17.0+cpu",
}
NOT_CPU = "not a +cpu build (PyPI's Linux wheels are CUDA builds)"


@pytest.mark.parametrize(
    "versions, expected",
    [
        # what requirements.txt resolves to without PyTorch's CPU index (measured): all three break
        (PYPI_SET, ["torchvision", "torchaudio", "torchcodec"]),
        # what PyTorch's CPU index gives: matching builds
        (CPU_INDEX_SET, []),
        # one of each
        ({"torch": "2.13.0+cpu", "torchvision": "0.28.0+cpu", "torchaudio": "2.11.1"}, ["torchaudio"]),
        ({"torch": "2.13.0+cpu", "torchvision": "0.28.0+cu130"}, ["torchvision"]),
        # the extras uninstalled (scripts/setup.sh): nothing to hide
        ({"torch": "2.13.0+cpu"}, []),
        # torch without a +cpu label (PyPI's CUDA build, the GPU machine's): its extras are left alone
        ({"torch": "2.13.0", "torchvision": "0.28.0", "torchaudio": "2.13.0", "torchcodec": "0.17.0"}, []),
        ({"torch": "2.11.0+cu130", "torchvision": "0.26.0+cu130"}, []),
        # no torch at all
        ({"torchvision": "0.28.0"}, []),
        # older torch's composite label still says cpu
        ({"torch": "2.1.0+cpu.cxx11.abi", "torchvision": "0.16.0+cpu", "torchaudio": "2.1.0"}, ["torchaudio"]),
        ({"torch": "2.13.0+CPU", "torchvision": "0.28.0+cpu"}, []),
    ],
)
def test_the_rule(versions: dict[str, str], expected: list[str]) -> None:
    found = mismatched_torch_extras(versions.get)
    assert [m.name for m in found] == expected
    assert all(m.torch_version == versions["torch"] and m.version == versions[m.name] for m in found)


@pytest.mark.parametrize(
    "version, label, cpu",
    [
        ("2.13.0+cpu", ("cpu",), True),
        ("2.1.0+cpu.cxx11.abi", ("cpu", "cxx11", "abi"), True),
        ("0.28.0", (), False),
        ("0.28.0+cu130", ("cu130",), False),
        ("1.0+cpux", ("cpux",), False),
    ],
)
def test_local_label(version: str, label: tuple[str, ...], cpu: bool) -> None:
    assert local_label(version) == label
    assert is_cpu_build(version) is cpu


@pytest.mark.parametrize(
    "version, says",
    [
        ("0.28.0", f"torchvision 0.28.0 is {NOT_CPU} beside torch 2.13.0+cpu"),
        ("0.28.0+cu130", "torchvision 0.28.0+cu130 is a CUDA build (+cu130) beside torch 2.13.0+cpu"),
        ("0.28.0+rocm7.1", "torchvision 0.28.0+rocm7.1 is a +rocm7.1 build beside torch 2.13.0+cpu"),
    ],
)
def test_the_line_says_what_and_why(version: str, says: str) -> None:
    assert Mismatch("torchvision", version, "2.13.0+cpu").describe() == says


def test_the_default_reads_this_environment_without_importing_torch() -> None:
    code = (
        "import sys; from engine_adapter.torch_extras import mismatched_torch_extras; mismatched_torch_extras(); "
        "print(sorted(m for m in ('torch', *sys.argv[1:]) if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code, *TORCH_EXTRAS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def fake_site(root: Path, versions: dict[str, str]) -> Path:
    """A folder for PYTHONPATH with a dist-info per (name, version) and an importable package for
    each extra: the metadata shadows the environment's (torch's included), the package stands for
    an installed, broken build."""
    for name, version in versions.items():
        info = root / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        if name != "torch":
            (root / name).mkdir()
            (root / name / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    return root


HIDE = """
import importlib.util, json, logging, sys
from engine_adapter.torch_extras import hide_mismatched_torch_extras
before = {n: importlib.util.find_spec(n) is not None for n in sys.argv[1:]}
first = hide_mismatched_torch_extras()
second = hide_mismatched_torch_extras()
after = {n: importlib.util.find_spec(n) is not None for n in sys.argv[1:]}
imports = {}
for n in sys.argv[1:]:
    try:
        __import__(n)
        imports[n] = "imported"
    except ImportError:
        imports[n] = "ImportError"
    except Exception as e:
        imports[n] = type(e).__name__
print(json.dumps({"before": before, "first": first, "second": second, "after": after, "imports": imports,
                  "torch_imported": "torch" in sys.modules}))
"""


def run_with(site: Path, code: str, *args: str) -> tuple[dict, str]:
    env = os.environ | {"PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_hiding_makes_a_mismatched_extra_absent(tmp_path: Path) -> None:
    site = fake_site(tmp_path, {"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.13.0+cpu"})
    got, log = run_with(site, HIDE, "torchvision", "torchaudio")
    assert got["before"] == {"torchvision": True, "torchaudio": True}
    assert got["first"] == got["second"] == ["torchvision"]  # idempotent: the same names again
    assert got["after"] == {"torchvision": False, "torchaudio": True}  # find_spec: None, as if uninstalled
    assert got["imports"] == {"torchvision": "ImportError", "torchaudio": "RuntimeError"}
    assert not got["torch_imported"]
    lines = [line for line in log.splitlines() if "hidden from this process" in line]
    assert lines == [
        "torchvision 0.28.0 is not a +cpu build (PyPI's Linux wheels are CUDA builds) beside torch 2.13.0+cpu: "
        "hidden from this process; nothing here uses it"
    ]  # one line, logged once


def test_nothing_is_hidden_beside_a_torch_without_the_cpu_label(tmp_path: Path) -> None:
    site = fake_site(tmp_path, {"torch": "2.13.0", "torchvision": "0.28.0"})
    got, log = run_with(site, HIDE, "torchvision")
    assert got["first"] == [] and got["after"] == {"torchvision": True}
    assert "hidden" not in log


def test_an_extra_already_imported_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = object()
    monkeypatch.setitem(sys.modules, "torchvision", sentinel)
    monkeypatch.setitem(sys.modules, "torchaudio", None)  # restored (or removed) after the test
    del sys.modules["torchaudio"]
    hidden = hide_mismatched_torch_extras({"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.11.1"}.get)
    assert hidden == ("torchaudio",)
    assert sys.modules["torchvision"] is sentinel and sys.modules["torchaudio"] is None


SERVER_AS_SPAWNED = """
import json, runpy, sys
# what multiprocessing's spawn does in vLLM's engine core and worker: the parent's main module, as __mp_main__
runpy.run_module(sys.argv[1], run_name="__mp_main__", alter_sys=True)
print(json.dumps({"hidden": sys.modules.get("torchvision", "absent") is None, "vllm": "vllm" in sys.modules}))
"""


def test_the_servers_main_module_hides_them_in_spawned_processes(tmp_path: Path) -> None:
    site = fake_site(tmp_path, {"torch": "2.13.0+cpu", "torchvision": "0.28.0"})
    got, _ = run_with(site, SERVER_AS_SPAWNED, SERVER_MODULE)
    assert got == {"hidden": True, "vllm": False}


def test_every_process_started_with_the_engines_path_hides_them(tmp_path: Path) -> None:
    """vLLM starts some processes by module name (its model registry's inspection runs
    ``python -m vllm.model_executor.models.registry``, which imports transformers at once): the
    engine's PYTHONPATH starts with STARTUP_DIR, whose sitecustomize hides the companions in any
    Python process before its own code runs."""
    site = fake_site(tmp_path, {"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.11.1"})
    code = "import sys, json; print(json.dumps({n: n in sys.modules and sys.modules[n] is None for n in sys.argv[1:]}))"
    env = os.environ | {"PYTHONPATH": f"{STARTUP_DIR}:{ROOT}:{site}"}
    out = subprocess.run(
        [sys.executable, "-c", code, "torchvision", "torchaudio"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"torchvision": True, "torchaudio": True}
    assert "hidden from this process" in out.stderr
