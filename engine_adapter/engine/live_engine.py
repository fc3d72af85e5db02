"""One handle for a live engine: started by us (with the tap) or attached to.

Contract:
    engine = await LiveEngine.launch(EngineConfig(...), progress=print)
    engine = await LiveEngine.attach("http://127.0.0.1:8000", tokenizer_dir=None)
    engine.client.generate(...)      # see engine_adapter.engine.client
    await engine.close()             # stops the process if we started it
    await launch_overlapping({"off": config_a, "live": config_b}, engines, on_start)

``launch`` runs the blocking start-up in a worker thread so an event loop (the
UI's) keeps running and can show progress. ``launch_overlapping`` starts several engines with
their vLLM start-ups overlapping on a CPU (each a few processes importing vLLM one after another,
mostly one core each): each launch begins once the one before has prepared its models and begun
vLLM, so a model conversion or the read-bandwidth measurement (``EngineProcess.prepare``, once per
machine) never shares the machine with another engine's preparation; on a GPU one after another.
Each engine joins ``engines`` as soon as it serves (the caller closes them whatever fails); the
first failure stops the launches still running and is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from engine_adapter.engine.client import EngineClient
from engine_adapter.engine.launcher import API_KEY_ENV, EngineProcess, EngineStartError, ProgressFn, StartProgress
from engine_adapter.engine.platform import detect_platform
from engine_adapter.engine.token_text import load_tokenizer, tokenizer_class
from engine_adapter.engine_config import EngineConfig

Key = TypeVar("Key", bound=Hashable)


@dataclass
class LiveEngine:
    client: EngineClient
    config: EngineConfig | None  # None when attached
    process: EngineProcess | None  # None when attached
    url: str
    vllm_version: str | None

    @property
    def attached(self) -> bool:
        return self.process is None

    @classmethod
    async def launch(
        cls,
        config: EngineConfig,
        *,
        progress: ProgressFn | None = None,
        port: int | None = None,
        resolve: Any = None,
        reserve_bytes: int = 0,
    ) -> LiveEngine:
        proc = EngineProcess(config, port=port, resolve=resolve, reserve_bytes=reserve_bytes)
        tokenizer_load, client = None, None
        try:
            await asyncio.to_thread(proc.prepare, progress)
            # the tokenizer (transformers' import included: seconds) loads while vLLM starts
            tokenizer_load = asyncio.create_task(asyncio.to_thread(load_tokenizer, proc.target_dir))
            await asyncio.to_thread(proc.spawn, progress)
            tokenizer = await tokenizer_load
            client = EngineClient(
                proc.url,
                tokenizer,
                tap_addr=proc.tap_addr,
                control_addr=proc.control_addr,
                k_hint=config.k,
                api_key=proc.api_key,
            )
            await client.start()
            version = await _server_version(proc.url)
        except BaseException as e:
            if tokenizer_load is not None and not tokenizer_load.done():
                tokenizer_load.cancel()  # its thread ends by itself; nothing waits for it
            if client is not None:  # started, then cancelled or failed before it was handed out
                with contextlib.suppress(Exception):
                    await client.close()
            proc.keep_log()
            proc.stop()
            if isinstance(e, Exception) and not isinstance(e, EngineStartError):
                raise EngineStartError(f"the engine started but did not serve: {e}. Log: {proc.log_path}") from e
            raise
        return cls(client=client, config=config, process=proc, url=proc.url, vllm_version=version)

    @classmethod
    async def attach(
        cls, url: str, *, tokenizer_dir: str | Path | None = None, k_hint: int = 0, api_key: str | None = None
    ) -> LiveEngine:
        """A server started elsewhere; its API key, if it has one: ``api_key``, else ``VLLM_API_KEY``."""
        url = url.rstrip("/")
        api_key = api_key or os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with httpx.AsyncClient(timeout=10.0, headers=headers) as http:
            try:
                r = await http.get(f"{url}/v1/models")
                r.raise_for_status()
            except httpx.HTTPError as e:
                raise EngineStartError(f"no vLLM server answers at {url}: {e}") from e
            model = r.json()["data"][0]
        source = tokenizer_dir or model.get("root") or model["id"]
        if not Path(str(source)).is_dir():
            from engine_adapter.engine.models import resolve_model

            source = await asyncio.to_thread(resolve_model, str(source))
        tokenizer = await asyncio.to_thread(load_tokenizer, source)
        client = EngineClient(url, tokenizer, tap_addr=None, model=model["id"], k_hint=k_hint, api_key=api_key)
        await client.start()
        return cls(client=client, config=None, process=None, url=url, vllm_version=await _server_version(url))

    async def close(self) -> None:
        await self.client.close()
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)


async def _server_version(url: str) -> str | None:
    async with httpx.AsyncClient(timeout=5.0) as http:
        try:
            r = await http.get(f"{url}/version")
            return r.json().get("version")
        except (httpx.HTTPError, ValueError):
            return None


async def launch_overlapping(
    configs: Mapping[Key, EngineConfig],
    engines: dict[Key, LiveEngine],
    on_start: Callable[[Key], None],
    *,
    resolve: Any = None,
) -> None:
    """Launch every config (``on_start(key)`` as each begins); each engine joins ``engines`` under
    its key as soon as it serves. On a CPU each launch begins once the one before began vLLM; on a
    GPU once it serves (an engine sizes its share of the GPU from the memory free when it starts).
    The first failure cancels the launches still running (each stops its own process) and is
    raised, with any other failure as a note; cancelled, the launches are too."""
    overlap = not detect_platform().is_gpu
    if overlap and len(configs) > 1:  # each launch loads a tokenizer in a thread: transformers imported once first
        await asyncio.to_thread(tokenizer_class)
    launches: list[asyncio.Task] = []
    try:
        for key, config in configs.items():
            on_start(key)
            await _begin_launch(key, config, engines, launches, resolve, until_served=not overlap)
            if launches[-1].done() and launches[-1].exception() is not None:
                break
        await _end_at_first_failure(launches)
    except BaseException:
        for launch in launches:
            launch.cancel()
        await asyncio.gather(*launches, return_exceptions=True)
        raise


async def _begin_launch(
    key: Key,
    config: EngineConfig,
    engines: dict[Key, LiveEngine],
    launches: list[asyncio.Task],
    resolve: Any,
    until_served: bool,
) -> None:
    """Start one launch (added to ``launches``; its engine joins ``engines``) and return once it
    began vLLM (``StartProgress`` stage "spawn", after ``EngineProcess.prepare``), or with
    ``until_served`` once it serves; either way at once if it ended."""
    loop, began_vllm = asyncio.get_running_loop(), asyncio.Event()

    def progress(p: StartProgress) -> None:
        if p.stage == "spawn":  # called from the launch's worker thread
            loop.call_soon_threadsafe(began_vllm.set)

    async def launch() -> None:
        engines[key] = await LiveEngine.launch(config, progress=progress, resolve=resolve)

    launches.append(task := asyncio.create_task(launch()))
    began = asyncio.create_task(began_vllm.wait())
    try:
        await asyncio.wait({task} if until_served else {task, began}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        began.cancel()


async def _end_at_first_failure(launches: list[asyncio.Task]) -> None:
    """Wait for every launch; at the first failure cancel the others and raise it (the others' as notes)."""
    _, running = await asyncio.wait(launches, return_when=asyncio.FIRST_EXCEPTION)
    for launch in running:
        launch.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    failures = [t.exception() for t in launches if not t.cancelled() and t.exception() is not None]
    if failures:
        for other in failures[1:]:
            failures[0].add_note(f"another engine's launch failed too: {other}")
        raise failures[0]
