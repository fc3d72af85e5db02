"""Shared fixtures: tiny model family and real vLLM engines started on them.

Engines are session-scoped and cached per configuration: each start costs
20-40 s of CPU, so a test module asks for the configuration it needs and
shares the engine with the others.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from gradio_client import Client

from engine_adapter.launcher import free_port

from engine_adapter.engine import LiveEngine
from engine_adapter.engine_config import EngineConfig
from tests.support.tiny_models import TinyFamily, build_tiny_family


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: needs real model weights or minutes of CPU")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyFamily:
    return build_tiny_family(tmp_path_factory.mktemp("tiny-models"))


def tiny_config(tiny: TinyFamily, method: str, draft: str = "same", k: int = 3, **kw) -> EngineConfig:
    return EngineConfig(
        method=method, k=k, target=str(tiny.target), draft=str(getattr(tiny, draft)),
        dtype="float32", max_model_len=1024, kv_cache_gib=1, max_num_seqs=32, **kw,
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


ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def app_url(tiny, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("app") / "app.log"
    cmd = [sys.executable, "app.py", "--port", str(port), "--method", "draft", "--k", "3",
           "--target", str(tiny.target), "--draft", str(tiny.perturbed), "--dtype", "float32",
           "--max-model-len", "1024", "--kv-cache-gib", "1"]
    with log.open("wb") as out:
        app = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        client = None
        while time.monotonic() < deadline:
            assert app.poll() is None, log.read_text()[-3000:]
            try:
                if client is None and httpx.get(url, timeout=2).status_code == 200:
                    client = Client(url, verbose=False)
                status = client.predict(api_name="/status") if client is not None else ""
                # ready, and done measuring the cost model (profiling switches K under the requests)
                if "● **Engine ready**" in status and "Measuring the cost model" not in status:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        else:
            pytest.fail("the app's engine never became ready:\n" + log.read_text()[-3000:])
        yield url
    finally:
        app.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            app.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(app.pid, signal.SIGKILL)
            pytest.fail("the app did not exit within 60 s of Ctrl-C (SIGINT)")
        from tests.test_launcher import wait_gone

        assert wait_gone(str(tiny.perturbed), 30) == [], "the engine outlived the app"


