"""The live charts' data as a CSV file, live or replayed.

Contract: ``write_chart_csv(backend, directory)`` writes
``explorer.views.live_charts.live_chart_frame(backend)`` as CSV (``t`` =
seconds, 0 = now; ``load`` = the background load in force in each bin; empty
cells = no data in that bin) to a new file in ``directory`` and returns its path.
``build_csv_export(backend)`` puts an export button and a file box on the page
(API name ``export_csv``; the box shows once it holds a file). The files live in one temporary folder of the page's,
which keeps only the newest ``KEEP_EXPORTS`` (Gradio serves its own copy, made when
the answer is sent) and is removed when the app exits.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path

import gradio as gr

from engine_adapter.service.backend import Backend
from explorer.views.live_charts import WINDOW_S, chart_csv, live_chart_frame

KEEP_EXPORTS = 8  # newest CSV files kept in the page's folder; older ones are deleted at each export


def write_chart_csv(backend: Backend, directory: str | Path) -> Path:
    path = Path(directory) / f"live_charts_{time.strftime('%Y%m%d-%H%M%S')}_{uuid.uuid4().hex[:6]}.csv"
    path.write_text(chart_csv(live_chart_frame(backend)), encoding="utf-8")
    return path


def prune(directory: Path, keep: int = KEEP_EXPORTS) -> int:
    """Delete all but the ``keep`` newest CSV files in ``directory``; returns how many went."""
    files = sorted(directory.glob("*.csv"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[keep:]:
        old.unlink(missing_ok=True)
    return max(len(files) - keep, 0)


def build_csv_export(backend: Backend) -> None:
    """An 'Export chart data (CSV)' button with the file it makes, under the live chart."""
    folder = tempfile.TemporaryDirectory(prefix="spec-explorer-csv-")  # removed when the app exits
    with gr.Row():
        button = gr.Button("Export chart data (CSV)", elem_id="export-csv", scale=0, min_width=220)
        out = gr.File(
            label=f"Live chart data, last {WINDOW_S / 60:g} minutes (t = seconds, 0 = now)",
            interactive=False,
            elem_id="chart-csv",
            height=80,
            visible=False,  # an empty file box is only clutter: shown with the first export
        )

    def export_csv() -> str:
        directory = Path(folder.name)
        path = write_chart_csv(backend, directory)
        prune(directory)
        return str(path)

    button.click(export_csv, None, out, api_name="export_csv", concurrency_id="export", concurrency_limit=2)
    # the page's click also shows the box (the API's answer stays the file's path)
    button.click(lambda: gr.File(visible=True), None, out, queue=False, api_visibility="private")
