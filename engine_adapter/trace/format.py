"""Session traces: a whole explorer session as JSONL, written and read back.

Contract: a session trace extends the recorder's trace format (docs/trace-format.md);
one JSON object per line, every ``t`` in seconds since the session started (the moment
the engine was first ready), floats rounded:

- ``{"type": "run", "session": true, "format": TRACE_FORMAT, ...}``: first line; the
  engine config, vLLM version, start date. ``format`` counts changes a reader must know
  of; a trace without it is format 1, and a reader refuses a format newer than its own.
- ``{"type": "engine_step", "t", ...}``: every field of ``records.EngineStep``,
  one line per engine step (whole server: foreground and background requests).
- ``{"type": "request", ...}``: a finished foreground request as
  ``record.request_line`` makes it, plus ``t_start``, ``t_first_token``,
  ``t_end``, and per step ``texts`` (each emitted token's text) and
  ``rejected_texts`` (each rejected draft's text), so a replay needs no
  tokenizer. Written when the request finished.
- ``{"type": "load", "t", "concurrency"}``: a background-load change (one per
  gesture; a later line with the same ``t`` corrects the value).
- ``{"type": "background", "t", "target", "in_flight", "completed",
  "failed", "tokens", "tokens_per_s"}``: the background load's counters, when
  they change (at most about once a second).
- ``{"type": "policy", "t", ...}``: a K policy change, the service's own dict.
- ``{"type": "engine", "t", "config"}``: the engine was restarted with a new
  config during the session.
- ``{"type": "summary", "wall_s", "num_engine_steps", "num_requests",
  "total_tokens"}``: last line (missing when the app was killed; the reader
  copes).

``SessionTraceWriter`` writes lines (thread-safe); ``read_session`` reads a
file into ``SessionTrace``, rebuilding ``EngineStep`` and ``RequestResult``
records. Pure: no engine, no UI toolkit.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, TextIO

from engine_adapter.records import EngineStep, RelaxedDraft, RequestInStep, RequestResult, SlotBid, Step

_ROUND = {"t": 4, "wall_s": 5, "interval_s": 5, "tap_s": 6}
TRACE_FORMAT = 2  # 2: the header names its format (1: no "format" field; read the same way)


def trace_format(header: dict[str, Any]) -> int:
    """The header's format (1 when it names none); ``ValueError`` for one newer than this reader's."""
    version = header.get("format", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"the header's format is {version!r}, not a positive whole number")
    if version > TRACE_FORMAT:
        raise ValueError(
            f"the trace is in format {version}, written by a newer explorer; this one reads formats 1 to {TRACE_FORMAT}"
        )
    return version


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def step_line(step: Step) -> dict[str, Any]:
    """The recorder's per-step object (docs/trace-format.md)."""
    return {
        "drafted": step.drafted,
        "num_drafted": step.num_drafted,
        "accepted": step.accepted,
        "emitted": step.emitted,
        "batch_size": step.batch_size,
        "k": step.k,
        "t": step.t,
        "wall_s": step.wall_s,
        "drafter_idle": step.drafter_idle,
        "caught_up": step.caught_up,
        # drafts kept only by a lossy acceptance rule: [position, target's token, p(draft), p(target's), its text]
        "relaxed": [
            [r.position, r.target_id, _r(r.p_draft, 5), _r(r.p_target, 5), r.target_text] for r in step.relaxed
        ],
        "rule": step.rule,
    }


def request_line(result: RequestResult) -> dict[str, Any]:
    return {
        "type": "request",
        "request_id": result.request_id,
        "prompt": result.prompt,
        "text": result.text,
        "token_ids": result.token_ids,
        "kinds": result.kinds,
        "steps": [step_line(s) for s in result.steps],
        "spec_decode_metrics": result.spec_decode_metrics,
        "tokens_per_second": result.tokens_per_second,
        "provenance": result.provenance,
        "finish_reason": result.finish_reason,
        "num_prompt_tokens": result.num_prompt_tokens,
        "ttft_s": (result.t_first_token - result.t_start) if result.t_first_token else None,
        "wall_s": result.t_end - result.t_start,
    }


