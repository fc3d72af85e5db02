"""Start the explorer the way a Hugging Face Space does, time each phase, and report it.

    .venv/bin/python scripts/space_start.py                         # fresh venv, install, start, one request
    .venv/bin/python scripts/space_start.py --keep-venv /tmp/space-venv --install-only   # prepare a venv
    .venv/bin/python scripts/space_start.py --keep-venv /tmp/space-venv                  # reuse it

What a Space does, and so this script: a fresh virtual environment (``python3.11 -m venv``) and
``pip install -r requirements.txt`` with pip's own configuration on this machine (no
scripts/setup.sh, nothing uninstalled afterwards); then ``python app.py`` from the checkout with
``GRADIO_SERVER_NAME=0.0.0.0`` on a free port (``GRADIO_SERVER_PORT``), ``HF_HUB_OFFLINE=1`` and
empty caches (``SPEC_EXPLORER_CACHE``, which also holds the cost model, ``HF_HOME``,
``VLLM_CACHE_ROOT``, ``XDG_CACHE_HOME``: a new folder), so the packaged pair is assembled and
converted, vLLM starts, and the cost model is measured, as on a Space's first start.
``--keep-venv DIR`` uses DIR's environment when it has one (no install) and else installs into
DIR and keeps it. ``--pip-retries`` (default 0): PyTorch's CPU index in requirements.txt cannot be
reached from this project's machines, and with pip's default of 5 retries each of the ~200
packages waits ~8 s for it (26 min in all); a Space reaches it. The resolution is the same either way.

Phases, in seconds: install; from launch, the page answering (HTTP 200); the models built (the
status line leaves "resolving"/"assemble"/"convert"); vLLM started (the status says measuring or
ready); the cost model measured; ready ("● **Engine ready**", not measuring). The app's ``/status``
API is polled once a second through gradio_client. Then one request through ``/run`` (``--prompt``,
temperature 0, ``--max-tokens`` 32) must bring tokens back; then the app gets Ctrl-C (SIGINT to its
process group), then SIGKILL after 60 s, and whatever it started is killed by PID.

Memory: everything the script starts runs under ``--memory-gib`` (16, a Space's CPU hardware):
in a cgroup v1 memory group made for the run under this process's own memory group
(``memory.limit_in_bytes``; the peak of all processes together is ``memory.max_usage_in_bytes``,
page cache included), else by sampling the summed RSS of the process tree with psutil every
0.5 s and killing the tree above the limit. The summed RSS is sampled in both cases (shared pages
count once per process). The JSON says which was used.

Output: progress on stderr; a table of phases; the last line is JSON: ``ok``, ``failed`` (the
step and why), ``phases_s``, ``at_s`` (since launch), ``peak_gib`` / ``peak_rss_gib`` (the app),
``install_peak_gib``, ``memory_measured_by``, ``oom_kills``, the machine as every benchmark names it
(``cpu``, ``cores``, ``cpu_kind``, ``dtype``: ``engine.platform.machine_facts``), ``tokens``,
``stopped_cleanly``, ``logs``.
Exit status 1 when a step failed. Everything is bounded by ``--timeout-s`` in all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from gradio_client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, as a script

from engine_adapter.engine.launcher import free_port  # noqa: E402
from engine_adapter.engine.platform import machine_facts  # noqa: E402
from engine_adapter.package_data import PROJECT_ROOT  # noqa: E402
from tests.support.app_process import engine_ready  # noqa: E402
from tests.support.memory_limit import GIB, Memory, memory_guard  # noqa: E402

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
MODEL_STEP = re.compile(r"resolving (target|draft) model|\S+: (assemble|convert|done) \d+%")
PHASES = ("install", "page_up", "models_built", "vllm_started", "cost_model_measured", "ready", "request")
STOP_GRACE_S = 60.0
PRINT_EVERY_S = 15.0  # progress on stderr: each new kind of status, else at most this often


class StepFailed(RuntimeError):
    pass


def clean_env(venv: Path) -> dict[str, str]:
    """This process's environment (pip's configuration included) without this checkout's venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def run_bounded(what: str, cmd: list[str], log: Path, env: dict[str, str], mem: Memory, timeout_s: float) -> None:
    """Run ``cmd`` under the memory limit, output appended to ``log``; StepFailed unless it succeeds in time."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            mem.wrap(cmd), cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    mem.track(proc.pid)
    try:
        rc = proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise StepFailed(f"{what} took over {timeout_s:.0f} s; log {log}") from None
    if rc != 0 or mem.exceeded:
        tail = log.read_text(errors="replace")[-2000:]
        why = "over the memory limit" if mem.exceeded else f"exit status {rc}"
        raise StepFailed(f"{what}: {why}; log {log}:\n{tail}")


def install(venv: Path, args: argparse.Namespace, mem: Memory, log: Path, deadline: float) -> None:
    env = clean_env(venv)
    run_bounded("venv", [args.python, "-m", "venv", str(venv)], log, env, mem, deadline - time.monotonic())
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--retries", str(args.pip_retries)]
    run_bounded(
        "pip install -r requirements.txt", [*pip, "-r", "requirements.txt"], log, env, mem, deadline - time.monotonic()
    )


def status_kind(status: str) -> str:
    """models | vllm | measuring | ready | failed | restarting | other, for the /status text."""
    if engine_ready(status):
        return "ready"
    if "Measuring this machine" in status:
        return "measuring"
    if "**Engine starting**" in status:
        return "models" if MODEL_STEP.search(status.split(" — ", 1)[-1]) else "vllm"
    if "Engine down, restarting" in status or "Engine restarting after a fault" in status:
        return "restarting"
    if "✕" in status:
        return "failed"
    return "other"


def watch(proc: subprocess.Popen, url: str, log: Path, mem: Memory, deadline: float, at: dict) -> Client:
    """Poll until ready; ``at`` gets each phase mark's seconds since launch as it is reached."""
    t0, client, last, kind, last_kind, printed = time.monotonic(), None, "", "", "", 0.0
    reached = {"models_built": {"vllm", "measuring", "ready"}, "vllm_started": {"measuring", "ready"}}
    while time.monotonic() < deadline:
        if mem.oom_kills():
            raise StepFailed(f"the kernel killed a process at the {mem.limit / GIB:g} GiB memory limit; log {log}")
        if proc.poll() is not None or mem.exceeded:
            why = "over the memory limit" if mem.exceeded else f"exit status {proc.returncode}"
            raise StepFailed(f"the app stopped ({why}):\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if client is None and httpx.get(url, timeout=2).status_code == 200:
                at.setdefault("page_up", time.monotonic() - t0)
                client = Client(url, verbose=False, download_files=False, analytics_enabled=False)
            if client is not None:
                status = client.submit(api_name="/status").result(timeout=30)
                now, kind = time.monotonic() - t0, status_kind(status)
                for mark, kinds in reached.items():
                    if kind in kinds:
                        at.setdefault(mark, now)
                if kind == "measuring":
                    at.setdefault("measuring", now)
                if status != last and (kind != last_kind or now - printed >= PRINT_EVERY_S):
                    print(f"[{now:7.1f} s] {kind}: {status[:160]}", file=sys.stderr)
                    last, last_kind, printed = status, kind, now
                if kind in ("failed", "restarting"):
                    raise StepFailed(f"the status says: {status}")
                if kind == "ready":
                    if "measuring" in at:
                        at["cost_model_measured"] = now
                    at["ready"] = now
                    return client
        except StepFailed:
            raise
        except Exception as e:  # the server still coming up: connection refused, a queue not yet open, ...
            last_error = f"{type(e).__name__}: {e}"
            if client is not None and last != last_error:
                print(f"[{time.monotonic() - t0:7.1f} s] poll: {last_error[:160]}", file=sys.stderr)
                last = last_error
        time.sleep(1.0)
    raise StepFailed(f"not ready within the time left; last status: {last[:300]}; last kind {kind or 'none'}")


def one_request(client: Client, prompt: str, max_tokens: int, timeout_s: float) -> int:
    """Tokens the request brought back (from its trace line, the last of /run's outputs)."""
    out = client.submit(prompt, 0.0, max_tokens, api_name="/run").result(timeout=timeout_s)
    trace = out[-1] if isinstance(out, (list, tuple)) else out
    line = json.loads(trace) if isinstance(trace, str) and trace.strip() else {}
    tokens = len(line.get("kinds", []))
    if tokens == 0:
        raise StepFailed(f"the request brought no tokens back: {str(out)[:500]}")
    return tokens


def stop(proc: subprocess.Popen) -> bool:
    """Ctrl-C to the app's process group; SIGKILL after STOP_GRACE_S. Whether it ended by itself."""
    if proc.poll() is not None:
        return True
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=STOP_GRACE_S)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return False
    except ProcessLookupError:
        proc.wait(timeout=10)
        return True


