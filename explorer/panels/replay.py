"""What the page adds when it replays a recorded session instead of a live engine.

Contract: ``build_replay_panel(backend, prompt)`` adds nothing on a live
backend (``backend.recording`` is None); on a replay it adds, under Run,
what Run does in a replay and a list of the recorded foreground requests
(``backend.recording.requests()``) whose choice fills the ``prompt`` box. The
status line for a replay is ``explorer.views.status.replay_status_markdown``.
"""

from __future__ import annotations

import gradio as gr

from engine_adapter.records import RequestResult
from engine_adapter.service.backend import Backend

LABEL_CHARS = 70  # of a recorded prompt, in the list

REPLAY_NOTE = (
    "**Replay mode.** **Run** plays a recorded foreground request step by step, with its recorded "
    "timing: the one whose prompt you typed, if it was recorded, otherwise the next one in "
    "recorded order (the token view shows the recorded prompt). Max tokens and temperature are the "
    "recorded ones. The live charts replay the whole server as recorded; the load slider, engine "
    "settings and the lossless check need a live engine (`python app.py`)."
)


def request_label(i: int, prompt: str, n_tokens: int) -> str:
    one_line = " ".join(prompt.split())
    more = "…" if len(one_line) > LABEL_CHARS else ""
    return f"{i + 1}. {one_line[:LABEL_CHARS]}{more} ({n_tokens} tokens)"


def build_replay_panel(backend: Backend, prompt: gr.Textbox) -> None:
    """Nothing on a live backend; in a replay, what Run does and the recorded requests."""
    if backend.recording is None:
        return
    requests = backend.recording.requests()
    with gr.Group(elem_id="replay-panel"):
        gr.Markdown(REPLAY_NOTE + ("" if requests else "\n\nThis recording holds no foreground request."))
        if requests:
            _recorded_requests(requests, prompt)


def _recorded_requests(requests: list[RequestResult], prompt: gr.Textbox) -> None:
    choices = [(request_label(i, r.prompt, len(r.token_ids)), i) for i, r in enumerate(requests)]
    pick = gr.Dropdown(
        choices, value=None, label=f"Recorded foreground requests ({len(requests)})", elem_id="replay-requests"
    )

    def recorded_prompt(i: int | None) -> str:
        # a single output: skip() leaves the prompt as it is when the list is cleared
        return requests[i].prompt if i is not None else gr.skip()

    pick.change(recorded_prompt, pick, prompt, api_name=False)
