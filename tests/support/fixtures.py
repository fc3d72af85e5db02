"""Shared fixtures (loaded by tests/conftest.py): tiny model family and real vLLM engines started on them.

A start costs about a minute of CPU on 2 cores (each of vLLM's three processes
imports it for 15-20 s), so starts are shared:

- ``engines``: tiny engines cached per configuration. The cache lives for the session;
  at the end of each module it keeps only ``KEPT_ENGINES`` (the configurations later
  modules ask for again) and stops the rest, and after the last module that uses it, all:
  an idle engine takes memory the packaged pair needs (``no_cached_engines`` stops them all
  for it) and CPU from the tests that follow.
- ``app_url``: one launched app (tiny models, fixed K=3) for the UI modules; each module
  starts from the app's defaults (fixed K=3, the draft-model method; no background load
  is left by a closed page); it stops after the last module that uses it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_asyncio
from gradio_client import Client

from engine_adapter.engine.live_engine import LiveEngine, launch_overlapping
from engine_adapter.engine_config import EngineConfig
from tests.support.app_process import AppNotReady, engine_ready, start_app, tiny_app_args, wait_ready
from tests.support.processes import descendants, describe, wait_ended
from tests.support.tiny_models import TinyFamily, build_tiny_family


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyFamily:
    return build_tiny_family(tmp_path_factory.mktemp("tiny-models"))


def tiny_config(tiny: TinyFamily, method: str, draft: str = "same", k: int = 3, **kw) -> EngineConfig:
    return EngineConfig(
        method=method,
        k=k,
        target=str(tiny.target),
        draft=str(getattr(tiny, draft)),
        dtype="float32",
        max_model_len=1024,
        kv_cache_gib=1,
        max_num_seqs=32,
        **kw,
    )


# (method, draft, k) asked for in several modules
KEPT_ENGINES = frozenset({("off", "same", 3), ("draft", "perturbed", 3)})


class EngineCache:
    """Starts each distinct tiny engine once; ``close(keep)`` stops the others."""

    def __init__(self, tiny: TinyFamily) -> None:
        self.tiny = tiny
        self._engines: dict[tuple, LiveEngine] = {}
        self._lock = asyncio.Lock()

    async def get(self, method: str, draft: str = "same", k: int = 3) -> LiveEngine:
        key = (method, draft, k)
        async with self._lock:
            if key not in self._engines:
                cfg = tiny_config(self.tiny, method, draft, k)
                self._engines[key] = await LiveEngine.launch(cfg, resolve=Path)
            return self._engines[key]

    async def start(self, keys: list[tuple[str, str, int]]) -> None:
        """Start the engines of ``keys`` (method, draft, k) not started yet, their vLLM start-ups
        overlapping (``launch_overlapping``): for a module that uses them all anyway."""
        async with self._lock:
            configs = {key: tiny_config(self.tiny, *key) for key in keys if key not in self._engines}
            await launch_overlapping(configs, self._engines, lambda key: None, resolve=Path)  # as ``get`` launches

    async def close(self, keep: frozenset[tuple] = frozenset()) -> None:
        async with self._lock:
            for key in [key for key in self._engines if key not in keep]:
                await self._engines.pop(key).close()


@pytest_asyncio.fixture(scope="session")
async def engine_cache(tiny: TinyFamily):
    cache = EngineCache(tiny)
    yield cache
    await cache.close()


@pytest_asyncio.fixture(scope="module")
async def engines(engine_cache: EngineCache, request: pytest.FixtureRequest):
    yield engine_cache
    last = request.module is last_module_using(request.session, "engines")
    await engine_cache.close(keep=frozenset() if last else KEPT_ENGINES)  # none idles after its last user


@pytest_asyncio.fixture(scope="module")
async def no_cached_engines(engine_cache: EngineCache):
    """For a module that needs the machine's memory (the packaged pair): no tiny engine idles."""
    await engine_cache.close()


class SharedApp:
    """The launched app the UI modules share; ``stop`` is idempotent and checks nothing outlives it."""

    def __init__(self, tiny: TinyFamily, log: Path) -> None:
        # fixed K=3: the tests read K=3's drafts (the default, auto, may choose K=0 on tiny models)
        self._app = start_app(tiny_app_args(tiny.target, tiny.perturbed, "--k", "3", "--policy", "fixed"), log)
        self.url = self._app.url
        self.stopped = False

    @property
    def pid(self) -> int:
        """The app's process."""
        return self._app.proc.pid

    def wait_ready(self) -> None:
        try:
            wait_ready(self._app, engine_ready, timeout_s=300)
        except AppNotReady as e:
            pytest.fail(f"the app's engine never became ready: {e}")

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        engines = descendants(self._app.proc.pid)
        if not self._app.stop(timeout_s=60):
            pytest.fail("the app did not exit within 60 s of Ctrl-C (SIGINT)")
        left = wait_ended(engines, 30)
        assert left == [], f"the engine outlived the app: {describe(left)}"


def last_module_using(session: pytest.Session, fixture: str):
    """The module of the last collected test that uses ``fixture`` (directly or through another)."""
    users = [item.module for item in session.items if fixture in getattr(item, "fixturenames", ())]
    return users[-1] if users else None


@pytest.fixture(scope="session")
def shared_app(tiny, tmp_path_factory):
    app = SharedApp(tiny, tmp_path_factory.mktemp("app") / "app.log")
    try:
        app.wait_ready()
        yield app
    finally:
        app.stop()


@pytest.fixture(scope="module")
def app_url(shared_app: SharedApp, request: pytest.FixtureRequest):
    """The shared app, with its start policy in force again (a module before may have set another).
    Stopped after the last module that uses it: an idle app and engine would take CPU from the
    tests that follow."""
    client = Client(shared_app.url, verbose=False)
    status = client.predict(api_name="/status")
    assert engine_ready(status) and "method **draft**" in status, f"a module before left the shared app so: {status}"
    table = {"headers": ["start_bs", "end_bs", "K"], "data": [[1, 1, 1]]}
    said = client.predict("fixed", 3, table, api_name="/set_policy")
    assert "Sent to the engine" in said, said
    yield shared_app.url
    if request.module is last_module_using(request.session, "app_url"):
        shared_app.stop()