def session_header(
    config: dict[str, Any] | None,
    vllm_version: str | None,
    *,
    attached: bool = False,
    url: str | None = None,
    started_at: str | None = None,
) -> dict[str, Any]:
    """The first line: the recorder's run header, for a live session."""
    cfg = dict(config or {})
    return {
        "type": "run",
        "format": TRACE_FORMAT,
        "session": True,
        "method": "attach" if attached else cfg.get("method"),
        "k": cfg.get("k"),
        "k_table": cfg.get("k_table"),
        "target": cfg.get("target"),
        "draft": cfg.get("draft") if cfg.get("method") == "draft" else None,
        "dtype": cfg.get("dtype"),
        "attach": url if attached else None,
        "provenance": "counts" if attached else "tap",
        "vllm_version": vllm_version,
        "started_at": started_at or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": cfg,
    }


def _jsonable(v: Any) -> Any:
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float):
        return round(v, 6)
    return v


def engine_step_line(step: EngineStep, t0: float) -> dict[str, Any]:
    """Every field of the step (``t`` relative to ``t0``); fields at their default are left out."""
    d: dict[str, Any] = {"type": "engine_step"}
    for f in fields(EngineStep):
        v = getattr(step, f.name)
        if f.default is not MISSING and v == f.default:
            continue
        if f.name == "t":
            v = step.t - t0
        if f.name == "requests":  # one short array per request: a step at load holds dozens
            d[f.name] = [_request_row(r) for r in step.requests]
            continue
        d[f.name] = _r(v, _ROUND[f.name]) if f.name in _ROUND else _jsonable(v)
    return d


def _request_row(r: RequestInStep) -> list[Any]:
    """[request_id, num_drafted, num_accepted, num_emitted], then 1 if drafted across a hole."""
    row: list[Any] = [r.request_id, r.num_drafted, r.num_accepted, r.num_emitted]
    return [*row, 1] if r.drafted_across else row


def _request_in_step(row: list[Any]) -> RequestInStep:
    rid, drafted, accepted, emitted, *across = row
    return RequestInStep(
        request_id=str(rid),
        num_drafted=int(drafted),
        num_accepted=int(accepted),
        num_emitted=int(emitted),
        drafted_across=bool(across and across[0]),
    )


def _slot_bid(b: Any) -> Any:
    if not isinstance(b, dict):
        return b
    return SlotBid(**{k: tuple(v) if isinstance(v, list) else v for k, v in b.items()})


def engine_step_from_line(d: dict[str, Any]) -> EngineStep:
    kw: dict[str, Any] = {}
    for f in fields(EngineStep):
        if f.name not in d:
            continue
        v = d[f.name]
        if f.name == "requests":
            v = tuple(_request_in_step(row) for row in v)
        elif isinstance(v, list):
            v = tuple(_slot_bid(x) if f.name == "bids" else x for x in v)
        kw[f.name] = v
    return EngineStep(**kw)


def session_request_line(result: RequestResult, t0: float) -> dict[str, Any]:
    """``record.request_line`` plus session times and token texts."""
    d = request_line(result)
    for s, out in zip(result.steps, d["steps"]):
        out["t"] = _r(s.t - t0)
        out["wall_s"] = _r(s.wall_s, 5)
        out["texts"] = [tok.text for tok in s.tokens]
        out["rejected_texts"] = [tok.text for tok in s.rejected]
    d["tokens_per_second"] = _r(d["tokens_per_second"], 3)
    d["ttft_s"] = _r(d["ttft_s"])
    d["wall_s"] = _r(d["wall_s"])
    d["t_start"] = _r(result.t_start - t0)
    d["t_first_token"] = _r(result.t_first_token - t0) if result.t_first_token is not None else None
    d["t_end"] = _r(result.t_end - t0)
    return d


