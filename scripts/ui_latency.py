"""UI latency: engine step -> tokens in the token view, and the live charts' refresh rate, under load.

    .venv/bin/python scripts/ui_latency.py [--tiny [DIR] | --target SPEC --draft SPEC]
        [--loads 0,16,64] [--requests 3] [--max-tokens 64] [--app-arg=--k=5 ...] [--app-args "..."]

Launches ``app.py`` (127.0.0.1, a free port; the packaged pair by default, the tiny test
models of tests/support/tiny_models.py with ``--tiny``; ``--app-arg`` / ``--app-args`` go
to app.py as they are, to compare engine settings), opens it in Debian's chromium
(Playwright, headless), waits for ``#engine-status`` to say the engine is ready (and done
measuring its cost model), and at each background load (the page's own ``#load`` slider)
runs ``--requests`` foreground requests (``#prompt``, ``#run``) of ``--max-tokens`` tokens.

What it measures, in the browser: a MutationObserver on ``#token-view`` notes the page's
clock (``performance.timeOrigin + performance.now()``, ms) when each step's span
(``data-step``, ``data-t`` = ``Step.t``, the engine host's ``time.monotonic()`` at the end
of the step) first appears; the latency is that minus the step's time on the page's clock.
Both clocks are monotonic (Chromium's ``performance.now()`` and Python's ``time.monotonic()``
read Linux's CLOCK_MONOTONIC: engine, app, browser and this script share one host); their
offset is measured here through the page, at the start and again at the end (``drift_ms``).
The wall clock (``Date.now()``, ``time.time()``) is not used: a virtual machine's clock can
be stepped by seconds in the middle of a run (seen: 4.9 s). A tee of Gradio's
event stream (``/queue/data``, read through ``fetch``) notes when the page's script first
read each step's ``data-t`` (in the token view's markup, JSON-escaped): the part of the
latency before rendering (the read runs on the page's main thread, so it is an upper bound
on the wire arrival). Plotly's
``plotly_react`` event on ``#live-charts`` counts the live charts' redraws per second over
the level's window (requests plus at least ``--window-s``). Statistics:
engine_adapter/measure/ui_latency.py. Report: a table, then JSON as the last line (with the
machine: CPU, cores, CPU kind, dtype).

Bounded: one app (and its engine) and one browser, all on loopback, every wait with a
timeout, the whole run under ``--deadline-s``; the load is set back to 0 and the app is
stopped by its PID (SIGINT, then SIGKILL of its session) at the end, on errors and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_adapter.engine.platform import dtype_in, machine_facts  # noqa: E402
from engine_adapter.engine_config import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402
from engine_adapter.measure.ui_latency import (  # noqa: E402
    LevelResult,
    StepSeen,
    clock_offset,
    steal_share,
    summarise_level,
    table,
)
from engine_adapter.prompts import load_presets  # noqa: E402
from tests.support.app_process import CHROMIUM_ARGS, AppProcess, start_app, tiny_app_args  # noqa: E402

# Before the page's own scripts: the first arrival of each step's data-t in Gradio's event stream (or its
# "ts", the token view's older JSON, so runs against older commits time the same thing)
# (/queue/data, read through fetch), from a tee of the stream the page reads unchanged.
NET_TAP_JS = r"""(() => {
  // the page's clock (ms, monotonic), for every time this script takes (PAGE_NOW_JS, OBSERVER_JS)
  const PAGE_NOW = window.__uiLatencyNow = () => performance.timeOrigin + performance.now();
  const net = window.__uiLatencyNet = {};
  const orig = window.fetch;
  window.fetch = async (...args) => {
    const r = await orig(...args);
    const url = String((args[0] && args[0].url) || args[0]);
    if (!url.includes('/queue/data') || !r.body) return r;
    const [mine, theirs] = r.body.tee();
    (async () => {
      const rd = mine.getReader(), dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const {done, value} = await rd.read();
        if (done) break;
        const now = PAGE_NOW();
        buf += dec.decode(value, {stream: true});
        const cut = buf.lastIndexOf('\n');
        if (cut < 0) continue;
        const found = buf.slice(0, cut).matchAll(/(?:data-t=\\"|"ts":\s*")([0-9.]+)/g);
        for (const m of found) if (!(m[1] in net)) net[m[1]] = now;
        buf = buf.slice(cut + 1);
      }
    })();
    return new Response(theirs, {headers: r.headers, status: r.status, statusText: r.statusText});
  };
})();"""
PAGE_NOW_JS = "() => window.__uiLatencyNow()"  # the page's clock, ms (monotonic; defined in NET_TAP_JS)
# Installed once in the page: first sightings of token-view steps, and live-chart redraws.
OBSERVER_JS = """() => {
  if (window.__uiLatency) return;
  const PAGE_NOW = window.__uiLatencyNow;
  const st = window.__uiLatency = {steps: [], charts: [], seen: new Set(), gd: null};
  const view = document.querySelector('#token-view');
  const scan = () => {
    const now = PAGE_NOW();
    for (const el of view.querySelectorAll('.tv-step[data-t]')) {
      const key = el.dataset.step + '@' + el.dataset.t;
      if (st.seen.has(key)) continue;
      st.seen.add(key);
      st.steps.push({step: +el.dataset.step, t: el.dataset.t, seen_ms: now,
                     tokens: el.querySelectorAll('.tv-tok:not(.k-rejected)').length});
    }
  };
  new MutationObserver(scan).observe(view, {childList: true, subtree: true, attributes: true,
                                            attributeFilter: ['data-t']});
  st.long = [];  // the main thread's long tasks (over 50 ms): [start, duration], epoch ms
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) st.long.push([performance.timeOrigin + e.startTime, e.duration]);
  }).observe({type: 'longtask', buffered: true});
  scan();
  const hook = () => {
    const gd = document.querySelector('#live-charts .js-plotly-plot');
    if (gd && gd !== st.gd && typeof gd.on === 'function') {
      st.gd = gd;
      gd.on('plotly_react', () => st.charts.push(PAGE_NOW()));
    }
  };
  hook();
  setInterval(hook, 250);
}"""
DONE_JS = """(n0) => {
  const v = document.querySelector('#token-view');
  if (v.querySelector('.tv-message.tv-error, .tv-message.tv-warn')) return true;
  return window.__uiLatency.steps.length > n0 && !!v.querySelector('.tv-footer') && !v.querySelector('.tv-cursor');
}"""


@dataclass
class Settings:
    """The command line, parsed."""

    loads: list[int]
    requests: int
    max_tokens: int
    prompt: str
    window_s: float
    settle_s: float
    drop_events: list[str]
    request_timeout_s: float
    ready_timeout_s: float
    app_pid: int | None = None  # the app's process: its CPU, its engine's and the browser's per level


def cpu_seconds(app_pid: int | None) -> dict[str, dict[int, float]]:
    """CPU seconds so far of the app's own process, the engine it started (its descendants) and the
    browser (every chromium process: the one this script drives), per process."""
    groups: dict[str, list[psutil.Process]] = {"app": [], "engine": [], "browser": []}
    if app_pid is not None:
        try:
            app = psutil.Process(app_pid)
            groups["app"], groups["engine"] = [app], app.children(recursive=True)
        except psutil.Error:
            pass
    groups["browser"] = [p for p in psutil.process_iter(["name"]) if "chrom" in (p.info["name"] or "").lower()]
    out: dict[str, dict[int, float]] = {}
    for name, procs in groups.items():
        out[name] = {}
        for proc in procs:
            try:
                times = proc.cpu_times()
                out[name][proc.pid] = times.user + times.system
            except psutil.Error:
                pass
    return out


def cpu_cores(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]], wall_s: float) -> dict:
    """Cores each group used between two ``cpu_seconds`` (a process that ended in between is not counted)."""
    return {
        name: round(sum(t - before.get(name, {}).get(pid, 0.0) for pid, t in now.items()) / wall_s, 3)
        for name, now in after.items()
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default=None, help=f"target model (default: {DEFAULT_TARGET}, or the tiny target)")
    p.add_argument("--draft", default=None, help=f"draft model (default: {DEFAULT_DRAFT}, or the tiny perturbed)")
    p.add_argument(
        "--tiny",
        nargs="?",
        const=str(Path(tempfile.gettempdir()) / "spec-explorer-tiny-models"),
        default=None,
        metavar="DIR",
        help="build (once) and use the tiny test models in DIR",
    )
    p.add_argument("--app-arg", action="append", default=[], help="one more app.py argument (repeatable)")
    p.add_argument("--app-args", default="", help="more app.py arguments, one shell-quoted string")
    p.add_argument("--loads", default="0,16,64", help="background loads (the page's slider), comma-separated")
    p.add_argument("--requests", type=int, default=3, help="foreground requests per load level")
    p.add_argument("--max-tokens", type=int, default=64, help="max tokens of each foreground request (8..)")
    p.add_argument("--prompt", default=None, help="the foreground prompt (default: the first preset's)")
    p.add_argument("--window-s", type=float, default=10.0, help="least seconds of chart window per level")
    p.add_argument("--settle-s", type=float, default=3.0, help="seconds after the load is running, before measuring")
    p.add_argument("--request-timeout-s", type=float, default=180.0)
    p.add_argument("--ready-timeout-s", type=float, default=420.0, help="engine start and cost-model profiling")
    p.add_argument("--deadline-s", type=float, default=1500.0, help="the whole run, then everything is stopped")
    p.add_argument(
        "--drop-events",
        default="",
        help="an experiment: the page's events with these API names (comma-separated, e.g. charts; "
        "top_lines: the status line's fetch) are never sent to the app, to measure what they cost the token view",
    )
    p.add_argument("--log", default=None, help="the app's log file (default: a temporary file)")
    return p.parse_args(argv)


def app_arguments(args: argparse.Namespace) -> list[str]:
    extra = [*args.app_arg, *shlex.split(args.app_args)]
    if args.tiny:
        from tests.support.tiny_models import build_tiny_family

        fam = build_tiny_family(Path(args.tiny))
        # as the tests run them (tests/support/app_process.tiny_app_args): the worker on one core
        tiny = tiny_app_args(Path(args.target or fam.target), Path(args.draft or fam.perturbed), "--k", "3")
        return ["--host", "127.0.0.1", *tiny, *extra]
    models = ["--target", args.target or DEFAULT_TARGET, "--draft", args.draft or DEFAULT_DRAFT]
    return ["--host", "127.0.0.1", *models, *extra]


def wait_serving(app: AppProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.proc.poll() is not None:
            raise RuntimeError(f"the app exited ({app.proc.returncode}):\n{app.log_tail()}")
        try:
            if httpx.get(app.url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the app did not serve within {timeout_s:.0f} s:\n{app.log_tail()}")


def readout_numbers(text: str) -> tuple[int | None, int | None]:
    """(background requests in flight, requests running in the engine) from #load-readout."""
    flight = re.search(r"(\d+)\s+in flight", text)
    running = re.search(r"running in the engine:\s*(\d+)", text)
    return (int(flight.group(1)) if flight else 0), (int(running.group(1)) if running else None)


