"""The live charts' data as a CSV file, live or replayed.

Contract: ``write_chart_csv(backend, directory)`` writes
``explorer.views.live_charts.live_chart_frame(backend)`` as CSV (``t`` =
seconds, 0 = now; ``load`` = the background load in force in each bin; empty
cells = no data in that bin) to a new file in ``directory`` (a fresh temporary
folder by default) and returns its path. ``build_csv_export(backend)`` puts an
export button and a file box on the page (API name ``export_csv``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gradio as gr

from engine_adapter.service.backend import Backend
from explorer.views.live_charts import WINDOW_S, chart_csv, live_chart_frame


def write_chart_csv(backend: Backend, directory: str | Path | None = None) -> Path:
    directory = Path(directory or tempfile.mkdtemp(prefix="spec-explorer-csv-"))
    path = directory / f"live_charts_{time.strftime('%Y%m%d-%H%M%S')}.csv"
    path.write_text(chart_csv(live_chart_frame(backend)), encoding="utf-8")
    return path


def build_csv_export(backend: Backend) -> None:
    """An 'Export chart data (CSV)' button with the file it makes, under the live chart."""
    with gr.Row():
        button = gr.Button("Export chart data (CSV)", elem_id="export-csv", scale=0, min_width=220)
        out = gr.File(
            label=f"Live chart data, last {WINDOW_S / 60:g} minutes (t = seconds, 0 = now)",
            interactive=False,
            elem_id="chart-csv",
            height=80,
        )

    def export_csv() -> str:
        return str(write_chart_csv(backend))

    button.click(export_csv, None, out, api_name="export_csv")
