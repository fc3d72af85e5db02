"""Record the example session traces shipped in traces/ (needs the packaged pair).

    .venv/bin/python scripts/record_example_traces.py low  traces/low_load.jsonl
    .venv/bin/python scripts/record_example_traces.py ramp traces/load_0_32_0.jsonl

Starts ``app.py --record OUT`` (default engine: draft model, K=3) on a free
local port, drives it through gradio_client as a user would, then stops it
with Ctrl-C (SIGINT) and checks that no process of its session is left.
- ``low``: three preset prompts (64 max tokens) with no background load, one
  more while 2 background requests run.
- ``ramp``: a prompt at load 0, the load slider 0 -> 8 -> 16 -> 32 over about
  a minute, a prompt under load, 32 -> 16 -> 8 -> 0, a last prompt at load 0.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_adapter.engine.supervise import session_members  # noqa: E402
from engine_adapter.prompts import load_presets  # noqa: E402
from tests.support.app_process import AppNotReady, engine_ready, start_app, wait_ready  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(scenario: str, out: str) -> int:
    prompts = {p.title: p.prompt for p in load_presets()}
    app = start_app(["--record", out], Path(tempfile.mkdtemp(prefix="record-traces-")) / "app.log")
    try:
        try:
            client = wait_ready(app, engine_ready, timeout_s=400, poll_s=2.0)
        except AppNotReady as e:
            raise SystemExit(str(e)) from None
        log("engine ready")

        def run(title: str, max_tokens: int = 64) -> None:
            t = time.monotonic()
            *_, trace = client.predict(prompts[title], 0.0, max_tokens, api_name="/run")
            log(f"ran {title!r}: {len(trace['token_ids'])} tokens in {time.monotonic() - t:.1f} s")

        def load(n: int, hold_s: float = 0.0) -> None:
            log(client.predict(n, api_name="/set_load"))
            time.sleep(hold_s)

        time.sleep(3)
        if scenario == "low":
            run("Fibonacci")
            time.sleep(2)
            run("Multiply")
            time.sleep(2)
            run("Lighthouse")
            load(2, 5)
            run("Weather (French)")
            load(0, 5)
        elif scenario == "ramp":
            run("Fibonacci")
            time.sleep(3)
            for n in (8, 16, 32):
                load(n, 20)
            run("Multiply", 32)
            load(32, 10)
            for n in (16, 8):
                load(n, 20)
            load(0, 8)
            run("Binary search")
            time.sleep(3)
        else:
            raise SystemExit(f"unknown scenario {scenario!r} (low, ramp)")
    finally:
        if not app.stop(timeout_s=90):
            log("the app did not stop within 90 s of SIGINT: killed its process group")
        left = []
        for _ in range(60):
            left = session_members(app.proc.pid)
            if not left:
                break
            time.sleep(1)
        log(f"app exited with {app.returncode}; processes of its session left: {left}")
    size = Path(out).stat().st_size
    log(f"{out}: {size / 1024:.0f} KiB")
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
