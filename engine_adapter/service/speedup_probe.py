"""The speedup at this load, measured on the running engine: plain decoding against the policy in
force, on the same prompts, while the background load keeps running.

Contract: ``SpeedupProbe()``; ``view()`` is where it stands (``SpeedupView``: idle, running with
its progress and expected end, done with its table, failed with why); ``start(engine, policy,
prompts, settings, repeats, max_tokens)`` marks it running and returns the coroutine to run on
the service loop (``ProbeEngine``: the engine's client and live policy); ``begin(runs,
settings)`` only marks it running; on the service loop,
``await run(generate, switch, policy, prompts, repeats, max_tokens)`` measures: for
each repeat, for each prompt (one per task kind), both modes one after the other (plain first
on even repeats, the policy first on odd ones: neither always runs first), each a request of
``max_tokens`` greedy tokens whose decode rate is read from its own stream (tokens after the
first, over the time after the first). ``switch(spec)`` puts a K policy in force and returns
once the engine runs it. Plain decoding is this engine at K=0 for everyone (the drafter idles),
not an engine started with speculation off: its load is the one being looked at. The policy in
force is restored at the end, also after a failure (not when the engine went away).
``SpeedupView.rows`` gives per task kind the median speedup (the policy's decode rate over
plain's, repeat by repeat), the spread, the repeats; ``csv()`` and ``markdown()`` write them
with the settings line (``speed_settings``: the hardware, dtype, model pair, method, policy,
load and date of a figure measured now).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from engine_adapter.engine.platform import Platform
from engine_adapter.engine_config import FULL_VARIANT, EngineConfig, resolve_dtype
from engine_adapter.policy.controller import PolicySpec, PolicyState
from engine_adapter.prompts import Preset
from engine_adapter.records import RequestResult

PLAIN = PolicySpec("off")
MAX_REPEATS = 5
MAX_PROBE_TOKENS = 256


@dataclass(frozen=True)
class SpeedSettings:
    """The three hidden arguments of a speed figure, and the rest of what it depends on."""

    hardware: str  # CPU model and cores, or the GPU
    dtype: str
    models: str  # "target / draft", or the method's name for model-free drafting
    method: str
    policy: str
    concurrency: int  # background requests in flight when measured
    date: str  # YYYY-MM-DD
    variant: str = FULL_VARIANT  # engine_config.MODEL_VARIANTS: the pair as it is, or quantised copies

    def _variant_note(self) -> str:
        return "" if self.variant == FULL_VARIANT else f" ({self.variant})"

    def line(self) -> str:
        return (
            f"{self.hardware}, {self.dtype}; {self.models}{self._variant_note()}; "
            f"method {self.method}, policy {self.policy}; "
            f"{self.concurrency} background request{'s' if self.concurrency != 1 else ''}; {self.date}"
        )


@dataclass(frozen=True)
class SpeedupRow:
    task: str
    speedup: float  # median over the repeats of (policy's decode rate / plain's)
    speedup_min: float
    speedup_max: float
    repeats: int
    plain_tokens_per_s: float  # median decode rate under plain decoding
    policy_tokens_per_s: float


@dataclass(frozen=True)
class SpeedupView:
    state: Literal["idle", "running", "done", "failed"] = "idle"
    done_runs: int = 0
    total_runs: int = 0
    expected_end_s: float | None = None  # seconds from now to the end, from the runs so far
    message: str = ""
    rows: tuple[SpeedupRow, ...] = ()
    settings: SpeedSettings | None = None
    # per task kind, plain decoding's greedy token ids in the first repeat (the lens compares variants' texts)
    plain_token_ids: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def csv(self) -> str:
        head = "task,speedup,speedup_min,speedup_max,repeats,plain_tokens_per_s,policy_tokens_per_s,settings"
        settings = (self.settings.line() if self.settings else "").replace('"', "'")
        lines = [
            f"{r.task},{r.speedup:.3f},{r.speedup_min:.3f},{r.speedup_max:.3f},{r.repeats},"
            f'{r.plain_tokens_per_s:.3f},{r.policy_tokens_per_s:.3f},"{settings}"'
            for r in self.rows
        ]
        return "\n".join([head, *lines]) + "\n"

    def markdown(self) -> str:
        lines = [
            "| task | speedup | spread | repeats | plain tokens/s | policy tokens/s |",
            "|---|---:|---|---:|---:|---:|",
            *(
                f"| {r.task} | {r.speedup:.2f}x | {r.speedup_min:.2f}-{r.speedup_max:.2f}x | {r.repeats} "
                f"| {r.plain_tokens_per_s:.2f} | {r.policy_tokens_per_s:.2f} |"
                for r in self.rows
            ),
        ]
        if self.settings is not None:
            lines.append(f"\nMeasured on {self.settings.line()}.")
        return "\n".join(lines)


def check_probe_args(repeats: int, max_tokens: int) -> None:
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be between 1 and {MAX_REPEATS}; got {repeats}")
    if not 8 <= max_tokens <= MAX_PROBE_TOKENS:
        raise ValueError(f"tokens per request must be between 8 and {MAX_PROBE_TOKENS}; got {max_tokens}")


def probe_prompts(presets: Sequence[Preset]) -> list[Preset]:
    """The first preset of each task kind, in their order."""
    firsts: dict[str, Preset] = {}
    for p in presets:
        if p.category:
            firsts.setdefault(p.category, p)
    if not firsts:
        raise RuntimeError("no preset prompts with a task kind to measure with")
    return list(firsts.values())


def speed_settings(
    config: EngineConfig | None, platform: Platform | None, policy: PolicySpec, concurrency: int
) -> SpeedSettings:
    """The settings line for a figure measured now (model names only: no server path)."""
    cfg = config or EngineConfig()
    hardware = platform.device_name if platform is not None else "an attached server"
    if platform is not None and not platform.is_gpu:
        hardware += f", {os.cpu_count()} cores"
    drafter = Path(cfg.draft).name if cfg.method == "draft" else cfg.method
    return SpeedSettings(
        hardware=hardware,
        dtype=resolve_dtype(cfg.dtype, on_cpu=platform is None or not platform.is_gpu),
        models=f"{Path(cfg.target).name} / {drafter}",
        method=cfg.method,
        policy=policy.describe(),
        concurrency=concurrency,
        date=time.strftime("%Y-%m-%d"),
        variant=cfg.variant,
    )


def decode_rate(result: RequestResult) -> float:
    """Tokens after the first over the time after the first (0 if it made fewer than two)."""
    if result.t_first_token is None or len(result.token_ids) < 2 or result.t_end <= result.t_first_token:
        return 0.0
    return (len(result.token_ids) - 1) / (result.t_end - result.t_first_token)


def speedup_rows(rates: dict[str, list[tuple[float, float]]]) -> tuple[SpeedupRow, ...]:
    """Per task: (plain, policy) decode rates of each repeat -> its row (repeats with a 0 left out)."""
    rows = []
    for task, pairs in rates.items():
        kept = [(p, s) for p, s in pairs if p > 0 and s > 0]
        if not kept:
            continue
        ratios = [s / p for p, s in kept]
        rows.append(
            SpeedupRow(
                task=task,
                speedup=statistics.median(ratios),
                speedup_min=min(ratios),
                speedup_max=max(ratios),
                repeats=len(kept),
                plain_tokens_per_s=statistics.median(p for p, _ in kept),
                policy_tokens_per_s=statistics.median(s for _, s in kept),
            )
        )
    return tuple(rows)


@dataclass(frozen=True)
class ProbeEngine:
    """What the measurement needs of the running engine: its client, whether it is still the
    engine the measurement began on, the live policy's ``apply`` and the history's
    ``acknowledged`` (an applied policy is in force once a step ran under its command)."""

    client: Any  # engine_adapter.engine.client.EngineClient
    still_running: Callable[[], bool]
    apply: Callable[[PolicySpec], Awaitable[PolicyState | None]]
    acknowledged: Callable[[int], Awaitable[None]]

    async def generate(self, prompt: str, max_tokens: int) -> RequestResult:
        """One greedy request; its result."""
        self._check()
        async for item in self.client.generate(prompt, max_tokens=max_tokens, temperature=0.0):
            if isinstance(item, RequestResult):
                return item
        raise RuntimeError("the request ended without a result")

    async def switch(self, spec: PolicySpec) -> None:
        """``spec`` in force, once a step ran under it."""
        self._check()
        state = await self.apply(spec)
        if state is None:
            raise RuntimeError("the cost model is being measured: the measurement stopped")
        await self.acknowledged(state.control)

    def _check(self) -> None:
        if not self.still_running():
            raise RuntimeError("the engine restarted during the measurement")


@dataclass
class SpeedupProbe:
    _view: SpeedupView = field(default_factory=SpeedupView)

    def view(self) -> SpeedupView:
        return self._view

    @property
    def running(self) -> bool:
        return self._view.state == "running"

    def start(
        self,
        engine: ProbeEngine,
        policy: PolicySpec,
        prompts: Sequence[Preset],
        settings: SpeedSettings,
        repeats: int,
        max_tokens: int,
    ) -> Coroutine[Any, Any, None]:
        """Mark it running and return the measurement to run on the service loop (a policy that
        drafts nothing is refused)."""
        if policy.kind == PLAIN.kind:
            raise RuntimeError("the policy in force drafts nothing: put a policy that drafts in force first")
        self.begin(2 * repeats * len(prompts), settings)
        return self.run(engine.generate, engine.switch, policy, prompts, repeats, max_tokens)

    def begin(self, total_runs: int, settings: SpeedSettings) -> None:
        """Mark it running (before the task starts, so a second ask is refused at once)."""
        if self.running:
            raise RuntimeError("a speed measurement is running already")
        self._view = SpeedupView("running", 0, total_runs, None, "starting", (), settings)

    async def run(
        self,
        generate: Callable[[str, int], Awaitable[RequestResult]],
        switch: Callable[[PolicySpec], Awaitable[None]],
        policy: PolicySpec,
        prompts: Sequence[Preset],
        repeats: int,
        max_tokens: int,
    ) -> None:
        rates: dict[str, list[tuple[float, float]]] = {p.category or p.title: [] for p in prompts}
        t0 = time.monotonic()
        try:
            for rep in range(repeats):
                for preset in prompts:
                    pair = {}
                    for spec in (PLAIN, policy) if rep % 2 == 0 else (policy, PLAIN):
                        await switch(spec)
                        self._progress(f"repeat {rep + 1} of {repeats}: {preset.category}, {spec.describe()}", t0)
                        result = await generate(preset.prompt, max_tokens)
                        pair[spec.kind] = decode_rate(result)
                        self._view = replace(self._view, done_runs=self._view.done_runs + 1)
                        if spec is PLAIN and rep == 0:
                            texts = (*self._view.plain_token_ids, (preset.category, tuple(result.token_ids)))
                            self._view = replace(self._view, plain_token_ids=texts)
                    rates[preset.category or preset.title].append((pair[PLAIN.kind], pair[policy.kind]))
                    self._view = replace(self._view, rows=speedup_rows(rates))
        except asyncio.CancelledError:  # the engine stopped or restarted: nothing to restore
            self._end("failed", "stopped: the engine stopped or restarted")
            raise
        except Exception as e:  # said on the page
            self._end("failed", str(e) or repr(e))
        else:
            self._end("done", "done")
        await self._restore(switch, policy)

    def _end(self, state: Literal["done", "failed"], message: str) -> None:
        self._view = replace(self._view, state=state, expected_end_s=None, message=message)

    async def _restore(self, switch: Callable[[PolicySpec], Awaitable[None]], policy: PolicySpec) -> None:
        try:
            await switch(policy)
        except Exception as e:
            self._view = replace(self._view, message=f"{self._view.message}; restoring {policy.describe()} failed: {e}")

    def _progress(self, message: str, t0: float) -> None:
        v = self._view
        per_run = (time.monotonic() - t0) / v.done_runs if v.done_runs else None
        left = per_run * (v.total_runs - v.done_runs) if per_run is not None else None
        self._view = replace(v, message=message, expected_end_s=left)
