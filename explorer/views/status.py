"""The page's status lines: the engine, a replay, the K policy, the background load.

Contract: Markdown text from a ``Backend`` (engine_adapter.service.backend) or
its records, nothing else:
- ``status_markdown(backend, public)``: the line under the title (state, config, start
  progress, how long the start took and measured this machine, a fault being recovered from, a
  restart someone asked for; a replay's position instead); ``public``: for strangers, with no
  engine address or server path in it (``for_visitors``);
- ``replay_status_markdown(info)``: that line for a ``ReplayInfo`` (file,
  recorded config, position and length in m:ss, speed);
- ``policy_status_markdown(view)``: the K policy in force, the cost model,
  profiling progress and the machine's part in one request's speedup
  (``outlook_sentence``), for a ``PolicyView``;
- ``acceptance_banner_markdown(status)``: the banner every page shows while a lossy
  acceptance rule is in force ("" under vLLM's lossless rule);
- ``load_readout_markdown(backend, session)``: one session's background load
  against everyone's (requests in flight, tokens per second), the requests
  running in the engine, and whatever holds the load back or stopped it;
- ``recording_banner_markdown(status)``: the notice every page shows while ``--record``
  writes the session, and why it stopped if it did (the app's log has the whole error);
- ``for_visitors(text)``: ``text`` without loopback URLs (the engine's port) or absolute
  server paths (logs, caches), for a public page.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from engine_adapter.engine_config import FULL_VARIANT, VARIANT_LABELS
from engine_adapter.policy.k_policy import OneRequestOutlook, one_request_outlook
from engine_adapter.service.backend import Backend, RecordingStatus, ReplayInfo, ServiceStatus, StartTimes
from explorer.views.token_view import plural

if TYPE_CHECKING:
    from engine_adapter.policy.live_state import PolicyView

BAR_CELLS = 20  # characters of the start-progress bar
RUNNING_WINDOW_S = 2.0  # "requests running in the engine": the largest batch in this many seconds
LOOPBACK_URL = re.compile(r"https?://(?:127\.\d+\.\d+\.\d+|localhost|\[::1\]|0\.0\.0\.0)(?::\d+)?[^\s`'\"),]*")
SERVER_PATH = re.compile(r"(?<![\w.:/])(?:/[\w.@+~-]+){2,}/?")


def for_visitors(text: str) -> str:
    """``text`` for a stranger: no engine address (its port) and no absolute path on the server."""
    return SERVER_PATH.sub("(a file on the server: see the app's log)", LOOPBACK_URL.sub("its local address", text))


def status_markdown(backend: Backend, public: bool = False) -> str:
    line = _status_line(backend, public)
    return for_visitors(line) if public else line


def _status_line(backend: Backend, public: bool) -> str:
    if backend.recording is not None:  # a recorded session, no engine
        return replay_status_markdown(backend.recording.info())
    st = backend.status()
    what = _config_text(st, backend.policy_view() if st.state == "ready" else None)
    if st.acceptance.lossy:
        what += f", acceptance **{st.acceptance.describe()}**"
    due = st.restart_due_in_s
    pending = "" if due is None else f" A restart was asked for: it starts in {due:.0f} s."
    if st.state == "ready":
        # the watchdog brought it back (engine_adapter/service/watchdog.py)
        where = "" if public else f" at `{st.url}`"
        return (
            f"● **Engine ready** ({what}){where}."
            + _started_text(st.started)
            + (f" Restarted by itself after: {st.fault}." if st.fault else "")
            + pending
        )
    if st.state == "starting":
        return _starting_markdown(st, what) + pending
    if st.state == "restarting":  # dead or hung; requests in flight ended with this message
        return f"⚠ **Engine down, restarting:** {st.error}"
    if st.state == "failed":
        return f"✕ **Engine {'down' if st.fault else 'failed to start'}:** {st.error}"
    return f"○ Engine {st.state}."


def acceptance_banner_markdown(st: ServiceStatus) -> str:
    if not st.acceptance.lossy:
        return ""
    return (
        f"## ⚠ Lossy acceptance rule in force: {st.acceptance.describe()}\n"
        "Outputs are **not the target model's**: drafts its own rule would reject are kept (yellow, wavy "
        "**relaxed** tokens). The rule is engine-wide: every visitor's requests run under it."
    )


def _config_text(st: ServiceStatus, policy: PolicyView | None) -> str:
    """The method and the K policy in force (live policies, once ready: the profiler sets K while
    it measures), else the K the engine was started with."""
    cfg = st.config
    if st.attached:
        return "attached server"
    if cfg is None:
        return ""
    variant = "" if cfg.variant == FULL_VARIANT else f", **{VARIANT_LABELS.get(cfg.variant, cfg.variant)}**"
    if policy is not None and policy.available and policy.state is not None:
        policy_text = f"K policy **{policy.state.spec.describe()}** (K up to {policy.k_max})"
        return f"method **{cfg.method}**{variant}, {policy_text}"
    return f"method **{cfg.method}**{variant}, K={cfg.k}" + (f", K table {cfg.k_table}" if cfg.k_table else "")


def _started_text(started: StartTimes | None) -> str:
    """How long the start took, and its measurement of this machine (the lesson's first chapter,
    named after it is over: on small models it lasts about as long as a page's status poll)."""
    if started is None:
        return ""
    if started.measuring_s is None:
        return f" Started in {started.total_s:.0f} s."
    return (
        f" Started in {started.total_s:.0f} s, {started.measuring_s:.1f} s of it spent measuring this machine's "
        "step times (the step-time picture below)."
    )


def _starting_markdown(st: ServiceStatus, what: str) -> str:
    p = st.progress
    frac = p.fraction if p else 0.0
    filled = int(frac * BAR_CELLS)
    bar = "█" * filled + "░" * (BAR_CELLS - filled)
    message = p.message if p else ""
    if p is not None and p.stage == "measure":  # the lesson's first chapter: what a step costs here
        return (
            f"◐ **Measuring this machine** ({what}): `{bar}` {frac:.0%} — {message}. The engine runs its own "
            "requests at each batch size and K to learn what a step costs (the step-time picture below fills "
            "in cell by cell); your requests start when it is done."
        )
    if st.fault:
        return f"◐ **Engine restarting after a fault** ({what}): `{bar}` {frac:.0%} — {message}. Cause: {st.fault}"
    return f"◐ **Engine starting** ({what}): `{bar}` {frac:.0%} — {message}"


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


def recorded_config_text(header: dict[str, Any]) -> str:
    method = header.get("method") or "?"
    parts = [f"method **{method}**"]
    if method not in ("off", "attach") and header.get("k") is not None:
        parts.append(f"K={header['k']}")
    if header.get("k_table"):
        parts.append(f"K table {header['k_table']}")
    target = (header.get("config") or {}).get("target") or header.get("target")
    if target:
        parts.append(f"target `{target}`")
    if header.get("draft"):
        parts.append(f"draft `{header['draft']}`")
    return ", ".join(parts)


def replay_status_markdown(info: ReplayInfo) -> str:
    h = info.header
    when = h.get("started_at") or "?"
    line = (
        f"▶ **Replay** of `{info.name}` (recorded {when} with vLLM {h.get('vllm_version') or '?'}; "
        f"{recorded_config_text(h)}) at **{info.speed:g}x**: **{_clock(info.position_s)}** of "
        f"{_clock(info.duration_s)}"
        + (f", loop {info.loop + 1}" if info.loop else "")
        + f"; recorded background load **{info.load}**. No engine is running: every number on this page "
        "is the recording's."
    )
    if info.note:
        line += f"\n\nⓘ {info.note}"
    return line


def policy_status_markdown(v: PolicyView) -> str:
    if not v.available:
        return f"Live K policies are not available here: {v.why_not}."
    parts = []
    if v.state is not None:
        applied = (
            f"applied at engine step {v.applied_seq}"
            if v.applied_seq
            else "sent; the engine applies it at its next step"
        )
        parts.append(f"**In force:** {v.state.spec.describe()} ({applied}).")
    if v.profiling:
        parts.append(f"◐ **Measuring the cost model:** {v.profiling}. A policy chosen now applies when it ends.")
    elif v.cost is not None:
        source = v.cost_note or {
            "profiled": "measured on this machine by this launch",
            "cache": "measured earlier on this machine (cache)",
        }.get(v.cost_source or "", "source unknown")
        parts.append(
            f"Cost model: {source}; {len(v.cost.points)} cells in its fit, knee ≈ {v.cost.knee_tokens:.0f} "
            "tokens per step."
        )
        if v.profile_estimate_s is not None:
            parts.append(f"Measuring again stops visitors' requests for about {v.profile_estimate_s:.0f} s.")
        outlook = one_request_outlook(v.cost, v.alphas, v.k_max)
        if outlook is not None:
            parts.append(outlook_sentence(outlook))
    if v.error:
        parts.append(f"✕ {v.error}")
    return " ".join(parts)


def outlook_sentence(o: OneRequestOutlook) -> str:
    """The hardware's part in every speedup, in one sentence (``k_policy.one_request_outlook``)."""
    costs = (
        f"The machine's part: a plain step takes {o.plain_s * 1e3:.0f} ms; at K={o.k} a draft pass costs "
        f"{o.draft_pass_share:.2f} of it and verifying {o.k + 1} tokens {o.verify_share:.2f}"
    )
    if o.speedup <= 1.0:
        return f"{costs}, so with the acceptance measured no K pays at one request (K={o.k}: {o.speedup:.2f}x)."
    return f"{costs}, so with the acceptance measured one request gets about {o.speedup:.2f}x plain decoding."


def _engine_running_markdown(backend: Backend) -> str:
    last_steps = backend.steps_since(time.monotonic() - RUNNING_WINDOW_S)
    running = max((s.batch_size for s in last_steps), default=0)
    if backend.status().attached and backend.prom_history():
        running = int(backend.prom_history()[-1].running)
    engine = f"Requests running in the engine: **{running}**."
    view = backend.policy_view()
    if view.profiling:  # its requests are in that count
        engine += " The cost model is being measured meanwhile: its requests count here too."
    elif view.filling:
        engine += (
            f" The engine is idle, so it measures the cost model ({view.filling}): those requests count here"
            " too, and stop when anyone's request comes."
        )
    return engine


def _held_back(share: Any, state: str) -> str:
    """Why this session's load is less than it asked, or stopped: the page always says."""
    if share.ended:
        return f" ⏹ Your background load stopped: {share.ended}."
    if share.asked and state != "ready":
        return f" ⏸ The engine is {state}: your {share.asked} requests start when it is ready."
    if share.asked > share.granted:
        caps = f"the cap of {share.cap} is shared by {plural(share.visitors, 'visitor')}"
        if share.visitor_cap is not None and share.granted >= min(share.asked, share.visitor_cap):
            caps += f", and one visitor (all tabs and scripts from one address) gets at most {share.visitor_cap}"
        return f" Granted {share.granted} of {share.asked}: {caps}."
    return ""


def load_readout_markdown(backend: Backend, session: str) -> str:
    st = backend.background_stats()
    share = backend.background_share(session)
    engine = _engine_running_markdown(backend)
    why = _held_back(share, backend.status().state)
    if (st is None or st.in_flight == 0) and share.total == 0:
        return f"No background load. {engine}{why}"
    mine = (
        f"Your background load: **{share.asked}** requested, **{share.granted}** granted"
        if share.asked
        else "You ask for no background load"
    )
    shared = f" (the cap of {share.cap} is shared by {plural(share.sessions, 'session')})"
    in_flight, done, failed = (st.in_flight, st.completed, st.failed) if st else (0, 0, 0)
    err = f" Last error: {st.last_error}" if st and st.last_error else ""
    stopped = f" The load stopped: {st.stopped}." if st and st.stopped else ""
    mix = backend.load_mix()
    kinds = f" Its prompts: {mix.describe()}." if mix.available else ""
    return (
        f"{mine}{shared}. All sessions: **{in_flight}** in flight, {done} done, "
        f"{failed} failed; **{backend.background_tokens_per_second():.1f} tokens/s**.{kinds} "
        f"{engine}{why}{stopped}{err}"
    )


def recording_banner_markdown(rec: RecordingStatus | None) -> str:
    """The notice on every page while the session is recorded (``app.py --record``), and why
    recording stopped, if it did."""
    if rec is None:
        return ""
    if rec.active:
        return (
            "⏺ **This session is recorded**: the prompts typed here, every request's tokens and the engine's "
            "steps are written to a file on the server (the presenter's `--record`)."
        )
    if rec.error:
        return f"⏺ This session was being recorded; **recording stopped**: {rec.error}."
    return "⏺ This session was being recorded; recording has stopped."
