"""Tests for engine_adapter.engine.models: spec resolution, packaged assembly, cache safety."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import multiprocessing
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from engine_adapter.engine import models
from engine_adapter.engine.models import (
    MARKER,
    ModelResolutionError,
    PackagedModel,
    ensure_packaged,
    locate_parts,
    model_pair_shares_tokenizer,
    resolve_model,
)

# ---------------------------------------------------------------- helpers


def make_fake_packages(root: Path, n_parts: int = 11, part_size: int = 1000) -> PackagedModel:
    """Installable-looking part packages under root (put root on sys.path to use them).

    Unpadded names (part2 < part10) check that parts are ordered numerically.
    """
    prefix = f"fakemodel_{uuid.uuid4().hex[:8]}_part"
    digest, total = hashlib.sha256(), 0
    for i in range(1, n_parts + 1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
        data = bytes([i]) * part_size
        (pkg / "data" / f"part{i}.bin").write_bytes(data)
        digest.update(data)
        total += len(data)
    return PackagedModel(
        key="fake",
        hub_id="fake/fake",
        gguf_name="fake.gguf",
        modules=tuple(f"{prefix}{i}" for i in range(1, n_parts + 1)),
        size=total,
        sha256=digest.hexdigest(),
        final_name="fake-bf16",
    )


def fake_convert(gguf: Path, out: Path, log: Path | None = None, delay: float = 0.0) -> None:
    """Stands in for the GGUF->safetensors conversion; records each call in log."""
    time.sleep(delay)
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (out / "config.json").write_text(json.dumps({"vocab_size": 16, "source_sha": sha}))
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"{sha}\n")


def leftovers(cache: Path) -> list[str]:
    """Everything in the cache except lock files and finished model dirs."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock") and not (p / MARKER).is_file())


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackagedModel:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return make_fake_packages(site)


# ---------------------------------------------------------------- local directories


