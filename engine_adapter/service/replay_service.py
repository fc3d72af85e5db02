"""Replay a recorded session (``trace/format.py``) in place of a live engine.

Contract: ``ReplayService(path, speed=1.0)`` is a ``Backend`` (``service/backend.py``,
``capabilities = REPLAY``) and plays the trace's clock at
``speed`` times real time from the moment it is made, looping at the end:

- ``steps_since(t)``: the recorded engine steps of the last ``now - t``
  recorded seconds, their ``t`` moved so that "now" is the replay's position
  (the live charts' time axis stays in recorded seconds at any speed);
- ``load_changes``, ``background_stats()``, ``background_tokens_per_second()``:
  the recorded background load at the replay's position;
- ``stream(prompt, ...)``: plays a recorded foreground request step by step
  with its recorded timing (divided by ``speed``): the one whose prompt equals
  ``prompt`` if any, else the next one in recorded order (``replay_prompt``
  says which it will be); it has no speculation-off twin (``reference`` is None);
- ``start()``/``attach()``/``restart()``/``set_background()`` change nothing
  and leave a note in ``replay_info``; ``prom_history()`` is empty.
- ``replay_info``: where the replay stands: file, recorded config, speed,
  position and length, loop count, last note; ``recorded_requests()``: the
  recorded foreground requests, in order. ``recording`` (``backend.Recording``)
  offers the three to the page.

No engine, no tokenizer, no network: everything comes from the file. Time comes from
``clock`` (seconds, ``time.monotonic`` by default) and a played request waits with ``sleep``
(``asyncio.sleep``); tests pass their own.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from engine_adapter.engine_config import FULL_VARIANT, EngineConfig
from engine_adapter.records import EngineStep, RequestResult, Step
from engine_adapter.service.backend import (
    REPLAY,
    BackgroundShare,
    LoadMix,
    Recording,
    ReferenceTwin,
    ReplayInfo,
    RestartTicket,
    ServiceStatus,
    Visitor,
)
from engine_adapter.service.fair_share import MAX_BACKGROUND
from engine_adapter.service.load import LoadStats
from engine_adapter.service.quant_lens import LensView
from engine_adapter.service.speedup_probe import SpeedSettings, SpeedupView
from engine_adapter.trace.format import SessionTrace, read_session

HISTORY_S = 600.0  # how far back steps_since / load_changes look, in recorded seconds
NOTE_S = 15.0  # how long a refusal note stays in replay_info


def _config_from_header(header: dict[str, Any]) -> EngineConfig | None:
    cfg = header.get("config") or {}
    names = {f.name for f in fields(EngineConfig)}
    kw = {k: v for k, v in cfg.items() if k in names}
    if not kw:
        kw = {
            k: header[k]
            for k in ("method", "k", "k_table", "target", "draft", "dtype")
            if header.get(k) is not None and k in names
        }
    if kw.get("method") == "attach":
        return None
    if kw.get("k_table") is not None:
        kw["k_table"] = [tuple(r) for r in kw["k_table"]]
    try:
        return EngineConfig(**kw)
    except TypeError:
        return None


class ReplayService:
    """The replay ``Backend``: a recorded session's clock, steps, load and requests."""

    capabilities = REPLAY

    def __init__(
        self,
        path: str | Path,
        *,
        speed: float = 1.0,
        loop: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not speed > 0:
            raise ValueError(f"replay speed must be > 0; got {speed}")
        self.path = Path(path)
        self.trace: SessionTrace = read_session(self.path)
        if not self.trace.steps and not self.trace.requests:
            raise ValueError(f"{self.path}: the trace holds no engine steps and no requests to replay")
        self.speed = float(speed)
        self.loop = loop
        self._clock = clock
        self._sleep = sleep  # a played request's waits between its steps
        self.duration_s = max(self.trace.duration_s, 1e-3)
        self._step_t = [s.t for s in self.trace.steps]
        self._config = _config_from_header(self.trace.header)
        self._cursor = 0  # next recorded foreground request for Run
        self._note: tuple[float, str] | None = None
        self._closed = False
        self.max_background = max([n for _, n in self.trace.loads] + [0])
        self.on_result: list[Callable[[RequestResult], None]] = []  # as EngineService (never called)
        self.reference: ReferenceTwin | None = None  # no engine: no speculation-off twin
        self.recording = Recording(
            info=lambda: self.replay_info, prompt_for=self.replay_prompt, requests=self.recorded_requests
        )
        self._origin = clock()

    # --- the replay's clock ---------------------------------------------------
    def played_s(self, now: float | None = None) -> float:
        """Recorded seconds played since the start (grows across loops)."""
        played = ((self._clock() if now is None else now) - self._origin) * self.speed
        return played if self.loop else min(played, self.duration_s)

    def position_s(self, now: float | None = None) -> float:
        played = self.played_s(now)
        if not self.loop:
            return played
        return played % self.duration_s

    def _windows(self, played: float, lookback: float):
        """(loop base, trace-time lo, trace-time hi) covering played-time (played - lookback, played]."""
        lo = max(played - min(lookback, HISTORY_S), 0.0 if not self.loop else -math.inf)
        d = self.duration_s
        first = max(0, math.floor(max(lo, 0.0) / d)) if self.loop else 0
        last = math.floor(played / d) if self.loop else 0
        for c in range(first, last + 1):
            base = c * d if self.loop else 0.0
            yield base, lo - base, played - base

    @property
    def replay_info(self) -> ReplayInfo:
        played = self.played_s()
        pos = self.position_s()
        note = self._note[1] if self._note and self._clock() - self._note[0] < NOTE_S else None
        if self.trace.cut_line is not None:  # said for as long as the replay runs, never silently dropped
            cut = f"the trace's last line ({self.trace.cut_line}) was cut off (the app was stopped) and skipped"
            note = f"{note} {cut}." if note else f"{cut[0].upper()}{cut[1:]}."
        return ReplayInfo(
            path=str(self.path),
            speed=self.speed,
            duration_s=self.duration_s,
            position_s=pos,
            loop=int(played // self.duration_s) if self.loop else 0,
            header=self.trace.header,
            num_steps=len(self.trace.steps),
            num_requests=len(self.trace.requests),
            load=self._load_at(pos),
            note=note,
        )

    def _say(self, message: str) -> None:
        self._note = (self._clock(), message)

    # --- EngineService's surface ---------------------------------------------
    def status(self) -> ServiceStatus:
        state = "stopped" if self._closed else "ready"
        return ServiceStatus(
            state=state,
            progress=None,
            error=None,
            config=self._config,
            url=f"replay:{self.path.name}",
            attached=False,
            generation=1,
        )

    def start(self, config: EngineConfig | None = None) -> Future:
        self._say(
            "This is a replay of a recorded session: engine settings cannot change it. "
            "Start `python app.py` (without --replay) for a live engine."
        )
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def attach(self, url: str | None = None, tokenizer_dir: str | None = None, k_hint: int = 0) -> Future:
        return self.start()

    async def restart(self, config: EngineConfig | None = None) -> None:
        self.start()

    async def request_restart(self, config: EngineConfig | None = None) -> RestartTicket:
        raise RuntimeError(
            "this is a replay of a recorded session: engine settings cannot change it. "
            "Start `python app.py` (without --replay) for a live engine."
        )

    def close(self) -> None:
        self._closed = True

    def steps_since(self, t: float) -> list[EngineStep]:
        now = self._clock()
        played = self.played_s(now)
        out: list[EngineStep] = []
        for base, lo, hi in self._windows(played, now - t):
            i = bisect.bisect_right(self._step_t, lo)
            j = bisect.bisect_right(self._step_t, hi)
            for s in self.trace.steps[i:j]:
                out.append(replace(s, t=now - (played - (base + s.t))))
        return out

    def prom_history(self) -> list:
        return []

    @property
    def load_changes(self) -> list[tuple[float, int]]:
        now = self._clock()
        played = self.played_s(now)
        out = []
        for base, lo, hi in self._windows(played, HISTORY_S):
            out += [(now - (played - (base + t)), n) for t, n in self.trace.loads if lo < t <= hi]
        return out

    def _load_at(self, pos: float) -> int:
        i = bisect.bisect_right([t for t, _ in self.trace.loads], pos)
        return self.trace.loads[i - 1][1] if i else 0

    def _background_at(self, pos: float) -> dict[str, Any] | None:
        bgs = self.trace.backgrounds
        i = bisect.bisect_right([b["t"] for b in bgs], pos)
        return bgs[i - 1] if i else None

    async def set_background(self, n: int, visitor: Visitor | None = None) -> int:
        pos = self.position_s()
        self._say(
            "This is a replay: the background load is the recorded one "
            f"({self._load_at(pos)} requests at this point); the slider cannot change it."
        )
        return self._load_at(pos)

    def background_stats(self) -> LoadStats | None:
        pos = self.position_s()
        b = self._background_at(pos)
        load = self._load_at(pos)
        if b is None:
            return LoadStats(load, 0, 0, 0, 0, None) if load else None
        return LoadStats(b["target"], b["in_flight"], b["completed"], b["failed"], b.get("tokens", 0), None)

    def background_share(self, session: str) -> BackgroundShare:
        """The recorded load, as if one session had asked for it (a replay has no sessions)."""
        load = self._load_at(self.position_s())
        return BackgroundShare(asked=0, granted=0, total=load, sessions=0, cap=max(load, MAX_BACKGROUND))

    def release_background(self, session: str) -> None:
        pass  # nothing runs in a replay

    def touch_session(self, session: str) -> None:
        pass

    def background_tokens_per_second(self, window_s: float = 10.0) -> float:
        b = self._background_at(self.position_s())
        return float(b["tokens_per_s"]) if b else 0.0

    def load_mix(self) -> LoadMix:
        return LoadMix((), ())

    def speed_settings(self) -> SpeedSettings | None:
        """The recorded engine's settings; the hardware and the date are the recording's."""
        h = self.trace.header
        cfg = h.get("config") or {}
        draft = Path(str(cfg.get("draft") or "")).name if h.get("method") == "draft" else str(h.get("method"))
        return SpeedSettings(
            hardware="recorded (the recording's machine)",
            dtype=str(h.get("dtype") or cfg.get("dtype") or "?"),
            models=f"{Path(str(cfg.get('target') or h.get('target') or '?')).name} / {draft}",
            method=str(h.get("method") or "?"),
            policy="as recorded",
            concurrency=self._load_at(self.position_s()),
            date=str(h.get("started_at") or "?")[:10],
        )

    def speedup_view(self) -> SpeedupView:
        return SpeedupView(message="a replay measures nothing: it plays a recorded session")

    async def measure_speedup(self, repeats: int = 2, max_tokens: int = 64) -> SpeedupView:
        raise RuntimeError("a replay measures nothing: it plays a recorded session")

    def quant_lens(self) -> LensView:
        cfg = self.trace.header.get("config") or {}
        return LensView(str(cfg.get("variant") or FULL_VARIANT), self._load_at(self.position_s()))

    async def set_load_mix(self, kinds: Sequence[str]) -> LoadMix:
        raise RuntimeError("a replay plays its recorded load: its task mix cannot change")

    # --- K policies: recorded, never applied ------------------------------------
    @property
    def policy_changes(self) -> list[tuple[float, dict]]:
        """The recorded K policy changes, in the same time frame as ``load_changes``."""
        now = self._clock()
        played = self.played_s(now)
        out = []
        for base, lo, hi in self._windows(played, HISTORY_S):
            out += [
                (now - (played - (base + p["t"])), {k: v for k, v in p.items() if k not in ("type", "t")})
                for p in self.trace.policies
                if lo < p["t"] <= hi
            ]
        return out

    def policy_view(self):
        """What a policy panel shows: nothing can be applied to a recording."""
        from engine_adapter.policy.live_state import PolicyView  # the live-policy side, only when asked

        cfg = self._config
        k_max = (cfg.k_max or cfg.k) if cfg is not None else 0
        return PolicyView(
            available=False,
            why_not="this is a replay of a recorded session, with no engine to "
            "apply a policy to (the recorded K is in the live charts)",
            state=None,
            cost=None,
            cost_source=None,
            profiling=None,
            error=None,
            applied_seq=None,
            k_max=k_max,
            alphas=[],
        )

    async def set_policy(self, spec: Any) -> None:
        raise RuntimeError("this is a replay of a recorded session: K policies need a live engine (python app.py)")

    async def profile_cost(self) -> None:
        raise RuntimeError("this is a replay of a recorded session: profiling needs a live engine (python app.py)")

    async def set_acceptance(self, rule: Any) -> Any:
        raise RuntimeError(
            "this is a replay of a recorded session: acceptance rules need a live engine (python app.py)"
        )

    # --- foreground requests ---------------------------------------------------
    def _find(self, prompt: str) -> int | None:
        reqs = self.trace.requests
        want = (prompt or "").strip()
        if want:
            for j in range(len(reqs)):
                i = (self._cursor + j) % len(reqs)
                if reqs[i].prompt.strip() == want:
                    return i
        return None

    def recorded_requests(self) -> list[RequestResult]:
        return list(self.trace.requests)

    def replay_prompt(self, prompt: str) -> str:
        """The recorded prompt Run will play for ``prompt`` (itself if recorded)."""
        if not self.trace.requests:
            return prompt
        i = self._find(prompt)
        return self.trace.requests[self._cursor % len(self.trace.requests) if i is None else i].prompt

    async def stream(
        self,
        prompt: str,
        *,
        max_tokens: int = 0,
        temperature: float = 0.0,
        request_id: str | None = None,  # EngineService's; a replay keeps the recorded ids
    ) -> AsyncIterator[Step | RequestResult]:
        """Play a recorded foreground request (``max_tokens``/``temperature`` are the recorded ones)."""
        reqs = self.trace.requests
        if not reqs:
            raise RuntimeError(
                "this recording holds no foreground request to replay (only the background "
                "load); the live charts still replay it."
            )
        i = self._find(prompt)
        if i is None:
            i = self._cursor % len(reqs)
        self._cursor = (i + 1) % len(reqs)
        result = reqs[i]
        prev = result.t_start
        for step in result.steps:
            delay = (step.t - prev) / self.speed
            prev = step.t
            if delay > 0:
                await self._sleep(min(delay, 30.0))
            yield replace(step, t=self._clock())
        delay = (result.t_end - prev) / self.speed
        if delay > 0:
            await self._sleep(min(delay, 5.0))
        yield result
