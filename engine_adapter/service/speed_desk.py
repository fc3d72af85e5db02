"""The presenter's speed measurements on the live engine, in one place: the speedup at the load in
force (``service.speedup_probe``) and the quantisation lens that files each probe's figures under
its model variant (``service.quant_lens``).

Contract: ``SpeedDesk(presets)`` (the load's presets: the probe runs the first of each task kind).
``view()`` and ``running`` are the probe's; ``settings(engine, config, policy, load)`` is the
settings line of a figure measured now on ``engine``; ``start(probe_engine, engine, config, view,
load, repeats, max_tokens)`` (its arguments checked before by ``check_probe_args``) checks that a
live K policy is in force (``view``, the live policy's), marks the probe running, notes the
roofline of the engine it runs on and returns the measurement's coroutine for the caller to run
on the service loop; ``lens_view(variant, load)`` files the probe's
latest figures and returns the lens as the page shows it. Nothing here starts a task or touches the
engine but through ``ProbeEngine``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_adapter.engine.live_engine import LiveEngine
from engine_adapter.engine_config import EngineConfig
from engine_adapter.policy.controller import PolicySpec
from engine_adapter.policy.live_state import PolicyView
from engine_adapter.prompts import Preset
from engine_adapter.service.quant_lens import LensMachine, LensView, QuantLens, lens_machine
from engine_adapter.service.speedup_probe import (
    ProbeEngine,
    SpeedSettings,
    SpeedupProbe,
    SpeedupView,
    probe_prompts,
    speed_settings,
)


@dataclass
class SpeedDesk:
    """The speedup probe, the quantisation lens, and the roofline of the engine the last probe ran on."""

    presets: Sequence[Preset]
    probe: SpeedupProbe = field(default_factory=SpeedupProbe)
    lens: QuantLens = field(default_factory=QuantLens)
    machine: LensMachine | None = None

    def view(self) -> SpeedupView:
        return self.probe.view()

    @property
    def running(self) -> bool:
        return self.probe.running

    def settings(self, engine: LiveEngine, config: EngineConfig | None, policy: PolicySpec, load: int) -> SpeedSettings:
        """The settings line of a figure measured now on ``engine`` under ``policy`` and ``load`` requests."""
        platform = engine.process.platform if engine.process is not None else None
        return speed_settings(config, platform, policy, load)

    def start(
        self,
        probe_engine: ProbeEngine,
        engine: LiveEngine,
        config: EngineConfig | None,
        view: PolicyView,
        load: int,
        repeats: int,
        max_tokens: int,
    ) -> Coroutine[Any, Any, None]:
        """Mark the probe running and return its measurement (arguments checked before by
        ``check_probe_args``; raises where it cannot run: no live K policy in force, one running
        already, a policy that drafts nothing)."""
        if not view.available or view.state is None or view.profiling:
            raise RuntimeError(f"measuring the speedup needs a live K policy in force ({view.why_not or 'not yet'})")
        prompts = probe_prompts(self.presets)
        settings = self.settings(engine, config, view.state.spec, load)
        run = self.probe.start(probe_engine, view.state.spec, prompts, settings, repeats, max_tokens)
        self.machine = lens_machine(engine.process, config)
        return run

    def lens_view(self, variant: str, load: int) -> LensView:
        """The probe's figures per model variant and load, side by side."""
        if self.machine is not None:
            self.lens.take(self.probe.view(), self.machine)
        return self.lens.view(variant, load)