def request_from_line(d: dict[str, Any]) -> RequestResult:
    """A ``RequestResult`` from a request line (session or recorder trace).

    Token texts come from the step's ``texts``; a recorder trace has none, so
    its tokens show as ``⟨id⟩`` (the whole ``text`` is still exact).
    """
    from engine_adapter.provenance import labelled_step

    steps: list[Step] = []
    for index, s in enumerate(d.get("steps", [])):
        drafted = s.get("drafted")
        accepted = s["accepted"]
        emitted = list(s.get("emitted", []))
        rejected_ids = (drafted or [])[accepted:]
        steps.append(
            labelled_step(
                index=index,
                t=s.get("t", 0.0),
                wall_s=s.get("wall_s", 0.0),
                batch_size=s.get("batch_size", 0),
                k=s.get("k", 0),
                drafted=list(drafted) if drafted is not None else None,
                num_drafted=s.get("num_drafted", len(drafted) if drafted is not None else 0),
                accepted=accepted,
                emitted=emitted,
                texts=s.get("texts") or [f"⟨{i}⟩" for i in emitted],
                rejected_texts=s.get("rejected_texts") or [f"⟨{i}⟩" for i in rejected_ids],
                drafter_idle=bool(s.get("drafter_idle", False)),
                caught_up=int(s.get("caught_up", 0)),
                relaxed=[
                    RelaxedDraft(int(r[0]), int(r[1]), float(r[2]), float(r[3]), str(r[4]) if len(r) > 4 else "")
                    for r in s.get("relaxed", [])
                ],
                rule=str(s.get("rule", "lossless")),
            )
        )
    if steps:
        steps[-1].finish_reason = d.get("finish_reason")
    wall = d.get("wall_s") or 0.0
    t_start = d.get("t_start", steps[0].t - (d.get("ttft_s") or 0.0) if steps else 0.0)
    t_end = d.get("t_end", t_start + wall)
    ttft = d.get("ttft_s")
    return RequestResult(
        request_id=d.get("request_id", ""),
        prompt=d.get("prompt", ""),
        text=d.get("text", ""),
        token_ids=list(d.get("token_ids", [])),
        kinds=list(d.get("kinds", [])),
        steps=steps,
        provenance=d.get("provenance", "tap"),
        spec_decode_metrics=d.get("spec_decode_metrics"),
        tap_metrics=None,
        finish_reason=d.get("finish_reason"),
        num_prompt_tokens=d.get("num_prompt_tokens", 0),
        t_start=t_start,
        t_first_token=d.get("t_first_token", t_start + ttft if ttft is not None else None),
        t_end=t_end,
    )


def load_line(t: float, concurrency: int) -> dict[str, Any]:
    return {"type": "load", "t": _r(t), "concurrency": int(concurrency)}


def background_line(
    t: float, target: int, in_flight: int, completed: int, failed: int, tokens: int, tokens_per_s: float
) -> dict[str, Any]:
    return {
        "type": "background",
        "t": _r(t),
        "target": target,
        "in_flight": in_flight,
        "completed": completed,
        "failed": failed,
        "tokens": tokens,
        "tokens_per_s": _r(tokens_per_s, 2),
    }


def policy_line(t: float, change: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in change.items() if k not in ("type", "t")}, "type": "policy", "t": _r(t)}


def engine_line(t: float, config: dict[str, Any] | None) -> dict[str, Any]:
    return {"type": "engine", "t": _r(t), "config": config}


