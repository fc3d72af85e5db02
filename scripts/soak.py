"""Soak the launched explorer with simulated users, then check nothing leaked.

    .venv/bin/python scripts/soak.py [--users 20] [--duration 600] [--seed 0]
        (--url http://127.0.0.1:PORT --pid APP_PID | -- APP ARGS...)

Without --url it launches ``app.py`` (127.0.0.1, a free port) with the app
arguments after ``--`` (default: the packaged pair) and stops it at the end.
Each user is a ``gradio_client`` session that, until the deadline, picks at
random: run a preset prompt (16-48 tokens), move its load slider (0-8), poll
the live charts like an open page does, or close its tab (the client's
heartbeat ends: Gradio's unload fires) and come back as a new session.
Everything is bounded: loopback only, --duration seconds of actions, then every
user leaves; the script waits up to --drain-s for the background load to end.

Report (JSON last line): requests served, errors by kind, background requests
still running in the engine after everyone left (must be 0; read from vLLM's
own /metrics), the app process's memory (RSS, with its children) at the start
(after --baseline-after of the run, a quarter by default, once every user has
been served: warm-up is not a leak) and at the end,
and the growth (must be < 10 %). Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from gradio_client import Client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_adapter.engine.prometheus import parse_metrics  # noqa: E402
from engine_adapter.prompts import load_presets  # noqa: E402
from tests.support.app_process import AppNotReady, AppProcess, engine_ready, start_app, wait_ready  # noqa: E402

CLIENT_TIMEOUT_S = 120.0  # a page waits for a busy server; httpx's default 5 s would count it as an error


def app_rss_mib(pid: int) -> float:
    """RSS of the app process alone (its engine is a child with its own, steady, model memory)."""
    return psutil.Process(pid).memory_info().rss / 2**20


def engine_url(status: str) -> str | None:
    m = re.search(r"at `(http://127\.0\.0\.1:\d+)`", status)
    return m.group(1) if m else None


def engine_requests(url: str) -> tuple[float, float]:
    """(running, waiting) from vLLM's own /metrics."""
    snap = parse_metrics(httpx.get(f"{url}/metrics", timeout=5).text)
    return snap.running, snap.waiting


class User(threading.Thread):
    def __init__(self, n: int, url: str, deadline: float, seed: int, prompts: list[str], tally) -> None:
        super().__init__(name=f"user-{n}", daemon=True)
        self.url, self.deadline, self.prompts, self.tally = url, deadline, prompts, tally
        self.rng = random.Random(seed * 1000 + n)

    def run(self) -> None:
        client = self._connect()
        while time.monotonic() < self.deadline and client is not None:
            action = self.rng.choices(["run", "load", "poll", "close"], weights=[4, 3, 4, 1])[0]
            try:
                if action == "run":
                    _view, _card, _h, _p, trace = client.predict(
                        self.rng.choice(self.prompts), 0.0, self.rng.choice([16, 32, 48]), api_name="/run"
                    )
                    self.tally("served" if trace else "run_refused")
                elif action == "load":
                    said = client.predict(self.rng.randint(0, 8), api_name="/set_load")
                    self.tally("load_set" if not said.startswith("✕") else "load_refused")
                elif action == "poll":
                    client.predict(api_name="/charts")
                    self.tally("polls")
                else:  # the tab closes: the heartbeat ends and Gradio's unload fires
                    client.close()
                    self.tally("tab_closes")
                    time.sleep(self.rng.uniform(0.5, 3.0))
                    client = self._connect()
            except Exception as e:  # counted by kind; the soak goes on
                self.tally(f"error: {type(e).__name__}: {str(e)[:80]}")
                time.sleep(1.0)
            time.sleep(self.rng.uniform(0.2, 1.5))
        if client is not None:
            client.close()  # everyone leaves at the end

    def _connect(self) -> Client | None:
        for _ in range(5):
            try:
                return Client(self.url, verbose=False, httpx_kwargs={"timeout": CLIENT_TIMEOUT_S})
            except Exception as e:
                self.tally(f"error: connect: {type(e).__name__}")
                time.sleep(2.0)
        return None


def soak(
    url: str, pid: int, users: int, duration: float, seed: int, drain_s: float, baseline_after: float = 0.25
) -> dict:
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def tally(kind: str) -> None:
        with lock:
            counts[kind] += 1

    probe = Client(url, verbose=False)
    status = probe.predict(api_name="/status")
    engine = engine_url(status)
    probe.predict("Warm up.", 0.0, 8, api_name="/run")
    probe.close()
    prompts = [p.prompt for p in load_presets()]
    deadline = time.monotonic() + duration
    crowd = [User(n, url, deadline, seed, prompts, tally) for n in range(users)]
    for u in crowd:
        u.start()
    # the baseline is taken once every user has been served a while (first sessions, caches,
    # compiled handlers are not a leak): after `baseline_after` of the run
    time.sleep(duration * baseline_after)
    rss0 = app_rss_mib(pid)
    for u in crowd:
        u.join(timeout=duration + 300)
    t_left = time.monotonic()
    left = (-1.0, -1.0)
    while time.monotonic() - t_left < drain_s:  # unload (or the idle expiry) stops every session's load
        left = engine_requests(engine) if engine else (-1.0, -1.0)
        if left == (0.0, 0.0):
            break
        time.sleep(2.0)
    rss1 = app_rss_mib(pid)
    errors = {k[7:]: v for k, v in counts.items() if k.startswith("error: ")}
    report = {
        "users": users,
        "duration_s": duration,
        "served": counts["served"],
        "refused": counts["run_refused"],
        "load_moves": counts["load_set"],
        "polls": counts["polls"],
        "tab_closes": counts["tab_closes"],
        "errors": errors,
        "engine_running_after": left[0],
        "engine_waiting_after": left[1],
        "drained_in_s": round(time.monotonic() - t_left, 1),
        "app_rss_mib_start": round(rss0, 1),
        "app_rss_mib_end": round(rss1, 1),
        "app_rss_growth": round(rss1 / rss0 - 1, 4),
    }
    report["ok"] = left == (0.0, 0.0) and report["app_rss_growth"] < 0.10 and report["served"] > 0 and not errors
    return report


def launch(app_args: list[str]) -> AppProcess:
    app = start_app(app_args, Path(tempfile.mkdtemp(prefix="soak-")) / "app.log")
    try:
        wait_ready(app, engine_ready, timeout_s=900, poll_s=2.0)
    except AppNotReady as e:
        app.stop()
        raise SystemExit(str(e)) from None
    return app


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    app_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drain-s", type=float, default=180.0, help="how long the load may take to stop after all leave")
    p.add_argument(
        "--baseline-after",
        type=float,
        default=0.25,
        help="take the memory baseline after this fraction of the run (warm-up is not a leak)",
    )
    p.add_argument("--url", default=None)
    p.add_argument("--pid", type=int, default=None, help="the app's PID (with --url), for its memory")
    args = p.parse_args(argv)
    app = None
    if args.url:
        if not args.url.startswith("http://127.0.0.1:"):
            raise SystemExit("the soak drives loopback only: --url http://127.0.0.1:PORT")
        if args.pid is None:
            raise SystemExit("--url needs --pid (the app's process, for its memory)")
        url, pid = args.url, args.pid
    else:
        app = launch(app_args)
        url, pid = app.url, app.proc.pid
    try:
        report = soak(url, pid, args.users, args.duration, args.seed, args.drain_s, args.baseline_after)
    finally:
        if app is not None:
            app.stop()
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
