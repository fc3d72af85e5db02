"""Shared fixtures (loaded by tests/conftest.py): tiny model family and real vLLM engines started on them.

Engines are session-scoped and cached per configuration: each start costs
20-40 s of CPU, so a test module asks for the configuration it needs and
shares the engine with the others.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_asyncio

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig
from tests.support.app_process import AppNotReady, engine_ready, start_app, tiny_app_args, wait_ready
from tests.support.processes import wait_gone
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


class EngineCache:
    """Starts each distinct tiny engine once per session; stops all at the end."""

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

    async def close(self) -> None:
        for e in self._engines.values():
            await e.close()
        self._engines.clear()


# module scope: a dozen idle tiny engines would crowd the 24 GiB the packaged pair needs
@pytest_asyncio.fixture(scope="module")
async def engines(tiny: TinyFamily):
    cache = EngineCache(tiny)
    yield cache
    await cache.close()


@pytest.fixture(scope="module")
def app_url(tiny, tmp_path_factory):
    app = start_app(
        # fixed K=3: the tests read K=3's drafts (the default, auto, may choose K=0 on tiny models)
        tiny_app_args(tiny.target, tiny.perturbed, "--k", "3", "--policy", "fixed"),
        tmp_path_factory.mktemp("app") / "app.log",
    )
    try:
        try:
            wait_ready(app, engine_ready, timeout_s=300)
        except AppNotReady as e:
            pytest.fail(f"the app's engine never became ready: {e}")
        yield app.url
    finally:
        if not app.stop(timeout_s=60):
            pytest.fail("the app did not exit within 60 s of Ctrl-C (SIGINT)")
        assert wait_gone(str(tiny.perturbed), 30) == [], "the engine outlived the app"
