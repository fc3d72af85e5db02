"""The live charts' data as CSV, live or replayed.

Contract: ``live_chart_frame(service, now)`` is the DataFrame the live chart
draws (``bin_steps`` over the tap's steps of the last 3 minutes, or
``bin_prom`` over ``/metrics`` when attached), with one more column, ``load``:
the background load in force in each bin (from ``service.load_changes``).
``chart_csv(df)`` is its CSV text (``t`` = seconds, 0 = now; empty cells = no
data in that bin). ``add_csv_export(service)`` puts an export button and a
file box on the page (API name ``export_csv``).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import gradio as gr
import pandas as pd

from explorer.live_charts import bin_prom, bin_steps

WINDOW_S = 180.0


def live_chart_frame(service, now: float | None = None, window_s: float = WINDOW_S) -> pd.DataFrame:
    now = time.monotonic() if now is None else now
    if service.status().attached:
        df = bin_prom(service.prom_history(), now, window_s)
    else:
        df = bin_steps(service.steps_since(now - window_s), now, window_s)
    if df.empty:
        df = bin_steps([], now, window_s)
    if "t" in df.columns:
        changes = sorted((t - now, n) for t, n in service.load_changes)
        df = df.copy()
        df["load"] = [next((n for t_c, n in reversed(changes) if t_c <= t), 0) for t in df["t"]]
    return df


def chart_csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False, float_format="%.6g")


def write_chart_csv(service, directory: str | Path | None = None) -> Path:
    directory = Path(directory or tempfile.mkdtemp(prefix="spec-explorer-csv-"))
    path = directory / f"live_charts_{time.strftime('%Y%m%d-%H%M%S')}.csv"
    path.write_text(chart_csv(live_chart_frame(service)), encoding="utf-8")
    return path


def add_csv_export(service) -> None:
    """An 'Export chart data (CSV)' button with the file it makes, under the live chart."""
    with gr.Row():
        button = gr.Button("Export chart data (CSV)", elem_id="export-csv", scale=0, min_width=220)
        out = gr.File(label="Live chart data, last 3 minutes (t = seconds, 0 = now)", interactive=False,
                      elem_id="chart-csv", height=80)
    button.click(lambda: str(write_chart_csv(service)), None, out, api_name="export_csv")
