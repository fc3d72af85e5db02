"""Hostile clients and their controls, as separate processes (tests and scripts/soak.py run them).

    python -m tests.support.hostile flood URL [--threads 12] [--seconds 20]
    python -m tests.support.hostile burn --cores F [--seconds 20]
    python -m tests.support.hostile users URL --kind hostile|heavy [--count 5] [--seconds 600] [--seed 0]

``flood`` polls what an open page's timers call (the status line, ``/explorer/top_lines``, and the
charts, ``/gradio_api/run/charts``) from ``--threads`` threads as fast as the app answers, each
call naming no session (Gradio builds a new one for each), and prints a JSON line: calls, answers by HTTP
status, and the CPU seconds this process used. ``burn`` keeps ``--cores`` cores busy (a duty
cycle per process) for as long: the flood's own CPU, spent on nothing, to tell what the app's
answers cost the engine from what the flooding process itself takes. Both stop by themselves.
``engine_servers(app_pid)``: the vLLM servers an app started, (pid, port, is the speculation-off
twin); ``presenter_key(log_text)``: the key an app made itself on a public bind, from its log.
``users`` runs a soak's other visitors in a process of their own (so that their client-side work
does not share the soak's well-behaved users' interpreter): ``hostile`` ones (``HostileUser``) or,
for the comparison, ``heavy`` ones (``HeavyUser``: a page that holds the background load a visitor
may have and polls like an open page, nothing more); it prints their outcomes and CPU seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import random
import re
import threading
import time
from collections.abc import Callable

import httpx
import psutil

# /charts' inputs: four session states (ignored: the step times, the page's request id, the policy
# panel's and the ledger's drawn keys), then the draw flag
CHARTS_DATA = [None, None, None, None, True]


def presenter_key(log_text: str) -> str | None:
    m = re.search(r"locked behind the key (\S+) ", log_text)
    return m.group(1) if m else None


def engine_servers(app_pid: int) -> list[tuple[int, int, bool]]:
    """(pid, port, twin) of each vLLM server under the app (the supervisor's child)."""
    found = []
    for proc in psutil.Process(app_pid).children(recursive=True):
        try:
            cmd = proc.cmdline()
        except psutil.Error:
            continue
        program = cmd[cmd.index("-m") + 1] if "-m" in cmd else None  # not its supervisor, which names it too
        if program == "engine_adapter.vllm_plugin.server_main" and "--port" in cmd:
            port = int(cmd[cmd.index("--port") + 1])
            found.append((proc.pid, port, "--speculative-config" not in cmd))
    return found


def flood(url: str, threads: int, seconds: float) -> dict:
    statuses: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(i: int) -> None:
        with httpx.Client(base_url=url, timeout=10.0) as http:
            n = i
            while time.monotonic() < deadline:
                n += 1
                try:
                    if n % 2:
                        status = str(http.get("/explorer/top_lines").status_code)
                    else:
                        status = str(http.post("/gradio_api/run/charts", json={"data": CHARTS_DATA}).status_code)
                except httpx.HTTPError as e:
                    status = type(e).__name__
                with lock:
                    statuses[status] += 1

    cpu0 = psutil.Process().cpu_times()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    cpu1 = psutil.Process().cpu_times()
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {"calls": sum(statuses.values()), "statuses": dict(statuses), "cpu_s": round(cpu, 2), "seconds": seconds}


def _duty(share: float, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    period = 0.01
    while time.monotonic() < deadline:
        start = time.monotonic()
        while time.monotonic() - start < period * share:
            pass
        time.sleep(period * (1.0 - share))


def burn(cores: float, seconds: float) -> dict:
    n = max(1, int(cores + 0.999))
    procs = [multiprocessing.Process(target=_duty, args=(min(cores / n, 1.0), seconds)) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(seconds + 10)
        if p.is_alive():
            p.kill()
    return {"cores": cores, "processes": n, "seconds": seconds}


LOCKED_CALLS: tuple[tuple[str, tuple], ...] = (
    ("/apply", ("ngram", 2)),
    ("/set_policy", ("off", 0, {"headers": ["start_bs", "end_bs", "K"], "data": [[1, 64, 0]]})),
    ("/profile", ()),
    ("/set_acceptance", ("relaxed", 5, 0.2, 0.1, 0.2)),
)


class HostileUser(threading.Thread):
    """A stranger who tries what the page must hold against, until ``deadline``: floods the polls,
    guesses the presenter key, calls the locked engine-wide endpoints, uploads an oversized CSV,
    opens many sessions asking for the whole background load. ``tally(kind)`` counts what
    happened; ``settings_changed`` is what must never be counted."""

    def __init__(self, n: int, url: str, deadline: float, seed: int, tally: Callable[[str], None], big_csv: str):
        super().__init__(name=f"hostile-{n}", daemon=True)
        self.url, self.deadline, self.tally, self.big_csv = url, deadline, tally, big_csv
        self.address = f"203.0.113.{n + 1}"
        self.rng = random.Random(seed * 7919 + n)

    def client(self):  # a gradio_client.Client (imported here: the flood's process has no use for it)
        from gradio_client import Client

        return Client(self.url, verbose=False, headers={"x-forwarded-for": self.address})

    def run(self) -> None:
        actions = {
            "flood": self.flood,
            "guess": self.guess,
            "locked": self.locked,
            "upload": self.upload,
            "sessions": self.sessions,
        }
        while time.monotonic() < self.deadline:
            name = self.rng.choice(list(actions))
            try:
                actions[name]()
            except Exception as e:  # the app refusing a hostile client is expected; counted by kind
                self.tally(f"hostile {name} refused: {type(e).__name__}")
            time.sleep(self.rng.uniform(0.1, 1.0))

    def flood(self) -> None:
        headers = {"x-forwarded-for": self.address}
        with httpx.Client(base_url=self.url, timeout=10.0, headers=headers) as http:
            for i in range(40):
                if i % 2:
                    status = http.get("/explorer/top_lines").status_code
                else:
                    status = http.post("/gradio_api/run/charts", json={"data": CHARTS_DATA}).status_code
                self.tally(f"hostile poll {status}")

    def guess(self) -> None:
        c = self.client()
        try:
            for _ in range(3):
                said = c.predict(f"guess-{self.rng.random()}", api_name="/unlock")[0]
                self.tally("hostile guess held" if "try again" in said else "hostile guess wrong")
        finally:
            c.close()

    def locked(self) -> None:
        c = self.client()
        try:
            api, args = self.rng.choice(LOCKED_CALLS)
            said = c.predict(*args, api_name=api)
            self.tally("hostile locked refused" if "locked by the presenter" in said else "settings_changed")
        finally:
            c.close()

    def upload(self) -> None:
        from gradio_client import handle_file

        c = self.client()
        try:
            c.predict(handle_file(self.big_csv), api_name="/sweep_upload")
            self.tally("hostile upload accepted")
        finally:
            c.close()

    def sessions(self) -> None:
        opened = [self.client() for _ in range(5)]
        for c in opened:
            c.predict(64, api_name="/set_load")
            self.tally("hostile session asked 64")
        # abandoned without closing their tabs: the idle expiry ends their load


class HeavyUser(threading.Thread):
    """A quiet visitor who holds ``MAX_BACKGROUND_PER_VISITOR`` background requests and polls like an
    open page: the background load a hostile visitor's many sessions are granted, without the rest."""

    def __init__(self, n: int, url: str, deadline: float, seed: int, tally: Callable[[str], None], *_: object):
        super().__init__(name=f"heavy-{n}", daemon=True)
        self.url, self.deadline, self.tally = url, deadline, tally
        self.address = f"198.18.0.{n + 1}"

    def run(self) -> None:
        from gradio_client import Client

        from engine_adapter.service.fair_share import MAX_BACKGROUND_PER_VISITOR

        c = Client(self.url, verbose=False, headers={"x-forwarded-for": self.address})
        try:
            c.predict(MAX_BACKGROUND_PER_VISITOR, api_name="/set_load")
            while time.monotonic() < self.deadline:
                c.predict(api_name="/charts")
                self.tally("heavy poll")
                time.sleep(2.0)
        except Exception as e:
            self.tally(f"heavy error: {type(e).__name__}")
        finally:
            c.close()


def users(url: str, kind: str, count: int, seconds: float, seed: int) -> dict:
    import tempfile

    outcomes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def tally(what: str) -> None:
        with lock:
            outcomes[what] += 1

    big = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    big.write("policy,concurrency\n" + "off,1\n" * 400_000)  # 2.4 MB: over the upload cap
    big.close()
    deadline = time.monotonic() + seconds
    who = HostileUser if kind == "hostile" else HeavyUser
    crowd = [who(n, url, deadline, seed, tally, big.name) for n in range(count)]
    cpu0 = psutil.Process().cpu_times()
    for u in crowd:
        u.start()
    for u in crowd:
        u.join(seconds + 120)
    cpu1 = psutil.Process().cpu_times()
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {"kind": kind, "count": count, "outcomes": dict(outcomes), "cpu_s": round(cpu, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    f = sub.add_parser("flood")
    f.add_argument("url")
    f.add_argument("--threads", type=int, default=12)
    f.add_argument("--seconds", type=float, default=20.0)
    b = sub.add_parser("burn")
    b.add_argument("--cores", type=float, required=True)
    b.add_argument("--seconds", type=float, default=20.0)
    u = sub.add_parser("users")
    u.add_argument("url")
    u.add_argument("--kind", choices=("hostile", "heavy"), required=True)
    u.add_argument("--count", type=int, default=5)
    u.add_argument("--seconds", type=float, default=600.0)
    u.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.what == "flood":
        result = flood(args.url, args.threads, args.seconds)
    elif args.what == "burn":
        result = burn(args.cores, args.seconds)
    else:
        result = users(args.url, args.kind, args.count, args.seconds, args.seed)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
