"""Run a command so that it can never outlive the process that started it.

Usage (by the launcher, never by hand):
    python -m engine_adapter.engine.supervise [--exit-file PATH] -- CMD ARGS...

The launcher starts this in a new session (its own process group) with a pipe
on stdin. We start CMD in the same group and wait. If the pipe closes (the app
exited, crashed or was killed with SIGKILL) or we get SIGTERM/SIGINT, we end
the whole process group: SIGTERM, then SIGKILL after a grace period. vLLM's
API server spawns an engine-core and a worker process; all of them are in the
group, so none is orphaned. The exit status is vLLM's, or 128+S when vLLM
died of signal S (the engine watchdog reports it in words); with ``--exit-file``
that status is also written to PATH the moment CMD dies by itself, before the
group is ended.

``group_members(pgid)`` lists the live processes of a group (the tests use it too).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 8.0


def _kill_group(grace_s: float = GRACE_S) -> None:
    pgid = os.getpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # we are in the group too
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not [pid for pid in group_members(pgid) if pid != os.getpid()]:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group ``pgid``, from /proc."""
    return _live_with(2, pgid)  # /proc/PID/stat after the name: state, ppid, pgrp, session


def children_of(pid: int) -> list[int]:
    """PIDs of the live processes whose parent is ``pid``, from /proc."""
    return _live_with(1, pid)


def session_members(sid: int) -> list[int]:
    """PIDs of the live processes in session ``sid`` (an app started with start_new_session,
    and the engines it started in process groups of their own)."""
    return _live_with(3, sid)


def _live_with(field: int, value: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[field]) == value and fields[0] != "Z":
            members.append(int(entry))
    return members


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: python -m engine_adapter.engine.supervise -- CMD ...", file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1 :]
    opts = argv[: argv.index("--")]
    exit_file = opts[opts.index("--exit-file") + 1] if "--exit-file" in opts else None
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_parent() -> None:
        # stdin is the launcher's pipe: EOF means the launcher is gone
        try:
            while os.read(0, 1):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    while not stop.is_set() and child.poll() is None:
        stop.wait(0.2)
    code = child.poll()
    if code is not None and code < 0:  # say it in the log; exit 128+S like a shell, for the watchdog
        print(
            f"engine_adapter.engine.supervise: the vLLM server (pid {child.pid}) was killed by signal {-code}",
            file=sys.stderr,
            flush=True,
        )
        code = 128 - code
    if exit_file and code is not None and not stop.is_set():  # it died by itself: tell the watchdog now,
        with open(exit_file, "w") as f:  # not after the group is gone (that takes seconds)
            f.write(f"{code}\n")
    _kill_group()
    return code if code is not None else 143


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
