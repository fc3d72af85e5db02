"""The engine panel: the status line at the top of the page and the engine settings.

Contract: ``EnginePanel(backend, config, presenter)``; ``build_status()`` adds
the status line (``explorer.views.status.status_markdown``, refreshed every
second) and above it the lossy-rule banner (``acceptance_banner_markdown``, empty
under vLLM's lossless rule), ``build_settings()`` the "Engine" accordion: the presenter box
(``explorer.panels.presenter``), the speculation method, K and an Apply that
restarts the engine with ``config`` changed in those two (a live K policy
keeps room for the chosen K). ``wire()`` connects them.

API names: /apply (method, K, unlocked) -> status line; /status -> status line;
/acceptance_banner -> the banner; /top_lines -> both (not queued: the page's timer
fetches it every second, ``assets/top_lines.js``).
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import gradio as gr

from engine_adapter.engine_config import EngineConfig, available_methods
from engine_adapter.package_data import assets_dir
from engine_adapter.service.backend import Backend
from explorer.panels.presenter import Presenter, build_presenter_box
from explorer.views.status import acceptance_banner_markdown, status_markdown

METHOD_LABELS = MappingProxyType(
    {"off": "off (no speculation)", "ngram": "ngram (prompt lookup)", "draft": "draft model", "suffix": "suffix tree"}
)
MAX_K = 8  # the K slider's top (EngineConfig.validate allows more)


class EnginePanel:
    def __init__(self, backend: Backend, config: EngineConfig, presenter: Presenter) -> None:
        self.backend = backend
        self.config = config
        self.presenter = presenter

    def build_status(self) -> gr.Markdown:
        self.banner = gr.Markdown(acceptance_banner_markdown(self.backend.status()), elem_id="lossy-banner")
        self.status = gr.Markdown(status_markdown(self.backend), elem_id="engine-status")
        return self.status

    def build_settings(self) -> gr.State:
        """The "Engine" accordion; returns the presenter state (True once this page is unlocked)."""
        with gr.Accordion("Engine (restarts the engine)", open=True):
            self.unlocked = build_presenter_box(self.presenter)
            self.method = gr.Radio(
                [(METHOD_LABELS[m], m) for m in available_methods()],
                value=self.config.method,
                label="Speculation method",
                elem_id="method",
            )
            self.k = gr.Slider(1, MAX_K, value=self.config.k, step=1, label="K (num_speculative_tokens)")
            self.apply_btn = gr.Button("Apply engine settings", elem_id="apply")
        return self.unlocked

    def wire(self) -> None:
        self.apply_btn.click(self.apply, [self.method, self.k, self.unlocked], self.status, api_name="apply")
        # one timer for both lines, whose tick runs in the page only (assets/top_lines.js fetches
        # /top_lines): an event with a backend function costs the page's main thread at each of its
        # messages (Gradio updates the loading state of every component), and the token view waits
        gr.api(self.top_lines, api_name="top_lines", queue=False)
        top_lines_js = (assets_dir() / "top_lines.js").read_text()
        gr.Timer(1.0).tick(None, [self.status, self.banner], [self.status, self.banner], js=top_lines_js)
        gr.api(self.status_line, api_name="status")
        gr.api(self.banner_line, api_name="acceptance_banner")

    def top_lines(self) -> tuple[str, str]:
        return self.status_line(), self.banner_line()

    def banner_line(self) -> str:
        return acceptance_banner_markdown(self.backend.status())

    def status_line(self) -> str:
        return status_markdown(self.backend)

    async def apply(self, method: str, k_value: float, may: bool) -> str:
        if refusal := self.presenter.refusal(may):
            return refusal
        cfg = replace(self.config, method=method, k=int(k_value))
        if cfg.k_max is not None:  # live policies stay on, with room for the chosen K
            cfg.k_max = max(cfg.k_max, cfg.k)
        try:
            cfg.validate()
        except ValueError as e:
            return f"✕ {e}"
        self.backend.start(cfg)  # returns at once; the status line shows progress
        return status_markdown(self.backend)
