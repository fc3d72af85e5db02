"""The check of a quantised copy: its greedy text on the preset prompts against its full model's.

Contract: ``check_copy(full_dir, scheme, presets, max_tokens, cache_dir, base)`` makes (or
reuses) the ``scheme`` copy of the checkpoint ``full_dir`` (``engine.variants.quantised_checkpoint``),
runs speculation-off engines on the full model and on the copy (``base`` gives their dtype and
KV cache; on a CPU started at once, their vLLM start-ups overlapping, where the two fit in memory
together, ``resources.fits_together``, else one after the other), each answering every preset with greedy decoding
(``max_tokens`` tokens, all presets in flight at once, so both engines see the same batches),
and returns a ``CopyCheck``: per preset the token agreement (``provenance.text_agreement``: the
share of the longer text the aligned texts share), whether the texts are identical, and where
they first differ. The check is written beside the copy (``CHECK_FILE``, one entry per
max_tokens). Speculation plays no part: its lossless guarantee is checked elsewhere, against
the same target.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from engine_adapter.engine.client import RequestResult
from engine_adapter.engine.live_engine import LiveEngine, launch_overlapping
from engine_adapter.engine.platform import detect_platform
from engine_adapter.engine.resources import fits_together
from engine_adapter.engine.variants import quantised_checkpoint
from engine_adapter.engine_config import EngineConfig, resolve_dtype
from engine_adapter.prompts import Preset
from engine_adapter.provenance import text_agreement

CHECK_FILE = "check.json"


@dataclass(frozen=True)
class PresetCheck:
    label: str  # "category: title"
    agreement: float  # text_agreement of the copy's greedy ids with the full model's
    identical: bool
    first_difference: int | None  # index of the first differing token, None when identical
    tokens: int  # tokens the full model produced


@dataclass(frozen=True)
class CopyCheck:
    model: str  # the full checkpoint's folder name
    scheme: str
    max_tokens: int
    dtype: str
    presets: list[PresetCheck] = field(default_factory=list)

    @property
    def mean_agreement(self) -> float:
        return sum(p.agreement for p in self.presets) / len(self.presets) if self.presets else 0.0

    @property
    def identical_share(self) -> float:
        return sum(p.identical for p in self.presets) / len(self.presets) if self.presets else 0.0


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length if one is a prefix)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def off_config(model_dir: Path, base: EngineConfig) -> EngineConfig:
    """A speculation-off engine on ``model_dir`` with ``base``'s dtype and KV cache."""
    return replace(base, method="off", target=str(model_dir), draft=str(model_dir), k_table=None).checked()


async def greedy_ids(model_dir: Path, presets: list[Preset], max_tokens: int, base: EngineConfig) -> list[list[int]]:
    """Each preset's greedy token ids from a speculation-off engine on ``model_dir``."""
    engine = await LiveEngine.launch(off_config(model_dir, base))
    try:
        return await _answers(engine, presets, max_tokens)
    finally:
        await engine.close()


async def greedy_ids_at_once(
    model_dirs: tuple[Path, Path], presets: list[Preset], max_tokens: int, base: EngineConfig
) -> tuple[list[list[int]], list[list[int]]]:
    """``greedy_ids`` of both models from two engines started at once (the caller checked that
    they fit in memory together); each engine answers every preset as ``greedy_ids``' does."""
    configs = {d: off_config(d, base) for d in model_dirs}
    engines: dict[Path, LiveEngine] = {}
    try:
        await launch_overlapping(configs, engines, lambda d: print(f"== {d.name}: starting", file=sys.stderr))
        answering = [asyncio.ensure_future(_answers(engines[d], presets, max_tokens)) for d in model_dirs]
        try:
            first, second = await asyncio.gather(*answering)
        except BaseException:
            for task in answering:  # one failed: the other's requests end too
                task.cancel()
            await asyncio.gather(*answering, return_exceptions=True)
            raise
        return first, second
    finally:
        await _close_all(engines)


async def _close_all(engines: dict[Path, LiveEngine]) -> None:
    """Close every engine, whichever close fails (the first failure raised after all)."""
    results = await asyncio.gather(*(engine.close() for engine in engines.values()), return_exceptions=True)
    if failed := [r for r in results if isinstance(r, BaseException)]:
        raise failed[0]


def _why_one_after_the_other(configs: list[EngineConfig]) -> str | None:
    """None where the engines can run at once: on a CPU when they fit in host memory together (on a
    GPU each engine sizes its share from the memory free at its start, so one runs at a time)."""
    if detect_platform().is_gpu:
        return "a GPU: each engine takes its share of the GPU's memory"
    return fits_together(configs)


async def _answers(engine: LiveEngine, presets: list[Preset], max_tokens: int) -> list[list[int]]:
    return list(await asyncio.gather(*(_answer(engine, p.prompt, max_tokens) for p in presets)))


async def _answer(engine: LiveEngine, prompt: str, max_tokens: int) -> list[int]:
    result = None
    async for item in engine.client.generate(prompt, max_tokens=max_tokens, temperature=0.0):
        result = item
    if not isinstance(result, RequestResult):
        raise RuntimeError("the engine ended a request without its result")
    return list(result.token_ids)


async def check_copy(
    full_dir: Path, scheme: str, presets: list[Preset], max_tokens: int, cache_dir: Path, base: EngineConfig
) -> CopyCheck:
    copy_dir = quantised_checkpoint(full_dir, cache_dir, scheme)
    why_apart = _why_one_after_the_other([off_config(Path(full_dir), base), off_config(copy_dir, base)])
    if why_apart is None:
        print(f"== {Path(full_dir).name} and its {scheme} copy: both engines at once", file=sys.stderr)
        full, quant = await greedy_ids_at_once((Path(full_dir), copy_dir), presets, max_tokens, base)
    else:
        print(f"== one engine after the other ({why_apart})", file=sys.stderr)
        print(f"== {Path(full_dir).name}: the full model's greedy text", file=sys.stderr)
        full = await greedy_ids(Path(full_dir), presets, max_tokens, base)
        print(f"== {copy_dir.name}: the {scheme} copy's", file=sys.stderr)
        quant = await greedy_ids(copy_dir, presets, max_tokens, base)
    dtype = resolve_dtype(base.dtype)
    rows = [
        PresetCheck(p.label, round(text_agreement(q, f), 4), q == f, first_difference(q, f), len(f))
        for p, f, q in zip(presets, full, quant)
    ]
    check = CopyCheck(Path(full_dir).name, scheme, max_tokens, dtype, rows)
    _keep(copy_dir, check)
    return check


def _keep(copy_dir: Path, check: CopyCheck) -> None:
    path = copy_dir / CHECK_FILE
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    kept[str(check.max_tokens)] = asdict(check) | {"mean_agreement": check.mean_agreement}
    path.write_text(json.dumps(kept, indent=1) + "\n")
