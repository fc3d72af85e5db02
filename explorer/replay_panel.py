"""What the page shows when it replays a recorded session instead of a live engine.

Contract: the explorer checks ``getattr(service, "replay_info", None)`` (a
capability, see ``engine_adapter/replay.py``); when it is set,
``replay_status_markdown(info)`` is the status line (file, recorded config,
position and length, speed) and ``add_replay_panel(service, prompt)`` adds, under
Run, what Run does in a replay and a list of the recorded foreground requests
that fills the prompt box.
"""

from __future__ import annotations

import gradio as gr

from engine_adapter.service.replay_service import ReplayInfo


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


def recorded_config_text(header: dict) -> str:
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
    line = (f"▶ **Replay** of `{info.name}` (recorded {when} with vLLM {h.get('vllm_version') or '?'}; "
            f"{recorded_config_text(h)}) at **{info.speed:g}x**: **{_clock(info.position_s)}** of "
            f"{_clock(info.duration_s)}" + (f", loop {info.loop + 1}" if info.loop else "") +
            f"; recorded background load **{info.load}**. No engine is running: every number on this page "
            "is the recording's.")
    if info.note:
        line += f"\n\nⓘ {info.note}"
    return line


def _label(i: int, prompt: str, n_tokens: int) -> str:
    one_line = " ".join(prompt.split())
    return f"{i + 1}. {one_line[:70]}{'…' if len(one_line) > 70 else ''} ({n_tokens} tokens)"


def add_replay_panel(service, prompt: gr.Textbox) -> None:
    """Nothing on a live service; in a replay, what Run does and the recorded requests."""
    info = getattr(service, "replay_info", None)
    if info is None:
        return
    requests = service.trace.requests
    with gr.Group(elem_id="replay-panel"):
        gr.Markdown(
            "**Replay mode.** **Run** plays a recorded foreground request step by step, with its recorded "
            "timing: the one whose prompt you typed, if it was recorded, otherwise the next one in "
            "recorded order (the token view shows the recorded prompt). Max tokens and temperature are the "
            "recorded ones. The live charts replay the whole server as recorded; the load slider, engine "
            "settings and the lossless check need a live engine (`python app.py`)."
            + ("" if requests else "\n\nThis recording holds no foreground request."),
        )
        if requests:
            choices = [(_label(i, r.prompt, len(r.token_ids)), i) for i, r in enumerate(requests)]
            pick = gr.Dropdown(choices, value=None, label=f"Recorded foreground requests ({len(requests)})",
                               elem_id="replay-requests")
            pick.change(lambda i: requests[i].prompt if i is not None else gr.skip(), pick, prompt,
                        api_name=False)
