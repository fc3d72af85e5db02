"""The quantisation lens, inside the "Who gets the discount" panel: the speedup measurements per
model variant, and the picture of why the speedups of quantisation and speculation do not multiply.

Contract: ``LensSection(ctx)``; ``build()`` adds its table (``#lens-table``) and figure
(``#lens-plot``) inside the enclosing Blocks; ``outputs`` are both; on the page's chart timer,
``readout()`` is the table (built once per refresh tick for every page) and ``figure(drawn)``
the figure when what it shows changed since the page drew it (``drawn``: the key it drew), with
the new key. The variant itself is switched under Engine (``explorer.panels.engine``).
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.components import Component

from engine_adapter.service.backend import LensView
from explorer.panels.context import PageContext
from explorer.panels.load import plot_data
from explorer.views.lens_view import lens_figure, lens_key, lens_markdown


class LensSection:
    def __init__(self, ctx: PageContext) -> None:
        self.ctx = ctx
        self.backend = ctx.backend

    def build(self) -> None:
        gr.Markdown("### One pool of idle compute: quantisation and speculation on one engine")
        self.table = gr.Markdown(lens_markdown(self.backend.quant_lens()), elem_id="lens-table")
        self.plot = gr.Plot(show_label=False, elem_id="lens-plot")
        self.outputs = [self.table, self.plot]

    def _view(self) -> LensView:
        return self.ctx.ticks.get("lens_view", self.backend.quant_lens)  # once per tick, table and figure

    def readout(self) -> dict[Component, Any]:
        return {self.table: self.ctx.ticks.get("lens_table", lambda: lens_markdown(self._view()))}

    def figure(self, drawn: Any) -> tuple[dict[Component, Any], Any]:
        """The figure if what it shows changed since ``drawn`` (and the key now)."""
        view = self._view()
        key = lens_key(view)
        if key == drawn:
            return {}, drawn
        return {self.plot: self.ctx.ticks.get(("lens", key), lambda: plot_data(lens_figure(view)))}, key
