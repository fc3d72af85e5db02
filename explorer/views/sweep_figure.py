"""Sweep results: speedup versus concurrency, one curve per policy (pure; the panel is panels/sweep.py).

Contract: ``read_sweep(path)`` reads a CSV written by ``python -m
engine_adapter.sweep`` (checks the columns, says what is missing, and refuses a
file or table beyond ``MAX_SWEEP_BYTES``, ``MAX_SWEEP_ROWS``, ``MAX_SWEEP_COLUMNS``,
``MAX_POLICIES`` and ``MAX_CATEGORIES``, saying which: an upload is a stranger's);
``sweep_figure(df)`` plots, per policy, total tokens/s divided by the
``off`` policy's at the same concurrency (and category) when ``off`` was
measured, else absolute tokens/s; one panel per task category when the CSV
has a ``category`` column. In a sweep over model variants (a ``variant`` column) each variant's
policies are lines of their own ("int8-pair auto"), over the full pair's ``off``.
``show(path)`` is the (message, figure, table) a panel shows for one CSV, with a clear message for a bad file.
``shipped_sweeps(sweep_dir)`` (``sweep_dir`` = ``package_data.sweeps_dir()``)
orders them as ``docs/sweeps/index.json`` lists them (a list of ``{"file",
"about", "settings"}``; the first is the sweep of record, shown by default), then any CSV
it does not list, by name; ``settings_markdown(settings)`` is the settings line shown with
one (``records.SweepFileSettings``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine_adapter.engine_config import FULL_VARIANT
from engine_adapter.records import SWEEP_COLUMNS, SweepFileSettings

REQUIRED = SWEEP_COLUMNS
MAX_SWEEP_BYTES = 1 << 20  # 1 MiB: the sweeps shipped are 1-6 KB
MAX_SWEEP_ROWS = 5000
MAX_SWEEP_COLUMNS = 64
MAX_POLICIES = 24  # lines per panel
MAX_CATEGORIES = 8  # panels


@dataclass(frozen=True)
class ShippedSweep:
    path: Path
    about: str  # one line: what was measured, how, and where it stands (from index.json)
    settings: SweepFileSettings | None = None  # what it was measured with (None: not kept with it)


def shipped_sweeps(sweep_dir: Path) -> list[ShippedSweep]:
    """The shipped sweep CSVs, the index's order first (its first is the sweep of record)."""
    if not sweep_dir.is_dir():
        return []
    index_path = sweep_dir / "index.json"
    entries = json.loads(index_path.read_text()) if index_path.is_file() else []
    listed = [
        ShippedSweep(sweep_dir / e["file"], e.get("about", ""), _settings(e))
        for e in entries
        if (sweep_dir / e["file"]).is_file()
    ]
    names = {s.path.name for s in listed}
    return listed + [ShippedSweep(p, "") for p in sorted(sweep_dir.glob("*.csv")) if p.name not in names]


def _settings(entry: dict) -> SweepFileSettings | None:
    settings = entry.get("settings")
    if not isinstance(settings, dict):
        return None
    return SweepFileSettings.from_dict({"date": entry.get("date", "not recorded")} | settings)


def settings_markdown(settings: SweepFileSettings | None) -> str:
    """The settings line a sweep's figures are shown with (every speed figure on the page has one)."""
    if settings is None:
        return "**Measured with:** not recorded with this file (its hardware, dtype and models are unknown)."
    return f"**Measured with:** {settings.line()}"


