"""Where the project's data files are: the one helper for assets, prompts and shipped sweeps.

Contract: ``data_path(*parts)`` is the path of a file or folder shipped beside the
packages (``assets/``, ``prompts/``, ``docs/sweeps/``, ``traces/``, ``cost_priors/``), in a source
checkout or an editable install alike. Code never climbs ``Path(__file__).parent``
chains to find them.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# engine_adapter/ is one level below the project root, beside assets/, prompts/ and docs/
PROJECT_ROOT = Path(str(files("engine_adapter"))).resolve().parent


def data_path(*parts: str) -> Path:
    """``PROJECT_ROOT / parts...`` (whether it exists is the caller's question: a missing
    folder of shipped sweeps, say, is "none shipped", not an error)."""
    return PROJECT_ROOT.joinpath(*parts)


def assets_dir() -> Path:
    return data_path("assets")


def prompts_dir() -> Path:
    return data_path("prompts")


def sweeps_dir() -> Path:
    return data_path("docs", "sweeps")
