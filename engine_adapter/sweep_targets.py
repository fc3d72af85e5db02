"""Check a sweep CSV against the K-under-load targets and print the table.

    python -m engine_adapter.sweep_targets sweep.csv

Targets (per category when the CSV has one):
1. ``auto`` and ``auction``: total tokens/s at every concurrency >= 0.97 x the
   best of (off, k1, k3, k5) at that concurrency;
2. at concurrency 1, ``auction`` >= 1.3 x ``off`` on code prompts;
3. per-position acceptance at the highest concurrency within 0.05 of
   concurrency 1 for each fixed K (the text did not change, only the load):
   on ``acceptance_per_position_per_text`` (each prompt weighted once, so
   both levels weigh the same texts alike) where the CSV has it.

Prints a table per target, then a JSON last line with every check.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from engine_adapter.measure.targets import check


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    checks = check(pd.read_csv(Path(argv[0])))
    table = pd.DataFrame(checks)
    for target, t in table.groupby("target", sort=False):
        print(f"\n### {target}\n")
        print(t.drop(columns="target").to_string(index=False))
    print(json.dumps({"checks": checks, "all_ok": all(c["ok"] for c in checks)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