def launch(venv: Path, work: Path, mem: Memory, log: Path) -> tuple[subprocess.Popen, str]:
    cache = work / "cache"
    (cache / "spec-explorer").mkdir(parents=True)
    port = free_port()
    env = clean_env(venv) | {
        "GRADIO_SERVER_NAME": "0.0.0.0",
        "GRADIO_SERVER_PORT": str(port),
        "HF_HUB_OFFLINE": "1",
        "SPEC_EXPLORER_CACHE": str(cache / "spec-explorer"),  # models and cost models
        "HF_HOME": str(cache / "huggingface"),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "XDG_CACHE_HOME": str(cache),
        "PYTHONUNBUFFERED": "1",  # the log as it happens
    }
    with log.open("wb") as out:
        cmd = mem.wrap([str(venv / "bin" / "python"), "app.py"])
        proc = subprocess.Popen(
            cmd, cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    mem.track(proc.pid)
    return proc, f"http://127.0.0.1:{port}"


def run(args: argparse.Namespace, work: Path, mem: Memory, report: dict) -> None:
    deadline = time.monotonic() + args.timeout_s
    venv = args.keep_venv or work / "venv"
    if (venv / "bin" / "python").exists():
        print(f"space_start: reusing {venv} (no install)", file=sys.stderr)
        report["venv_reused"] = str(venv)
    else:
        print(f"space_start: installing requirements.txt into {venv}", file=sys.stderr)
        t = time.monotonic()
        install(venv, args, mem, work / "install.log", deadline)
        report["phases_s"]["install"] = time.monotonic() - t
        report["install_peak_gib"] = mem.peak() / GIB
    if args.install_only:
        return
    mem.reset_peak()
    proc, url = launch(venv, work, mem, work / "app.log")
    try:
        client = watch(proc, url, work / "app.log", mem, deadline, report["at_s"])
        t = time.monotonic()
        report["tokens"] = one_request(client, args.prompt, args.max_tokens, max(1.0, deadline - t))
        report["phases_s"]["request"] = time.monotonic() - t
    finally:
        report["stopped_cleanly"] = stop(proc)
        time.sleep(2)  # the engine's supervisor sees its lifeline close and stops vLLM
        wait_until = time.monotonic() + 15
        while mem.alive() and time.monotonic() < wait_until:
            time.sleep(0.5)
        report["left_running"] = mem.kill_all()
        report["stopped_cleanly"] = report["stopped_cleanly"] and not report["left_running"]
        report["peak_gib"] = mem.peak() / GIB
        report["peak_rss_gib"] = mem.peak_rss / GIB


def phase_durations(at: dict[str, float]) -> dict[str, float]:
    """Each mark's distance from the one before it (launch first)."""
    out, prev = {}, 0.0
    for name in PHASES[1:-1]:
        if name in at:
            out[name] = at[name] - prev
            prev = at[name]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keep-venv", type=Path, help="use this venv (install into it first if it has none) and keep it")
    p.add_argument("--install-only", action="store_true", help="stop after the install")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="everything, install included")
    p.add_argument("--memory-gib", type=float, default=16.0)
    p.add_argument("--pip-retries", type=int, default=0)
    p.add_argument("--python", default="python3.11", help="the Python that makes the venv")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="space-start-"))
    mem = memory_guard(int(args.memory_gib * GIB))
    report: dict = {"ok": False, "failed": None, "phases_s": {}, "at_s": {}} | machine_facts()
    report |= {"memory_limit_gib": args.memory_gib, "memory_measured_by": mem.how, "logs": str(work)}
    try:
        run(args, work, mem, report)
        report["ok"] = True
    except StepFailed as e:
        report["failed"] = str(e)
    except KeyboardInterrupt:
        report["failed"] = "interrupted"
    except Exception as e:  # the request's errors (gradio_client's, a timeout), a broken machine
        report["failed"] = f"{type(e).__name__}: {e}"
    finally:
        mem.kill_all()
        report["oom_kills"] = mem.oom_kills()
        mem.close()
        for bulky in ([work / "venv"] if args.keep_venv is None else []) + [work / "cache"]:
            shutil.rmtree(bulky, ignore_errors=True)  # the logs stay in `work`
    phases = report["phases_s"] | phase_durations(report["at_s"])
    report["phases_s"] = {name: phases[name] for name in PHASES if name in phases}
    print_report(report)
    return 0 if report["ok"] else 1


def print_report(report: dict) -> None:
    def cell(value: float | None, width: int) -> str:
        return f"{value:{width}.1f}" if value is not None else "-".rjust(width)

    print(f"{'phase':<22}{'seconds':>10}{'since launch':>15}")
    for name in PHASES:
        print(f"{name:<22}{cell(report['phases_s'].get(name), 10)}{cell(report['at_s'].get(name), 15)}")
    peak, rss, install_peak = report.get("peak_gib"), report.get("peak_rss_gib"), report.get("install_peak_gib")
    print(
        f"peak memory of the app {cell(peak, 0)} GiB, summed RSS {cell(rss, 0)} GiB, install {cell(install_peak, 0)} "
        f"GiB (limit {report['memory_limit_gib']:g} GiB; {report['memory_measured_by']}); CPU {report['cpu']}"
    )
    if report["failed"]:
        print(f"FAILED: {report['failed']}")
    out = {k: round(v, 2) if isinstance(v, float) else v for k, v in report.items()}
    for key in ("phases_s", "at_s"):
        out[key] = {name: round(s, 1) for name, s in report[key].items()}
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