def readout_tokens_per_s(text: str) -> float | None:
    """The background load's tokens/s from #load-readout (None without a load)."""
    m = re.search(r"([0-9.]+)\s*tokens/s", text)
    return float(m.group(1)) if m else None


class Session:
    """One browser page on the app: the load slider, foreground runs, the observer's records."""

    def __init__(self, page: Any, settings: Settings) -> None:
        self.page, self.s = page, settings
        self.request_no = 0

    def wait_engine_ready(self) -> None:
        pg, ms = self.page, self.s.ready_timeout_s * 1000
        pg.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=ms)
        pg.wait_for_function(
            "() => !document.querySelector('#engine-status').innerText.includes('Measuring the cost model')",
            timeout=ms,
        )
        pg.evaluate(OBSERVER_JS)
        number = pg.locator('input[aria-label="number input for Max tokens"]')
        number.fill(str(self.s.max_tokens))
        number.press("Enter")
        pg.locator("#prompt textarea").fill(self.s.prompt)

    def set_load(self, n: int, timeout_s: float = 90.0) -> int | None:
        """Ask for ``n`` background requests; wait until they are in flight; the engine's running count."""
        pg = self.page
        number = pg.locator("#load input[type=number]")
        number.fill(str(n))
        number.press("Enter")
        want = f"{n} requested" if n else "No background load"
        pg.wait_for_function(
            f"() => document.querySelector('#load-readout').innerText.includes({want!r})", timeout=30_000
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            flight, running = readout_numbers(pg.locator("#load-readout").inner_text())
            if (n and flight >= n) or (not n and (running or 0) <= 1):
                return running
            pg.wait_for_timeout(500)
        raise RuntimeError(
            f"load {n}: not in flight within {timeout_s:.0f} s: {pg.locator('#load-readout').inner_text()}"
        )

    def run_once(self) -> tuple[list[StepSeen], int]:
        """One foreground request: the steps the page showed, and the engine steps its footer reports."""
        pg = self.page
        n0 = pg.evaluate("() => window.__uiLatency.steps.length")
        pg.locator("#run").click()
        # polled every 100 ms, not every frame: the page's main thread is what is measured
        pg.wait_for_function(DONE_JS, arg=n0, timeout=self.s.request_timeout_s * 1000, polling=100)
        rows = pg.evaluate("(n0) => window.__uiLatency.steps.slice(n0)", n0)
        net = pg.evaluate("() => window.__uiLatencyNet || {}")
        footer = pg.locator("#token-view .tv-footer")
        m = re.search(r"(\d+) engine steps", footer.inner_text()) if footer.count() else None
        if m is None:
            raise RuntimeError(f"request ended without a footer: {pg.locator('#token-view').inner_text()[-500:]}")
        no = self.request_no
        self.request_no += 1
        seen = [
            StepSeen(no, int(r["step"]), float(r["t"]), float(r["seen_ms"]), int(r["tokens"]), net.get(r["t"]))
            for r in rows
        ]
        return seen, int(m.group(1))

    def level(self, load: int, offset_s: float) -> LevelResult:
        running = self.set_load(load)
        self.page.wait_for_timeout(self.s.settle_s * 1000)
        start_ms = self.page.evaluate(PAGE_NOW_JS)
        cpu_before = psutil.cpu_times()
        procs_before, t_before = cpu_seconds(self.s.app_pid), time.monotonic()
        seen: list[StepSeen] = []
        expected = 0
        for _ in range(self.s.requests):
            got, n = self.run_once()
            seen += got
            expected += n
        readout = self.page.locator("#load-readout").inner_text()
        _, now_running = readout_numbers(readout)
        left_ms = start_ms + self.s.window_s * 1000 - self.page.evaluate(PAGE_NOW_JS)
        if left_ms > 0:
            self.page.wait_for_timeout(left_ms)
        end_ms = self.page.evaluate(PAGE_NOW_JS)
        steal = steal_share(cpu_before, psutil.cpu_times())
        cores = cpu_cores(procs_before, cpu_seconds(self.s.app_pid), time.monotonic() - t_before)
        charts = self.page.evaluate("() => window.__uiLatency.charts")
        ticks = self.page.evaluate("() => (window.__specExplorerLiveChart || {log: []}).log")
        print(f"   the live chart's last ticks (page ms, what, ms): {ticks[-12:]}", file=sys.stderr, flush=True)
        long_tasks = [tuple(x) for x in self.page.evaluate("() => window.__uiLatency.long")]
        seen_running = max(x for x in (running, now_running, 0) if x is not None)
        bg_rate = readout_tokens_per_s(readout) if load else 0.0
        return summarise_level(
            load,
            self.s.requests,
            seen,
            offset_s,
            expected,
            charts,
            (start_ms, end_ms),
            seen_running,
            bg_rate,
            long_tasks,
            steal,
            cores,
        )


def drop_events(page: Any, url: str, api_names: list[str]) -> None:
    """Answer the page's calls of these events ourselves, so the app never runs them: a queued event's join
    (a timer whose tick never completes does not tick again: Gradio's trigger_mode "once"), a plain
    (queue=False) event's request with "no change" for each output, and a fetch of the endpoint by name
    (the status line's timer fetches it from the app's HTTP door, ``top_lines``) with 503."""
    deps = httpx.get(f"{url}/config", timeout=10).json()["dependencies"]
    chosen = {d["id"]: d for d in deps if d.get("api_name") in api_names}
    if "top_lines" in api_names:  # not a Gradio event: the page fetches it from the app's HTTP door
        page.route("**/explorer/top_lines", lambda route: route.fulfill(status=503, body="dropped"))
        api_names = [n for n in api_names if n != "top_lines"]
    missing = set(api_names) - {d.get("api_name") for d in deps}
    if missing:
        raise RuntimeError(f"--drop-events: no event named {sorted(missing)}")

    def join(route: Any) -> None:
        body = route.request.post_data_json or {}
        if body.get("fn_index") in chosen:
            route.fulfill(status=200, json={"event_id": f"dropped-{body.get('fn_index')}"})
        else:
            route.continue_()

    def plain(route: Any) -> None:
        body = route.request.post_data_json or {}
        dep = chosen.get(body.get("fn_index"))
        if dep is None:
            route.continue_()
            return
        unchanged = [{"__type__": "update"}] * len(dep.get("outputs", []))
        route.fulfill(status=200, json={"data": unchanged, "is_generating": False, "changed_state_ids": []})

    page.route("**/queue/join*", join)
    page.route("**/run/predict*", plain)
    for name in api_names:
        page.route(f"**/run/{name}", lambda route: route.fulfill(status=503, body="dropped"))


def page_clock_offset(page: Any) -> tuple[float, float]:
    """(the page's clock - time.monotonic(), bracket) in seconds, read through the page."""
    return clock_offset(lambda: page.evaluate(PAGE_NOW_JS) / 1000.0, time.monotonic)


def measure(url: str, settings: Settings) -> tuple[list[LevelResult], dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise RuntimeError("Debian's chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.add_init_script(NET_TAP_JS)
            if settings.drop_events:
                drop_events(page, url, settings.drop_events)
            page.goto(url)
            offset_start, width = page_clock_offset(page)
            session = Session(page, settings)
            session.wait_engine_ready()
            results = []
            try:
                for load in settings.loads:
                    results.append(session.level(load, offset_start))
                    print(table(results[-1:]).splitlines()[1], file=sys.stderr, flush=True)
            finally:
                try:
                    session.set_load(0)
                except Exception as e:  # the app's stop ends the load anyway; keep the first error
                    print(f"could not set the load back to 0: {e}", file=sys.stderr)
            version = browser.version
            offset_end, _ = page_clock_offset(page)
        finally:
            browser.close()
    clock = {
        "page_minus_monotonic_s": round(offset_start, 6),
        "bracket_us": round(width * 1e6, 1),
        "drift_ms": round((offset_end - offset_start) * 1000, 3),
    }
    return results, {"chromium": version, "clock": clock}


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if out.returncode == 0 else None


def descendants(pid: int) -> list[int]:
    """PIDs the app started (its engine's supervisor, vLLM's server, engine core, worker), by ancestry."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def stop_app(app: AppProcess, started: list[int]) -> tuple[bool, list[int]]:
    """Ctrl-C the app (SIGKILL of its session after 60 s); then SIGKILL by PID whatever it started that
    is still alive after 30 s. Returns (exited on Ctrl-C, PIDs that had to be killed)."""
    started = sorted(set(started) | set(descendants(app.proc.pid)))
    clean = app.stop(timeout_s=60)
    procs = []
    for pid in started:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=30)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return clean, [proc.pid for proc in alive]


def _deadline(seconds: float) -> None:
    def expire(*_: Any) -> None:
        raise TimeoutError(f"the run passed --deadline-s {seconds:.0f}")

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(max(int(seconds), 1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings(
        loads=[int(x) for x in args.loads.split(",") if x.strip()],
        requests=args.requests,
        max_tokens=args.max_tokens,
        prompt=args.prompt or load_presets()[0].prompt,
        window_s=args.window_s,
        settle_s=args.settle_s,
        drop_events=[x.strip() for x in args.drop_events.split(",") if x.strip()],
        request_timeout_s=args.request_timeout_s,
        ready_timeout_s=args.ready_timeout_s,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` stops the app too, through finally
    _deadline(args.deadline_s)
    app_args = app_arguments(args)
    log = Path(args.log) if args.log else Path(tempfile.mkdtemp(prefix="ui-latency-")) / "app.log"
    t0 = time.monotonic()
    app = start_app(app_args, log)
    started: list[int] = []
    try:
        wait_serving(app, args.ready_timeout_s)
        started = descendants(app.proc.pid)
        settings.app_pid = app.proc.pid
        results, extra = measure(app.url, settings)
    finally:
        signal.alarm(0)
        clean, left = stop_app(app, started)
    print(table(results))
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "app_args": app_args,
        **machine_facts(dtype_in(app_args)),
        "max_tokens": settings.max_tokens,
        "requests_per_level": settings.requests,
        "dropped_events": settings.drop_events,
        "prompt": settings.prompt,
        "levels": [asdict(r) | {"total_tokens_per_s": r.total_tokens_per_s} for r in results],
        **extra,
        "app_exited_on_sigint": clean,
        "killed_after_stop": left,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(report))
    return 0 if clean and not left else 1


if __name__ == "__main__":
    sys.exit(main())