def read_sweep(path: str | Path) -> pd.DataFrame:
    name = Path(path).name
    try:
        size = Path(path).stat().st_size
    except OSError as e:
        raise ValueError(f"cannot read {name}: {e.strerror}") from None
    if size > MAX_SWEEP_BYTES:
        most = f"{MAX_SWEEP_BYTES >> 20} MiB"
        raise ValueError(f"{name} is {size / 2**20:.1f} MiB; a sweep CSV here may be at most {most}")
    try:  # one row more than allowed: enough to tell a table that is too long, never the whole of it
        df = pd.read_csv(path, nrows=MAX_SWEEP_ROWS + 1)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ValueError(f"cannot read {name} as CSV: {e}") from None
    if len(df.columns) > MAX_SWEEP_COLUMNS:
        raise ValueError(f"{name} has {len(df.columns)} columns; a sweep CSV has at most {MAX_SWEEP_COLUMNS}")
    if len(df) > MAX_SWEEP_ROWS:
        raise ValueError(f"{name} has more than {MAX_SWEEP_ROWS} rows; a sweep CSV here has at most that many")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{name} is not a sweep CSV: missing column(s) {', '.join(missing)}")
    if df.empty:
        raise ValueError(f"{name} has no rows")
    for column, most in (("policy", MAX_POLICIES), ("category", MAX_CATEGORIES)):
        if column in df.columns and (n := df[column].nunique()) > most:
            raise ValueError(f"{name} has {n} different values of {column}; at most {most} can be drawn")
    numeric = ["concurrency", "total_tokens_per_s"]
    if any(not pd.api.types.is_numeric_dtype(df[c]) for c in numeric):
        raise ValueError(f"{name}: the columns {' and '.join(numeric)} must hold numbers")
    if "acceptance" in df.columns:  # a sweep of acceptance rules: each (policy, lossy rule) is a line of its own
        lossy = df["acceptance"].fillna("lossless") != "lossless"
        df.loc[lossy, "policy"] = df.loc[lossy, "policy"] + " " + df.loc[lossy, "acceptance"]
    if "variant" in df.columns:  # a sweep over model variants: each (variant, policy) is a line, over the full off
        other = df["variant"].fillna(FULL_VARIANT) != FULL_VARIANT
        df.loc[other, "policy"] = df.loc[other, "variant"] + " " + df.loc[other, "policy"]
    return df


def with_speedup(df: pd.DataFrame) -> pd.DataFrame:
    """Adds ``speedup``: total tokens/s over the off policy's at the same concurrency (and category)."""
    keys = ["concurrency"] + (["category"] if "category" in df.columns else [])
    off = df[df["policy"] == "off"].set_index(keys)["total_tokens_per_s"].rename("off_tokens_per_s")
    out = df.join(off, on=keys)
    out["speedup"] = out["total_tokens_per_s"] / out["off_tokens_per_s"]
    return out


def sweep_figure(df: pd.DataFrame, title: str = "") -> go.Figure:
    d = with_speedup(df)
    has_off = d["off_tokens_per_s"].notna().any()
    y, y_title = (
        ("speedup", "speedup vs off (total tokens/s ratio)") if has_off else ("total_tokens_per_s", "total tokens/s")
    )
    cats = sorted(d["category"].dropna().unique()) if "category" in d.columns else [None]
    fig = make_subplots(
        rows=1,
        cols=len(cats),
        shared_yaxes=True,
        subplot_titles=[f"{c} prompts" for c in cats] if cats != [None] else None,
    )
    palette = ["#555", "#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692"]
    for i, policy in enumerate(dict.fromkeys(d["policy"])):
        for j, cat in enumerate(cats, 1):
            sel = d[(d["policy"] == policy) & ((d["category"] == cat) if cat is not None else True)]
            sel = sel.sort_values("concurrency")
            fig.add_trace(
                go.Scatter(
                    x=sel["concurrency"],
                    y=sel[y],
                    mode="lines+markers",
                    name=policy,
                    legendgroup=policy,
                    showlegend=j == 1,
                    line=dict(color=palette[i % len(palette)], dash="dot" if policy == "off" else None),
                    customdata=sel[["total_tokens_per_s", "effective_k", "draft_acceptance_rate"]].values,
                    hovertemplate=(
                        f"{policy}, c=%{{x}}: %{{y:.2f}}<br>%{{customdata[0]:.1f}} tokens/s, "
                        "effective K %{customdata[1]:.2f}, acceptance %{customdata[2]:.2f}<extra></extra>"
                    ),
                ),
                row=1,
                col=j,
            )
    if has_off:
        fig.add_hline(y=1.0, line=dict(color="#999", width=1))
    fig.update_xaxes(
        type="log", title_text="concurrency (requests in flight)", tickvals=sorted(d["concurrency"].unique())
    )
    fig.update_yaxes(title_text=y_title, col=1)
    fig.update_layout(
        title=title or "Speedup versus concurrency, per K policy (measured)",
        height=380,
        margin=dict(l=60, r=10, t=70, b=50),
    )
    return fig


def show(path: str | Path | None) -> tuple[str, go.Figure | None, pd.DataFrame | None]:
    """Message, figure and table for one sweep CSV (a clear message for a bad file)."""
    if not path:
        return "No sweep chosen.", None, None
    try:
        df = read_sweep(path)
    except ValueError as e:
        return f"✕ {e}", None, None
    return f"{len(df)} rows from `{Path(path).name}`.", sweep_figure(df, Path(path).stem), df
