"""The engine panel: the status line at the top of the page and the engine settings.

Contract: ``EnginePanel(ctx, config)`` (``explorer.panels.context``); ``build_status()`` adds
the status line (``explorer.views.status.status_markdown``, refreshed every
second) and above it the banners: the lossy rule's (``acceptance_banner_markdown``, empty
under vLLM's lossless rule) and the recording notice (``recording_banner_markdown``, while
``--record`` writes the session); ``build_settings()`` the "Engine" accordion: the presenter box
(``explorer.panels.presenter``), the speculation method, K, the model variant (the pair, or int8
copies of its target or of both: ``engine_config.MODEL_VARIANTS``) and an Apply that asks for a
restart with ``config`` changed in those three (a live K policy keeps room for the chosen K; restarts
coalesce: ``Backend.request_restart``). ``wire()`` connects them. The lines are built once per
refresh tick for every page (``ctx.ticks``); on a public page they name no engine address or
server path.

API names: /apply (method, K, variant) -> the answer (a restart asked for, or why not); /status -> status line;
/acceptance_banner -> the banners. ``top_lines()`` is both, the same for every page, which
the page's timer fetches every second from ``TOP_LINES_PATH`` (``assets/top_lines.js``), a
route the HTTP door answers without Gradio (``explorer.request_limits``).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import gradio as gr

from engine_adapter.engine_config import (
    FULL_VARIANT,
    VARIANT_LABELS,
    EngineConfig,
    available_methods,
    available_variants,
)
from engine_adapter.package_data import assets_dir
from explorer.panels.context import ENGINE_CHANGES_AT_ONCE, PageContext
from explorer.panels.presenter import build_presenter_box
from explorer.views.ledger_view import speedup_banner_markdown
from explorer.views.status import acceptance_banner_markdown, recording_banner_markdown, status_markdown

METHOD_LABELS = MappingProxyType(
    {"off": "off (no speculation)", "ngram": "ngram (prompt lookup)", "draft": "draft model", "suffix": "suffix tree"}
)
MAX_K = 8  # the K slider's top (EngineConfig.checked allows more)
TOP_LINES_PATH = "/explorer/top_lines"


class EnginePanel:
    def __init__(self, ctx: PageContext, config: EngineConfig) -> None:
        self.ctx = ctx
        self.backend = ctx.backend
        self.config = config

    def build_status(self) -> gr.Markdown:
        self.banner = gr.Markdown(self._banners(), elem_id="lossy-banner")
        self.status = gr.Markdown(self._status(), elem_id="engine-status")
        return self.status

    def build_settings(self) -> None:
        """The "Engine" accordion."""
        with gr.Accordion("Engine (restarts the engine)", open=True):
            build_presenter_box(self.ctx.presenter, self.ctx.exposure)
            self.method = gr.Radio(
                [(METHOD_LABELS[m], m) for m in available_methods()],
                value=self.config.method,
                label="Speculation method",
                elem_id="method",
            )
            self.k = gr.Slider(1, MAX_K, value=self.config.k, step=1, label="K (num_speculative_tokens)")
            self.variant = gr.Radio(
                [(label, v) for v, label in VARIANT_LABELS.items() if v in available_variants()],
                value=self.config.variant,
                label="Model variant (quantised copies are made once, about 20 s for the packaged target)",
                elem_id="variant",
            )
            self.apply_btn = gr.Button("Apply engine settings", elem_id="apply")
            self.said = gr.Markdown("", elem_id="engine-said")  # the answer to this page's last Apply

    def wire(self) -> None:
        self.apply_btn.click(
            self.apply,
            [self.method, self.k, self.variant],
            self.said,
            api_name="apply",
            concurrency_id="engine",
            concurrency_limit=ENGINE_CHANGES_AT_ONCE,
        )
        # one timer for both lines, whose tick runs in the page only (assets/top_lines.js fetches
        # TOP_LINES_PATH): an event with a backend function costs the page's main thread at each of its
        # messages (Gradio updates the loading state of every component), and the token view waits
        top_lines_js = (assets_dir() / "top_lines.js").read_text().replace("__TOP_LINES_PATH__", TOP_LINES_PATH)
        gr.Timer(1.0).tick(None, [self.status, self.banner], [self.status, self.banner], js=top_lines_js)
        gr.api(self.status_line, api_name="status", queue=False)
        gr.api(self.banner_line, api_name="acceptance_banner", queue=False)

    def _status(self) -> str:
        return status_markdown(self.backend, public=self.ctx.exposure.public)

    def _banners(self) -> str:
        lossy = acceptance_banner_markdown(self.backend.status())
        recorded = recording_banner_markdown(self.ctx.recording() if self.ctx.recording else None)
        measuring = speedup_banner_markdown(self.backend.speedup_view())
        return self.ctx.shown("\n\n".join(part for part in (lossy, recorded, measuring) if part))

    def top_lines(self) -> list[str]:
        """[the status line, the banners], built once per tick for every page."""
        return [self.ctx.ticks.get("status", self._status), self.ctx.ticks.get("banners", self._banners)]

    def banner_line(self) -> str:
        return self.top_lines()[1]

    def status_line(self) -> str:
        """The status line now (for API callers and tests: not the tick's copy), unless every poll
        slot is taken: then the tick's."""
        with self.ctx.polls.slot() as mine:
            return self._status() if mine else self.ctx.ticks.get("status", self._status)

    async def apply(self, method: str, k_value: float, variant: str | None, request: gr.Request) -> str:
        if refusal := self.ctx.refusal(request):
            return refusal
        cfg = replace(self.config, method=method, k=int(k_value), variant=variant or self.config.variant)
        if cfg.live_policies:  # they stay on, with room for the chosen K
            cfg = replace(cfg, k_max=max(cfg.k_max, cfg.k))
        try:
            cfg = cfg.checked()
            ticket = await self.backend.request_restart(cfg)
        except (ValueError, RuntimeError) as e:
            return f"✕ {self.ctx.shown(str(e))}"
        what = f"method **{cfg.method}**, K={cfg.k}, {VARIANT_LABELS[cfg.variant]}"
        if ticket.behind_running:
            when = "after the restart in progress"
        else:
            when = f"in {ticket.due_in_s:.0f} s"
        replaced = " It replaces the restart asked for before it." if ticket.replaced else ""
        status = self.backend.status()
        took = f" The last start took {status.started.total_s:.0f} s to ready." if status.started else ""
        running = status.config.variant if status.config else cfg.variant
        if cfg.variant not in (running, FULL_VARIANT):
            took += " A first switch to a quantised variant also makes its copies (about 20 s for the packaged target)."
        return (
            f"Restart asked for ({what}): it starts {when}; another Apply before then replaces it.{replaced}{took} "
            "The status line above shows its progress."
        )
