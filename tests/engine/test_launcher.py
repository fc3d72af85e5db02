"""The launcher: clear failures, no orphans, and attach mode against our server."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from engine_adapter.engine import launcher
from engine_adapter.engine.launcher import EngineProcess, EngineStartError
from engine_adapter.engine.live_engine import LiveEngine, launch_overlapping
from engine_adapter.engine.supervise import group_members
from engine_adapter.package_data import PROJECT_ROOT
from engine_adapter.provenance import kinds_for_step
from tests.support.engine_checks import PROMPTS, check_invariants, run
from tests.support.fixtures import tiny_config
from tests.support.processes import wait_gone

ROOT = PROJECT_ROOT


@pytest.mark.parametrize(
    "make_target, message",
    [
        (lambda tmp: str(tmp / "no-such-model"), "does not exist"),
        (lambda tmp: _empty_dir(tmp), "config.json"),
    ],
    ids=["missing-path", "dir-without-config"],
)
def test_bad_model_path_is_explained_and_leaves_no_process(tiny, tmp_path, make_target, message):
    target = make_target(tmp_path)
    cfg = tiny_config(tiny, "draft", "same")
    cfg = replace(cfg, target=target)
    proc = EngineProcess(cfg)
    with pytest.raises(EngineStartError, match=message):
        proc.start(timeout_s=120)
    assert not proc.is_alive()
    assert wait_gone(target, 10) == []


def _empty_dir(tmp: Path) -> str:
    d = tmp / "empty-model"
    d.mkdir()
    return str(d)


def test_broken_model_dir_fails_in_vllm_with_its_log(tiny, tmp_path):
    bad = tmp_path / "broken-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Nope"]}))
    cfg = tiny_config(tiny, "off")
    cfg = replace(cfg, target=str(bad))
    proc = EngineProcess(cfg)
    with pytest.raises(EngineStartError) as err:
        proc.start(timeout_s=180)
    text = str(err.value)
    assert "vLLM" in text and str(proc.log_path) in text
    assert wait_gone(str(bad), 15) == []


async def test_overlapping_launches_stop_at_a_failed_preparation(tiny, tmp_path):
    """A launch that fails before vLLM begins (no such model) keeps the next from beginning."""
    bad = replace(tiny_config(tiny, "off"), target=str(tmp_path / "no-such-model"))
    begun, engines = [], {}
    with pytest.raises(EngineStartError, match="does not exist"):
        await launch_overlapping({"bad": bad, "good": tiny_config(tiny, "off")}, engines, begun.append)
    assert begun == ["bad"] and engines == {}


async def test_a_failed_launch_stops_the_overlapping_ones_and_is_raised(tiny, tmp_path):
    """The first engine fails inside vLLM after the second began: the second's launch is stopped
    (or, had it served first, handed over to be closed), no process of it is left, and the first's
    failure (with its log) is raised."""
    bad, good = tmp_path / "broken-model", tmp_path / "good-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Nope"]}))
    shutil.copytree(tiny.target, good)
    configs = {"broken": replace(tiny_config(tiny, "off"), target=str(bad))}
    configs["good"] = replace(tiny_config(tiny, "off"), target=str(good))
    begun, engines = [], {}
    try:
        with pytest.raises(EngineStartError, match="vLLM"):
            await launch_overlapping(configs, engines, begun.append)
        assert begun == ["broken", "good"] and set(engines) <= {"good"}
    finally:
        for engine in engines.values():
            await engine.close()
    assert wait_gone(str(bad), 15) == [] and wait_gone(str(good), 15) == []


def test_a_stopped_process_refuses_to_spawn(tiny):
    """``stop`` before (or from another thread during) ``spawn``: nothing is left running."""
    proc = EngineProcess(tiny_config(tiny, "off"), resolve=Path)
    proc.prepare()
    proc.stop()
    with pytest.raises(EngineStartError, match="stopped during its start"):
        proc.spawn(timeout_s=60)
    assert not proc.is_alive()


def test_port_taken_is_explained(tiny):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = EngineProcess(tiny_config(tiny, "off"), port=port, resolve=Path)
        with pytest.raises(EngineStartError, match=f"port {port} .* already taken"):
            proc.start(timeout_s=60)


def test_a_port_taken_before_vllm_binds_it_is_chosen_again(tiny, monkeypatch):
    """Another program takes the port the launcher chose before vLLM binds it (as an engine starting
    at the same time can): vLLM starts again on another port and serves. A port the caller gave is
    never changed (``test_port_taken_is_explained``)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        first_choice = iter([taken])
        choose = launcher.free_port
        monkeypatch.setattr(launcher, "free_port", lambda: next(first_choice, None) or choose())
        progress = []
        with EngineProcess(tiny_config(tiny, "off"), resolve=Path) as proc:
            proc.start(progress.append, timeout_s=300)
            assert proc.port != taken
            assert httpx.get(f"{proc.url}/health", timeout=10).status_code == 200
            assert proc.is_alive() and proc.returncode is None  # the failed start's exit status is gone
    notes = [p.message for p in progress if p.stage == "spawn"]
    retry = f"port {taken} was taken meanwhile; starting vLLM on {proc.port}"
    assert notes == ["starting vLLM", retry, "starting vLLM"]


