"""Find the processes a test started (by a path in their command line) and wait for them to end."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_mentioning(needle: str) -> list[int]:
    """PIDs whose command line contains ``needle`` (this test process excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state != "Z":
            found.append(int(entry))
    return found


def wait_gone(needle: str, timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = processes_mentioning(needle)
        if not left:
            return []
        time.sleep(0.5)
    return processes_mentioning(needle)