class SessionTraceWriter:
    """Appends lines to a session trace; safe to call from several threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: TextIO | None = self.path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self.lines = 0
        self.bytes = 0  # written so far (UTF-8)

    def write(self, obj: dict[str, Any]) -> None:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock:
            if self._f is None:
                raise ValueError(f"{self.path}: the trace is closed")
            self._f.write(text)
            self.lines += 1
            self.bytes += len(text.encode("utf-8"))

    def write_all(self, objs: Iterable[dict[str, Any]]) -> None:
        for obj in objs:
            self.write(obj)

    def flush(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


@dataclass
class SessionTrace:
    """A session trace read back; every ``t`` in seconds since the session start."""

    header: dict[str, Any]
    steps: list[EngineStep] = field(default_factory=list)  # sorted by t
    requests: list[RequestResult] = field(default_factory=list)  # sorted by t_start
    request_lines: list[dict[str, Any]] = field(default_factory=list)  # same order, as written
    loads: list[tuple[float, int]] = field(default_factory=list)  # sorted by t, one per t
    backgrounds: list[dict[str, Any]] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)
    engines: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    cut_line: int | None = None  # the last line, cut off (a killed app), was skipped: its number

    @property
    def duration_s(self) -> float:
        """The session's length: the summary's wall time, else the last event."""
        ends = [s.t for s in self.steps[-1:]] + [r.t_end for r in self.requests] + [t for t, _ in self.loads]
        ends += [b["t"] for b in self.backgrounds[-1:]] + [p["t"] for p in self.policies[-1:]]
        last = max(ends, default=0.0)
        if self.summary and self.summary.get("wall_s"):
            return max(float(self.summary["wall_s"]), last)
        return last


def _rebase(requests: list[RequestResult]) -> None:
    """Shift times so that the first request starts at 0."""
    t0 = min(r.t_start for r in requests)
    for r in requests:
        r.t_start -= t0
        r.t_end -= t0
        if r.t_first_token is not None:
            r.t_first_token -= t0
        for s in r.steps:
            s.t -= t0


def read_session(path: str | Path) -> SessionTrace:
    """Read a session trace (or a recorder trace: its requests, no timeline). A malformed line
    raises ``ValueError`` naming the file and the line; only a cut-off LAST line is skipped, and
    ``cut_line`` says so. Lines of a type this reader does not know are passed over (a newer
    writer's)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text file ({e.reason} at byte {e.start})") from None
    last = max((n for n, line in enumerate(lines, 1) if line.strip()), default=0)
    trace: SessionTrace | None = None
    loads: dict[float, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            if n == last and trace is not None and not line.rstrip().endswith("}"):
                trace.cut_line = n  # a last line cut off by a killed app
                break
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}:{n}: a line of a trace is a JSON object, not {type(d).__name__}")
        kind = d.get("type")
        if trace is None:
            if kind != "run":
                raise ValueError(f'{path}:{n}: a trace starts with a {{"type": "run"}} line')
            try:
                trace_format(d)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: {e}") from None
            trace = SessionTrace(header=d)
            continue
        try:
            _read_line(trace, loads, kind, d)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise ValueError(f"{path}:{n}: a malformed {kind or 'untyped'} line ({what})") from None
    if trace is None:
        raise ValueError(f"{path}: empty trace")
    try:
        _order(trace, loads)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: a line lacks its time or holds a bad one ({type(e).__name__}: {e})") from None
    return trace


def _read_line(trace: SessionTrace, loads: dict[float, int], kind: str | None, d: dict[str, Any]) -> None:
    """One line after the header into ``trace`` (raises on a malformed line)."""
    if kind == "engine_step":
        trace.steps.append(engine_step_from_line(d))
    elif kind == "request":
        trace.request_lines.append(d)
        trace.requests.append(request_from_line(d))
    elif kind == "load":
        loads[float(d["t"])] = int(d["concurrency"])
    elif kind in ("background", "policy", "engine"):
        float(d["t"])  # every timeline line has a time
        {"background": trace.backgrounds, "policy": trace.policies, "engine": trace.engines}[kind].append(d)
    elif kind == "summary":
        trace.summary = d


def _order(trace: SessionTrace, loads: dict[float, int]) -> None:
    """Sort what was read by time (a recorder trace's requests rebased to its first)."""
    if not trace.header.get("session") and trace.requests:
        _rebase(trace.requests)  # a recorder trace: engine-host clock times, no session start
    trace.steps.sort(key=lambda s: s.t)
    order = sorted(range(len(trace.requests)), key=lambda i: trace.requests[i].t_start)
    trace.requests = [trace.requests[i] for i in order]
    trace.request_lines = [trace.request_lines[i] for i in order]
    trace.loads = sorted(loads.items())
    trace.backgrounds.sort(key=lambda b: b["t"])
    trace.policies.sort(key=lambda p: p["t"])
    trace.engines.sort(key=lambda e: e["t"])
