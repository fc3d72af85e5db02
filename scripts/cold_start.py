"""Time a launch of the explorer as a newcomer sees it: page up, measuring, ready, first request.

    .venv/bin/python scripts/cold_start.py --cold              # an empty cost-model cache
    .venv/bin/python scripts/cold_start.py --warm              # the cost model already cached
    .venv/bin/python scripts/cold_start.py --cold --app-args "--reserved-cpus 1"
    .venv/bin/python scripts/cold_start.py --cold --learn-s 300 --learn-load 4
    .venv/bin/python scripts/cold_start.py --cold --explore-s 240

``--cold`` makes a fresh cache folder (``SPEC_EXPLORER_CACHE``) holding only links to the
model folders of the usual cache (``~/.cache/spec-explorer`` or ``$SPEC_EXPLORER_CACHE``), so
the app finds its models but no cost model and measures one, as on a Space's first start.
``--warm`` uses the usual cache as it is (run ``--cold --keep-cache`` first, or the app once).
The app (``python app.py --port <free> ARGS`` on 127.0.0.1) is polled through its ``/status``
API every second; once it says ready, one request (``--prompt``, ``--max-tokens`` tokens,
greedy) runs through ``/run`` and its token kinds are counted. The app is stopped by its PID
at the end (Ctrl-C, then SIGKILL of its session). Prints a table, then JSON as the last line:
the machine (CPU, cores, CPU kind, the engine's dtype: ``platform.machine_facts``), seconds from
launch to the page answering, to "Measuring this machine", to ready, the first request's wall
time, its kinds and its steps in short (``step_summary``: how many, at which K, their median time, the largest
batch).

``--learn-s S`` then keeps ``--learn-load`` background requests running for S seconds (the cost
model learns from their steps), sets the load back to 0, waits until no background request runs,
and runs the same request again: the JSON adds its wall time, kinds and steps, the cost model's line
from the K-policy panel at the first request and after learning, and ``first_over_learned``
(the first request's speed over the second's: issue 33 asks at least 0.85).

``--explore-s S`` then leaves the engine idle for S seconds (more while a cell still runs), where
idle time measures the cells around the Ks the auto table chooses (and a shipped cost model's cells
traffic has not reached), and runs the same request again: the JSON adds the cells seen measured,
the cost model's line after them, the request's wall time, kinds and steps, and
``first_over_explored``.

``--idle-s S`` then leaves the engine idle for S seconds (only the page's tick polls), where a
shipped cost model measures the cells traffic has not reached, waits (up to 60 s) until a cell
is being measured and runs the same request again: the JSON adds the cost model's line after
the idle time, whether a cell was being measured when the request came, the request's wall time
and ``claim_wait_s``: the app's time before the request reached vLLM (the call's wall time less
the request's own, from the trace), less the same for the first request: what stopping the cell
cost it.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median

import httpx
from gradio_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as a script

from engine_adapter.engine.models import default_cache_dir  # noqa: E402
from engine_adapter.engine.platform import dtype_in, machine_facts  # noqa: E402
from tests.support.app_process import engine_ready, start_app  # noqa: E402

FIRST_PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
MEASURING = "Measuring this machine"
LAUNCH_MARKS = ("page_s", "measuring_s", "ready_s")  # seconds from launch, watched by ``watch_launch``


def fresh_cache(models_from: Path) -> Path:
    """A new cache folder with links to the model folders only (no cost model)."""
    cache = Path(tempfile.mkdtemp(prefix="spec-explorer-cold-"))
    for entry in models_from.iterdir():
        if entry.is_dir() and entry.name != "cost":
            (cache / entry.name).symlink_to(entry)
    return cache


def watch_launch(app, deadline_s: float) -> dict[str, float | None]:
    """Seconds from launch to: the page answering, the first 'measuring' status, ready."""
    t0 = time.monotonic()
    marks: dict[str, float | None] = dict.fromkeys(LAUNCH_MARKS)
    client = None
    while time.monotonic() - t0 < deadline_s:
        if app.proc.poll() is not None:
            raise SystemExit(f"the app exited ({app.proc.returncode}):\n{app.log_tail()}")
        try:
            if client is None and httpx.get(app.url, timeout=2).status_code == 200:
                client = Client(app.url, verbose=False)
                marks["page_s"] = time.monotonic() - t0
            if client is not None:
                status = client.predict(api_name="/status")
                if marks["measuring_s"] is None and MEASURING in status:
                    marks["measuring_s"] = time.monotonic() - t0
                if engine_ready(status):
                    marks["ready_s"] = time.monotonic() - t0
                    return marks | {"client": client}  # type: ignore[return-value]
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1.0)
    raise SystemExit(f"not ready within {deadline_s:.0f} s:\n{app.log_tail()}")


def first_request(client: Client, prompt: str, max_tokens: int) -> dict:
    t = time.monotonic()
    out = client.predict(prompt, 0.0, max_tokens, api_name="/run")
    trace = out[-1] if isinstance(out, (list, tuple)) else out  # the recorder's JSON line, as text
    line = json.loads(trace) if isinstance(trace, str) and trace else {}
    kinds = Counter(line.get("kinds", []))
    if not kinds:
        raise SystemExit(f"the first request returned no trace: {str(out)[:500]}")
    wall_s = time.monotonic() - t
    # the app's time before the request reached vLLM: the call's wall time less the request's own
    before_s = wall_s - float(line.get("wall_s") or 0.0)
    return {
        "first_request_s": round(wall_s, 1),
        "kinds": dict(kinds),
        "first_before_vllm_s": round(before_s, 2),
        "steps": step_summary(line.get("steps", [])),
    }


def step_summary(steps: list[dict]) -> dict:
    """A request's steps in short: how many, at which K (steps per K), the median wall time in
    seconds of those that give one, and the largest batch any of them ran in; {} for no steps."""
    if not steps:
        return {}
    walls = [float(s["wall_s"]) for s in steps if s.get("wall_s")]
    return {
        "n": len(steps),
        "k": dict(sorted(Counter(int(s.get("k") or 0) for s in steps).items())),
        "median_step_s": round(median(walls), 3) if walls else None,
        "max_batch_size": max(int(s.get("batch_size") or 0) for s in steps),
    }


def cost_model_line(client: Client) -> str:
    """The K-policy panel's sentence on the cost model in force, from the page's chart tick."""
    outputs = client.predict(False, api_name="/charts")
    return next(
        (o.split("Cost model:", 1)[1].strip() for o in outputs if isinstance(o, str) and "Cost model:" in o), ""
    )


def learned_request(client: Client, prompt: str, max_tokens: int, learn_s: float, load: int) -> dict:
    """The same request again after ``learn_s`` seconds of ``load`` background requests."""
    client.predict(load, api_name="/set_load")
    end = time.monotonic() + learn_s
    while time.monotonic() < end:  # the page's tick keeps the session's load alive
        client.predict(False, api_name="/charts")
        time.sleep(5.0)
    client.predict(0, api_name="/set_load")
    deadline = time.monotonic() + 300
    while "No background load" not in str(client.predict(False, api_name="/charts")[0]):
        if time.monotonic() > deadline:
            raise SystemExit("the background load did not stop within 300 s")
        time.sleep(1.0)
    time.sleep(3.0)  # the cancelled requests leave the engine
    learned_line = cost_model_line(client)
    again = first_request(client, prompt, max_tokens)
    return {
        "learn_s": learn_s,
        "learn_load": load,
        "cost_model_learned": learned_line,
        "learned_request_s": again["first_request_s"],
        "learned_kinds": again["kinds"],
        "learned_steps": again["steps"],
    }


IDLE_CELL = "while the engine is idle"  # the cost model's line while a cell is measured in idle time
CELL_END_S = 120.0  # --explore-s: how long past its seconds cells still running are waited for
NO_CELL_S = 6.0  # ... and how long none must have run


def request_during_idle_cell(
    client: Client, prompt: str, max_tokens: int, idle_s: float, first_before_s: float
) -> dict:
    """The same request again after ``idle_s`` idle seconds, sent while a cell is measured."""
    end = time.monotonic() + idle_s
    while time.monotonic() < end:
        cost_model_line(client)  # the page's tick: the session stays, the engine idle
        time.sleep(2.0)
    line, deadline = cost_model_line(client), time.monotonic() + 60
    while IDLE_CELL not in line and time.monotonic() < deadline:
        time.sleep(0.5)
        line = cost_model_line(client)
    during = first_request(client, prompt, max_tokens)
    return {
        "idle_s": idle_s,
        "cost_model_after_idle": line,
        "cell_running_when_asked": IDLE_CELL in line,
        "during_cell_request_s": during["first_request_s"],
        "during_cell_kinds": during["kinds"],
        "during_cell_steps": during["steps"],
        "during_cell_before_vllm_s": during["first_before_vllm_s"],
        # what stopping the cell cost the request: its time before vLLM, less the first request's
        "claim_wait_s": round(during["first_before_vllm_s"] - first_before_s, 2),
    }


def request_after_exploring(client: Client, prompt: str, max_tokens: int, explore_s: float) -> dict:
    """The same request again once idle time has measured its cells (``explore_s`` seconds, then
    until no cell has run for ``NO_CELL_S``, up to ``CELL_END_S`` more): the cells seen, the cost
    model's line. (Cells come one after another, ``idle_fill.PERIOD_S`` apart.)"""
    cells: list[str] = []
    end = time.monotonic() + explore_s
    last_cell_t = time.monotonic()
    while True:
        line = cost_model_line(client)  # the page's tick: the session stays, the engine idle
        cell = re.search(r"measuring (.+?) " + IDLE_CELL, line)
        if cell:
            last_cell_t = time.monotonic()
            if cell[1] not in cells:
                cells.append(cell[1])
        now = time.monotonic()
        if now > end + CELL_END_S or (now > end and now - last_cell_t > NO_CELL_S):
            break
        time.sleep(1.0)
    again = first_request(client, prompt, max_tokens)
    return {
        "explore_s": explore_s,
        "cells_explored": cells,
        "cost_model_explored": cost_model_line(client),
        "explored_request_s": again["first_request_s"],
        "explored_kinds": again["kinds"],
        "explored_steps": again["steps"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--cold", action="store_true", help="an empty cost-model cache (models linked in)")
    which.add_argument("--warm", action="store_true", help="the usual cache, cost model included")
    p.add_argument(
        "--keep-cache",
        action="store_true",
        help="--cold: copy the cost cache (a profile, a prior's timed cells) to the usual cache",
    )
    p.add_argument("--app-args", default="", help="more arguments for app.py, one string")
    p.add_argument("--prompt", default=FIRST_PROMPT)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--deadline-s", type=float, default=900.0)
    p.add_argument("--learn-s", type=float, default=0.0, help="seconds of background load before the request again")
    p.add_argument("--learn-load", type=int, default=4, help="background requests while learning (4)")
    p.add_argument("--idle-s", type=float, default=0.0, help="idle seconds, then the request during a cell")
    p.add_argument(
        "--explore-s", type=float, default=0.0, help="idle seconds for idle time's cells, then the request again"
    )
    p.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "cold_start_app.log")
    args = p.parse_args(argv)

    models = default_cache_dir()
    cache = fresh_cache(models) if args.cold else models
    app = start_app(shlex.split(args.app_args), args.log, env={"SPEC_EXPLORER_CACHE": str(cache)})
    try:
        marks = watch_launch(app, args.deadline_s)
        client = marks.pop("client")
        marks["cost_model_first"] = cost_model_line(client)
        marks |= first_request(client, args.prompt, args.max_tokens)
        if args.learn_s > 0:
            marks |= learned_request(client, args.prompt, args.max_tokens, args.learn_s, args.learn_load)
            marks["first_over_learned"] = round(marks["learned_request_s"] / marks["first_request_s"], 3)
        if args.explore_s > 0:
            marks |= request_after_exploring(client, args.prompt, args.max_tokens, args.explore_s)
            marks["first_over_explored"] = round(marks["explored_request_s"] / marks["first_request_s"], 3)
        if args.idle_s > 0:
            before_s = marks["first_before_vllm_s"]
            marks |= request_during_idle_cell(client, args.prompt, args.max_tokens, args.idle_s, before_s)
    finally:
        app.stop()
    if args.cold and args.keep_cache and (cache / "cost").is_dir():
        shutil.copytree(cache / "cost", models / "cost", dirs_exist_ok=True)
    if args.cold:
        shutil.rmtree(cache, ignore_errors=True)
    facts = machine_facts(dtype_in(shlex.split(args.app_args)))
    # the launch's seconds to a tenth; every other figure was rounded where it was measured
    row = {"start": "cold" if args.cold else "warm", "app_args": args.app_args, **facts} | {
        k: (round(v, 1) if isinstance(v, float) and k in LAUNCH_MARKS else v) for k, v in marks.items()
    }
    for key, value in row.items():
        print(f"{key:>18}: {value}")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
