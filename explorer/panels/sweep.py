"""The sweep panel: speedup versus concurrency per policy, shipped sweeps or one's own CSV.

Contract: ``build_sweep_panel(sweep_dir)`` adds, inside the enclosing
``gr.Blocks``, an accordion with the sweeps shipped in ``sweep_dir``
(``engine_adapter.package_data.sweeps_dir()``, the index's first shown on
load) and an upload for a CSV written by ``python -m engine_adapter.sweep``.
API names: /sweep (a shipped file's name) -> (message, figure, table), the message with the
index's line about it and its settings line; /sweep_upload (a CSV file, bounded by
``sweep_figure.read_sweep``) -> the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
from gradio.components import Component

from explorer.views.sweep_figure import settings_markdown, shipped_sweeps, show


class SweepPanel:
    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.shipped = shipped_sweeps(sweep_dir)
        self.about = {s.path.name: s.about for s in self.shipped}
        self.settings = {s.path.name: s.settings for s in self.shipped}

    def build(self) -> None:
        first_name = self.shipped[0].path.name if self.shipped else None
        with gr.Accordion("Sweep: speedup versus concurrency per policy (python -m engine_adapter.sweep)", open=False):
            gr.Markdown(
                "Measured by `python -m engine_adapter.sweep` on a live engine; pick a sweep shipped "
                "with the explorer (each with the settings it was measured with; the first is the sweep "
                "of record) or upload your own CSV."
            )
            with gr.Row():
                self.pick = gr.Dropdown(
                    [s.path.name for s in self.shipped], value=first_name, label="Shipped sweeps", elem_id="sweep-pick"
                )
                self.upload = gr.File(label="…or your sweep CSV", file_types=[".csv"], elem_id="sweep-upload")
            message, fig, table = self._shipped(first_name) if first_name else ("No sweep shipped yet.", None, None)
            self.message = gr.Markdown(message)
            self.plot = gr.Plot(fig, show_label=False, elem_id="sweep-plot")
            self.table = gr.Dataframe(table, interactive=False, elem_id="sweep-table")
        outputs = [self.message, self.plot, self.table]
        self.pick.change(self.show_shipped, self.pick, outputs, api_name="sweep")
        self.upload.upload(
            self.show_upload, self.upload, outputs, api_name="sweep_upload", concurrency_id="sweep", concurrency_limit=2
        )

    def _shipped(self, name: str | None) -> tuple[str, Any, Any]:
        """A shipped sweep, with the index's line about it and its settings line."""
        message, fig, table = show(self.sweep_dir / name if name else None)
        if fig is not None:
            message = f"{self.about.get(name) or ''}\n\n{settings_markdown(self.settings.get(name))}\n\n{message}"
        return message.strip(), fig, table

    def _outputs(self, shown: tuple[str, Any, Any]) -> dict[Component, Any]:
        return dict(zip([self.message, self.plot, self.table], shown))

    def show_shipped(self, name: str | None) -> dict[Component, Any]:
        return self._outputs(self._shipped(name))

    def show_upload(self, path: str | None) -> dict[Component, Any]:
        message, fig, table = show(path)
        if fig is not None:  # a CSV carries no settings: the sweep printed them in its JSON line
            message += ' Its settings line is not in the CSV: the sweep printed it as the JSON line\'s "settings".'
        return self._outputs((message, fig, table))


def build_sweep_panel(sweep_dir: Path) -> SweepPanel:
    panel = SweepPanel(sweep_dir)
    panel.build()
    return panel
