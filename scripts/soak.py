"""Soak the launched explorer with simulated users, then check nothing leaked.

    .venv/bin/python scripts/soak.py [--users 20] [--hostile 0 | --heavy 0] [--duration 600] [--seed 0] [--public]
        (--url http://127.0.0.1:PORT --pid APP_PID | -- APP ARGS...)

Without --url it launches ``app.py`` (a free port; on 0.0.0.0 with ``--public`` or any hostile
user, reached through 127.0.0.1) with the app arguments after ``--`` (default: the packaged
pair) and stops it at the end. Each user is a visitor of its own (``X-Forwarded-For``, which the
app's server takes from a client on loopback). ``--hostile N`` makes N of the users strangers
(``tests.support.hostile.HostileUser``: flooding the polls, guessing the presenter key, calling the
locked endpoints, uploading an oversized CSV, opening many sessions), run in a process of their
own; ``--heavy N``, the comparison: N quiet visitors that only hold the background load a
hostile visitor's many sessions are granted (``MAX_BACKGROUND_PER_VISITOR``) and poll like a page.
Each user is a ``gradio_client`` session that, until the deadline, picks at
random: run a preset prompt (16-48 tokens; a quarter of the runs are stopped once they stream,
as a person presses Stop: a plain call to ``/gradio_api/run/stop`` outside the queue, as the page
sends it), move its load slider (0-8), poll
the live charts like an open page does, or close its tab (the client's
heartbeat ends: Gradio's unload fires) and come back as a new session.
Everything is bounded: loopback only, --duration seconds of actions, then every
user leaves; the script waits up to --drain-s for the background load to end.

Report (JSON last line): requests served, Stops pressed and runs that ended "Stopped" (a run
may finish before its Stop lands), the well-behaved users' errors by action and kind (the hostile
users' outcomes apart), their step-to-screen latency (each streamed update's arrival at the
client after the engine step it shows, ``data-t``: one clock, one machine; p50/p95), whether the
engine-wide settings were the same at the end, background requests
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
import subprocess
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
from tests.support.hostile import engine_servers  # noqa: E402

CLIENT_TIMEOUT_S = 120.0  # a page waits for a busy server; httpx's default 5 s would count it as an error
STOP_SHARE = 0.25  # of the users' runs, those stopped once they stream


def app_rss_mib(pid: int) -> float:
    """RSS of the app process alone (its engine is a child with its own, steady, model memory)."""
    return psutil.Process(pid).memory_info().rss / 2**20


def engine_url(pid: int) -> str | None:
    """The app's vLLM server (its process, as a public page names no address)."""
    ports = [port for _, port, twin in engine_servers(pid) if not twin]
    return f"http://127.0.0.1:{ports[0]}" if ports else None


def settings_of(status: str) -> str:
    """The engine-wide settings in a status line: method and K policy (or K)."""
    m = re.search(r"\((method \*\*[^)]*\))", status)
    return m.group(1) if m else status


def newest_step_t(view: object) -> float | None:
    """The engine time (``Step.t``) of the newest step a token view's value shows."""
    html = view.get("html", "") if isinstance(view, dict) else ""
    times = [float(t) for t in re.findall(r'data-t="([0-9.]+)"', html)]
    return max(times) if times else None


def engine_requests(url: str) -> tuple[float, float]:
    """(running, waiting) from vLLM's own /metrics."""
    snap = parse_metrics(httpx.get(f"{url}/metrics", timeout=5).text)
    return snap.running, snap.waiting


class User(threading.Thread):
    def __init__(self, n: int, url: str, deadline: float, seed: int, prompts: list[str], tally, latencies) -> None:
        super().__init__(name=f"user-{n}", daemon=True)
        self.url, self.deadline, self.prompts, self.tally = url, deadline, prompts, tally
        self.latencies = latencies  # seconds from an engine step to its arrival here, appended
        self.address = f"10.{n // 250}.{n % 250}.1"
        self.rng = random.Random(seed * 1000 + n)

    def run(self) -> None:
        client = self._connect()
        while time.monotonic() < self.deadline and client is not None:
            action = self.rng.choices(["run", "load", "poll", "close"], weights=[4, 3, 4, 1])[0]
            try:
                if action == "run":
                    self.tally("served" if self._run(client) else "run_refused")
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
            except Exception as e:  # counted by action and kind; the soak goes on
                self.tally(f"error: {action}: {type(e).__name__}: {str(e)[:80]}")
                time.sleep(1.0)
            time.sleep(self.rng.uniform(0.2, 1.5))
        if client is not None:
            client.close()  # everyone leaves at the end

    def _run(self, client: Client) -> bool:
        """One request, streamed as the page gets it, perhaps stopped; True if it was served (its
        final numbers, or its stopped view)."""
        job = client.submit(self.rng.choice(self.prompts), 0.0, self.rng.choice([16, 32, 48]), api_name="/run")
        stop_it = self.rng.random() < STOP_SHARE
        last = None
        for out in job:
            t = newest_step_t(out[0])
            if t is not None:
                self.latencies.append(time.monotonic() - t)
            if stop_it and out[0].get("streaming") and out[0].get("steps"):
                self._press_stop(client)
                self.tally("stops")
                stop_it = False
            last = out
        result = job.outputs()[-1] if job.outputs() else last
        stopped = bool(result) and (result[0].get("footer") or "").startswith("Stopped:")
        if stopped:
            self.tally("stopped")
        return bool(result and (result[4] or stopped))

    def _press_stop(self, client: Client) -> None:
        """Stop as the page sends it: a plain call outside the queue (``queue=False``), not an event on
        the session's message stream, which the run's last message may be closing at that moment
        (gradio_client then fails the event with an empty CancelledError)."""
        httpx.post(
            f"{self.url.rstrip('/')}/gradio_api/run/stop",
            json={"data": [], "session_hash": client.session_hash},
            headers={"x-forwarded-for": self.address},
            timeout=CLIENT_TIMEOUT_S,
        ).raise_for_status()

    def _connect(self) -> Client | None:
        for _ in range(5):
            try:
                return Client(
                    self.url,
                    verbose=False,
                    headers={"x-forwarded-for": self.address},
                    httpx_kwargs={"timeout": CLIENT_TIMEOUT_S},
                )
            except Exception as e:
                self.tally(f"error: connect: {type(e).__name__}")
                time.sleep(2.0)
        return None