def test_local_dir_ok(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


@pytest.mark.parametrize(
    "layout, expected",
    [
        ("missing", "does not exist"),
        ("no_config", "no config.json"),
        ("file", "not a directory"),
    ],
)
def test_local_dir_errors(tmp_path: Path, layout: str, expected: str) -> None:
    target = tmp_path / "model"
    if layout == "no_config":
        target.mkdir()
        (target / "model.safetensors").write_bytes(b"")
    elif layout == "file":
        target.write_text("x")
    with pytest.raises(ModelResolutionError, match=expected) as info:
        resolve_model(str(target), allow_hub=False)
    assert str(target) in str(info.value)


def test_unknown_packaged_key() -> None:
    with pytest.raises(ModelResolutionError, match="packaged:1.5b"):
        resolve_model("packaged:7b", allow_hub=False)


# ---------------------------------------------------------------- hub / offline


@pytest.mark.parametrize("env_offline, allow_hub", [("1", None), ("1", True), ("", False)])
def test_offline_unknown_hub_id(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env_offline: str, allow_hub: bool | None
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", env_offline)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("network was touched")

    monkeypatch.setattr(models, "hub_reachable", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    spec = f"nobody-{uuid.uuid4().hex[:6]}/no-such-model"
    with pytest.raises(ModelResolutionError) as info:
        resolve_model(spec, cache_dir=tmp_path, allow_hub=allow_hub)
    message = str(info.value)
    for needle in ("unreachable", spec, "packaged:1.5b", "packaged:0.5b", "local model directory"):
        assert needle in message


@pytest.mark.parametrize(
    "spec, key",
    [
        (models.DEFAULT_TARGET, "1.5b"),
        (models.DEFAULT_DRAFT, "0.5b"),
        ("packaged:1.5b", "1.5b"),
        ("PACKAGED:0.5B", "0.5b"),
    ],
)
def test_offline_default_ids_use_packaged_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec: str, key: str
) -> None:
    """With a finished cache entry, offline resolution returns it without building."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = next(m for m in models.PACKAGED if m.key == key)
    final = tmp_path / model.final_name
    final.mkdir()
    (final / MARKER).write_text(model.sha256 + "\n")
    stages: list[str] = []
    got = resolve_model(spec, cache_dir=tmp_path, progress=lambda s, f: stages.append(s))
    assert got == final and stages == ["done"]


@pytest.mark.parametrize(
    "spec, expected",
    [
        (models.DEFAULT_TARGET, "packaged"),  # the default pair falls back to the packaged copy
        ("someone/other-model", "could not download someone/other-model"),
    ],
)
def test_online_hub_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec: str, expected: str) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls: list[tuple[str, bool]] = []

    def failing_hub(repo_id: str, local_only: bool) -> Path:
        calls.append((repo_id, local_only))
        raise OSError("connection reset")

    monkeypatch.setattr(models, "_from_hub", failing_hub)
    model = models.PACKAGED[0]
    (tmp_path / model.final_name).mkdir()
    (tmp_path / model.final_name / MARKER).write_text(model.sha256)
    if expected == "packaged":
        got = resolve_model(spec, cache_dir=tmp_path, allow_hub=True)
        assert got == tmp_path / model.final_name
    else:
        with pytest.raises(ModelResolutionError, match=expected):
            resolve_model(spec, cache_dir=tmp_path, allow_hub=True)
    assert calls == [(spec, False)]


def _serve_404() -> tuple[http.server.HTTPServer, str]:
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.mark.parametrize("answers", [True, False])
def test_hub_probe(monkeypatch: pytest.MonkeyPatch, answers: bool) -> None:
    """Any HTTP answer (even 404) means reachable; a closed port means not, quickly."""
    server, url = _serve_404()
    if not answers:
        server.shutdown()
        server.server_close()
    monkeypatch.setenv("HF_ENDPOINT", url)
    start = time.monotonic()
    assert models.hub_reachable(timeout=1.0) is answers
    assert time.monotonic() - start < 1.6
    if answers:
        server.shutdown()


def test_missing_part_packages_named() -> None:
    model = PackagedModel("x", "x/x", ("no_such_pkg_part1", "no_such_pkg_part2"), "x.gguf", 1, "0" * 64, "x-bf16")
    with pytest.raises(ModelResolutionError) as info:
        locate_parts(model)
    assert "no-such-pkg-part1, no-such-pkg-part2" in str(info.value)
    assert 'pip install -e ".[packaged]"' in str(info.value)


# ---------------------------------------------------------------- packaged assembly


def test_parts_sorted_numerically_without_import(fake: PackagedModel) -> None:
    names = [p.name for p in locate_parts(fake)]
    assert names == [f"part{i}.bin" for i in range(1, 12)]
    assert not any(m in sys.modules for m in fake.modules)


def test_assemble_and_convert(fake: PackagedModel, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    calls: list[tuple[str, float]] = []
    final = ensure_packaged(fake, cache, convert=fake_convert, progress=lambda s, f: calls.append((s, f)))
    assert final == cache / "fake-bf16"
    assert json.loads((final / "config.json").read_text())["source_sha"] == fake.sha256
    assert (final / MARKER).read_text().strip() == fake.sha256
    assert leftovers(cache) == [] and not list(cache.rglob("*.gguf"))
    assert calls[-1] == ("convert", 1.0) and ("assemble", 1.0) in calls


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("flip_byte", "sha256"),
        ("extra_byte", "expected"),
    ],
)
def test_corrupted_part_rejected(fake: PackagedModel, tmp_path: Path, damage: str, expected: str) -> None:
    part = locate_parts(fake)[4]
    data = bytearray(part.read_bytes())
    if damage == "flip_byte":
        data[10] ^= 0xFF
    else:
        data.append(0)
    part.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ModelResolutionError, match=expected):
        ensure_packaged(fake, cache, convert=fake_convert)
    assert leftovers(cache) == []
    assert not (cache / fake.final_name).exists()


@pytest.mark.parametrize("marker", [None, "0" * 64])
def test_half_written_cache_rebuilt(fake: PackagedModel, tmp_path: Path, marker: str | None) -> None:
    cache = tmp_path / "cache"
    half = cache / fake.final_name
    half.mkdir(parents=True)
    (half / "config.json").write_text("{}")
    if marker:
        (half / MARKER).write_text(marker)
    crash = cache / f".{fake.final_name}.tmp-crashed"  # a previous run died here
    crash.mkdir()
    (crash / fake.gguf_name).write_bytes(b"partial")
    log = tmp_path / "conversions.log"
    final = ensure_packaged(fake, cache, convert=functools.partial(fake_convert, log=log))
    assert (final / MARKER).read_text().strip() == fake.sha256
    assert json.loads((final / "config.json").read_text())["source_sha"] == fake.sha256
    assert not crash.exists() and leftovers(cache) == []
    # A second call finds the finished dir and does not convert again.
    ensure_packaged(fake, cache, convert=functools.partial(fake_convert, log=log))
    assert len(log.read_text().splitlines()) == 1


def _resolve_in_child(site: str, model: PackagedModel, cache: str, log: str) -> str:
    sys.path.insert(0, site)
    convert = functools.partial(fake_convert, log=Path(log), delay=1.0)
    return str(ensure_packaged(model, Path(cache), convert=convert))


def test_concurrent_processes_build_once(fake: PackagedModel, tmp_path: Path) -> None:
    cache, log = tmp_path / "cache", tmp_path / "conversions.log"
    ctx = multiprocessing.get_context("spawn")  # no fork of a possibly threaded parent
    with ctx.Pool(2) as pool:
        args = [(str(tmp_path / "site"), fake, str(cache), str(log))] * 2
        results = pool.starmap(_resolve_in_child, args)
    assert results == [str(cache / fake.final_name)] * 2
    assert log.read_text().splitlines() == [fake.sha256]
    assert leftovers(cache) == []


# ---------------------------------------------------------------- tokenizer sharing


def _model_dir(root: Path, name: str, vocab_size: int, vocab: dict[str, int]) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    tok = {"model": {"type": "BPE", "vocab": vocab}, "added_tokens": [{"id": len(vocab), "content": "<|end|>"}]}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    return d


@pytest.mark.parametrize(
    "draft_size, draft_vocab, shares",
    [
        (64, {"a": 0, "b": 1}, True),
        (128, {"a": 0, "b": 1}, False),
        (64, {"a": 1, "b": 0}, False),
        (64, {"a": 0, "b": 1, "c": 2}, False),
    ],
)
def test_model_pair_shares_tokenizer(
    tmp_path: Path, draft_size: int, draft_vocab: dict[str, int], shares: bool
) -> None:
    target = _model_dir(tmp_path, "target", 64, {"a": 0, "b": 1})
    draft = _model_dir(tmp_path, "draft", draft_size, draft_vocab)
    assert model_pair_shares_tokenizer(target, draft) is shares


# ---------------------------------------------------------------- the real packaged pair


@pytest.mark.slow
def test_real_packaged_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uses the default cache: converts the real GGUFs the first time (minutes, ~6 GB free disk)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = resolve_model("packaged:1.5b")
    draft = resolve_model("packaged:0.5b")
    for d in (target, draft):
        assert json.loads((d / "config.json").read_text())["vocab_size"] == 151936
        assert list(d.glob("*.safetensors")) and (d / "tokenizer.json").is_file()
    assert model_pair_shares_tokenizer(target, draft) is True
