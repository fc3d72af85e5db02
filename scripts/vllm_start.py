"""Time vLLM alone, started with app.py's default engine settings: where a launch's seconds go.

    .venv/bin/python scripts/vllm_start.py                       # app.py's defaults
    .venv/bin/python scripts/vllm_start.py --env MALLOC_MMAP_MAX_=0 --log /tmp/vllm.log
    .venv/bin/python scripts/vllm_start.py --main vllm.entrypoints.openai.api_server   # vLLM's own main module

Builds the engine config app.py builds with no flags, resolves the models (the packaged pair by
default), and starts ``python -m SERVER_MODULE`` (or ``--main``) with our ``server_args``
and ``engine_env`` on 127.0.0.1 (a free port), with no app, tap or page around it. Each line of
vLLM's log is written to ``--log`` with the seconds since the spawn in front. Once ``/health``
answers (or 400 s pass), each of vLLM's processes is read from /proc (RSS, minor page faults,
user and system CPU seconds), the whole process group is stopped by its PID, and the phases
found in the log and the readings are printed, JSON last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as a script

import app  # noqa: E402
from engine_adapter.engine.launcher import EngineProcess, engine_env, free_port  # noqa: E402
from engine_adapter.engine.server_args import server_args  # noqa: E402
from engine_adapter.engine.supervise import group_members  # noqa: E402
from engine_adapter.vllm_plugin.paths import SERVER_MODULE  # noqa: E402

# log text -> phase name: the first line containing it marks the phase's end
PHASES = {
    "Starting to load model": "imports (API server, engine core, worker)",
    "Loading weights took": "target weights",
    "Loading drafter model": "target after its weights (packing)",
    "GiB for KV cache": "draft weights and packing",
    "init engine": "KV cache",
    "Starting vLLM server": "to serving",
}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_reading(pid: int) -> dict:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the name: state, ppid, ...
    rss_kib = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS")
    )
    return {
        "comm": Path(f"/proc/{pid}/comm").read_text().strip(),
        "rss_gib": round(rss_kib / (1 << 20), 2),
        "minflt": int(fields[7]),
        "user_s": int(fields[11]) / CLOCK_TICKS,
        "system_s": int(fields[12]) / CLOCK_TICKS,
    }


def phases(log_lines: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds each phase took, from the first log line marking its end."""
    marks, last = {}, 0.0
    for needle, name in PHASES.items():
        t = next((t for t, line in log_lines if needle in line and t >= last), None)
        if t is not None:
            marks[name] = round(t - last, 1)
            last = t
    return marks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="add to vLLM's environment")
    default_log = str(Path(tempfile.gettempdir()) / "vllm_start.log")
    p.add_argument("--log", default=default_log, help="vLLM's log, seconds since the spawn in front")
    p.add_argument("--timeout", type=float, default=400.0)
    p.add_argument("--main", default=SERVER_MODULE, help="the module vLLM's server runs as (python -m MAIN)")
    o = p.parse_args()

    config = app.engine_config(app.parse_args([]))  # what `python app.py` starts
    engine = EngineProcess(config)
    engine.prepare()
    port = free_port()
    args = server_args(config, str(engine.target_dir), str(engine.draft_dir), port, engine.platform)
    env = engine_env(config, None, None, engine.platform) | dict(kv.split("=", 1) for kv in o.env)
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", o.main, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )

    def read_log() -> None:
        with open(o.log, "w") as log:
            for raw in proc.stdout:
                t, line = time.monotonic() - t0, raw.decode(errors="replace")
                lines.append((t, line))
                log.write(f"{t:7.1f} {line}")

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    ready_s = None
    try:
        while time.monotonic() - t0 < o.timeout and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    ready_s = round(time.monotonic() - t0, 1)
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        readings = [process_reading(pid) for pid in group_members(proc.pid)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(5)
    result = {"ready_s": ready_s, "phases_s": phases(lines), "processes": readings, "env": o.env, "log": o.log}
    for name, seconds in result["phases_s"].items():
        print(f"{name:>42}: {seconds:6.1f} s")
    for r in readings:
        cpu = f"{r['user_s']} s user, {r['system_s']} s system"
        print(f"{r['comm']:>42}: {r['rss_gib']} GiB, {r['minflt']} minor faults, {cpu}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