def test_engine_dies_with_a_killed_app(tiny, tmp_path):
    """SIGKILL the app process: its supervisor ends the whole engine group."""
    marker = tmp_path / "engine-ready"
    family = [str(p) for p in dataclasses.astuple(tiny)]  # every model, in TinyFamily order
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from engine_adapter.engine.launcher import EngineProcess
        from tests.support.fixtures import tiny_config
        from tests.support.tiny_models import TinyFamily
        fam = TinyFamily(*(Path(p) for p in {family!r}))
        proc = EngineProcess(tiny_config(fam, "off"), resolve=Path)
        proc.start(timeout_s=300)
        Path({str(marker)!r}).write_text(str(proc.pid))
        time.sleep(600)
    """)
    app = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            assert app.poll() is None, "the app died before the engine was ready"
            time.sleep(0.5)
        assert marker.exists()
        supervisor = int(marker.read_text())
        pgid = os.getpgid(supervisor)
        assert len(group_members(pgid)) >= 3  # supervisor, API server, engine core (+ worker)
        app.send_signal(signal.SIGKILL)
        app.wait()
        deadline = time.monotonic() + 30
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert group_members(pgid) == []
    finally:
        if app.poll() is None:
            app.kill()


async def test_attach_mode_against_a_separately_started_server(tiny, engines):
    cfg = tiny_config(tiny, "draft", "perturbed")
    cfg = replace(cfg, tap=False)  # a plain vLLM server: what a GPU user runs
    server = EngineProcess(cfg, resolve=Path)
    server.start(timeout_s=300)
    try:
        attached = await LiveEngine.attach(server.url, tokenizer_dir=tiny.target, k_hint=3, api_key=server.api_key)
        tapped = await engines.get("draft", "perturbed")
        try:
            for prompt in PROMPTS:
                a = await run(attached, prompt, max_tokens=40)
                t = await run(tapped, prompt, max_tokens=40)
                assert a.provenance == "counts"
                assert all(s.drafted is None for s in a.steps)  # identities unknown, not guessed
                assert a.token_ids == t.token_ids and a.text == t.text
                m = a.spec_decode_metrics
                spec = [(s.num_drafted, s.accepted) for s in a.steps if s.num_drafted]
                assert [d for d, _ in spec] == m["per_step_drafted"]
                assert [x for _, x in spec] == m["per_step_accepted"]
                # with a draft model every decode step drafts: kinds are exact
                assert a.kinds == t.kinds
                kinds = [k for s in a.steps for k in kinds_for_step(s.index, s.num_drafted, s.accepted, len(s.emitted))]
                assert kinds == a.kinds
                check_invariants(a)
        finally:
            await attached.close()
        # the same server, killed: what a tool says of an engine that died under it (the sweep's stderr)
        assert server.death_note() is None
        server.kill()
        deadline = time.monotonic() + 30
        while server.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        note = server.death_note()
        assert note is not None and note.startswith("exit status ") and str(server.log_path) in note
        assert "vllm" in note.lower(), note  # the log's last lines: vLLM's own output
    finally:
        server.stop()


def test_a_kv_cache_larger_than_memory_is_explained(tiny, monkeypatch):
    cfg = tiny_config(tiny, "off")
    cfg = replace(cfg, kv_cache_gib=4096)  # far more than this machine has
    # our pre-check (engine_adapter/resources.py) refuses before vLLM is started ...
    proc = EngineProcess(cfg, resolve=Path)
    with pytest.raises(EngineStartError, match="not enough free memory for the engine: it needs about 4097"):
        proc.start(timeout_s=300)
    assert proc.pid is None
    # ... and without it, vLLM's own refusal is explained too
    monkeypatch.setenv("SPEC_EXPLORER_SKIP_RESOURCE_CHECK", "1")
    proc = EngineProcess(cfg, resolve=Path)
    with pytest.raises(EngineStartError, match="not enough free memory for the KV cache"):
        proc.start(timeout_s=300)
    assert not proc.is_alive() and group_members(proc.pid) == []
