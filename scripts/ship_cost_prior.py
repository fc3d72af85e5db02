"""Make a shipped cost-model prior from this machine's cached profile, for the engine the app starts.

    .venv/bin/python scripts/ship_cost_prior.py [APP ARGS...]    # e.g. nothing: the app's defaults

Builds the engine config ``app.py`` would from the same arguments, reads the cost model its
first start measured on this machine (``~/.cache/spec-explorer/cost/``, the profiler's cache;
start the app once with these arguments first, or use ``--reprofile`` in the sweep) and writes
it with its acceptance to ``cost_priors/`` as ``engine_adapter.policy.cost_prior`` reads it,
keyed by the models, method, dtype and this machine's CPU kind (and whether it has AMX). A later
first start on a machine of the same kind scales it by timing two cells instead of profiling. Prints the file written
and its key, then JSON as the last line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app import engine_config, parse_args  # noqa: E402
from engine_adapter.engine.platform import detect_platform  # noqa: E402
from engine_adapter.policy.cost_model import CostModel  # noqa: E402
from engine_adapter.policy.cost_prior import cost_priors_dir, prior_key, write_prior  # noqa: E402
from engine_adapter.policy.profiler import ACCEPTANCE_KEY, config_cache_path, load_cached_acceptance  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    config = engine_config(parse_args(argv))
    platform = detect_platform()
    key = prior_key(config, platform)
    if key is None:
        print("error: a prior is for a CPU engine with live K policies", file=sys.stderr)
        return 2
    cache = config_cache_path(config, platform)
    if not cache.is_file():
        print(f"error: no cost model cached for this engine at {cache}: start the app once first", file=sys.stderr)
        return 1
    saved = json.loads(cache.read_text())
    saved.pop(ACCEPTANCE_KEY, None)
    cost = CostModel.from_dict(saved)
    kind = f"{key['cpu_kind']} AMX" if key["amx"] else key["cpu_kind"]
    name = "_".join([kind, *(str(key[f]) for f in ("dtype", "target", "method", "k_max"))])
    path = cost_priors_dir() / (re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-").lower() + ".json")
    written = write_prior(path, config, platform, cost, load_cached_acceptance(cache))
    print(f"wrote {path}\nkey {written['key']}\ncells {len(cost.points)}")
    print(json.dumps({"path": str(path), "key": written["key"], "cells": len(cost.points)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