def soak(
    url: str,
    pid: int,
    users: int,
    duration: float,
    seed: int,
    drain_s: float,
    baseline_after: float = 0.25,
    others: tuple[str, int] = ("hostile", 0),
) -> dict:
    """``others``: (kind, count) of the visitors run by tests.support.hostile in a process of their own."""
    counts: collections.Counter[str] = collections.Counter()
    latencies: list[float] = []
    lock = threading.Lock()

    def tally(kind: str) -> None:
        with lock:
            counts[kind] += 1

    probe = Client(url, verbose=False, headers={"x-forwarded-for": "10.255.255.1"})
    settings = settings_of(probe.predict(api_name="/status"))
    engine = engine_url(pid)
    probe.predict("Warm up.", 0.0, 8, api_name="/run")
    prompts = [p.prompt for p in load_presets()]
    deadline = time.monotonic() + duration
    kind, n_others = others
    crowd = [User(n, url, deadline, seed, prompts, tally, latencies) for n in range(users - n_others)]
    strangers = None
    if n_others:
        cmd = [sys.executable, "-m", "tests.support.hostile", "users", url, "--kind", kind, "--count", str(n_others)]
        cmd += ["--seconds", str(duration), "--seed", str(seed)]
        strangers = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    for u in crowd:
        u.start()
    # the baseline is taken once every user has been served a while (first sessions, caches,
    # compiled handlers are not a leak): after `baseline_after` of the run
    time.sleep(duration * baseline_after)
    rss0 = app_rss_mib(pid)
    for u in crowd:
        u.join(timeout=duration + 300)
    others_report = json.loads(strangers.communicate(timeout=300)[0].strip().splitlines()[-1]) if strangers else {}
    t_left = time.monotonic()
    left = (-1.0, -1.0)
    while time.monotonic() - t_left < drain_s:  # unload (or the idle expiry) stops every session's load
        left = engine_requests(engine) if engine else (-1.0, -1.0)
        if left == (0.0, 0.0):
            break
        time.sleep(2.0)
    rss1 = app_rss_mib(pid)
    settings_after = settings_of(probe.predict(api_name="/status"))
    probe.close()
    errors = {k[7:]: v for k, v in counts.items() if k.startswith("error: ")}
    lat = sorted(latencies)
    report = {
        "users": users,
        "others": {"kind": kind, "count": n_others, "cpu_s": others_report.get("cpu_s")},
        "duration_s": duration,
        "latency_ms_p50": round(1000 * lat[len(lat) // 2], 1) if lat else None,
        "latency_ms_p95": round(1000 * lat[int(len(lat) * 0.95)], 1) if lat else None,
        "latency_samples": len(lat),
        "others_outcomes": others_report.get("outcomes", {}),
        "settings_unchanged": settings_after == settings,
        "served": counts["served"],
        "refused": counts["run_refused"],
        "stops": counts["stops"],
        "stopped": counts["stopped"],
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
    report["ok"] = (
        left == (0.0, 0.0)
        and report["app_rss_growth"] < 0.10
        and report["served"] > 0
        and not errors
        and report["settings_unchanged"]
        and not report["others_outcomes"].get("settings_changed")
    )
    return report


def launch(app_args: list[str], public: bool) -> AppProcess:
    host = ["--host", "0.0.0.0"] if public else []  # reached through 127.0.0.1 all the same
    app = start_app([*app_args, *host], Path(tempfile.mkdtemp(prefix="soak-")) / "app.log")
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
    p.add_argument("--hostile", type=int, default=0, help="how many of the users are hostile (implies --public)")
    p.add_argument("--heavy", type=int, default=0, help="how many are quiet visitors holding a visitor's load")
    p.add_argument("--public", action="store_true", help="launch the app on 0.0.0.0, as a Space or a workshop")
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
        app = launch(app_args, public=args.public or args.hostile > 0 or args.heavy > 0)
        url, pid = app.url, app.proc.pid
    try:
        others = ("hostile", args.hostile) if args.hostile else ("heavy", args.heavy)
        report = soak(url, pid, args.users, args.duration, args.seed, args.drain_s, args.baseline_after, others)
    finally:
        if app is not None:
            app.stop()
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
