"""Presenter mode (a panel): engine-wide settings locked behind a key, or shared with a notice.

Contract: ``Presenter(key)``; with ``key`` None every session may change the
engine-wide settings (method and K restart the engine, the K policy applies
live) and the page says that a change applies to everyone; with a key
(``app.py --presenter-key``) a session changes them only after entering the
key, so one student cannot restart the engine under the class.
``build_presenter_box(presenter)`` adds the key box and returns the session's
``gr.State`` (True once unlocked); ``presenter.refusal(unlocked)`` is None when
the session may act, else the message to show. API name: /unlock (key) ->
the answer.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

import gradio as gr
from gradio.components import Component

SHARED_NOTICE = (
    "Engine-wide settings are shared: a change here (method, K, K policy) applies to everyone "
    "using this explorer right now."
)


@dataclass(frozen=True)
class Presenter:
    key: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.key)

    def check(self, attempt: str | None) -> bool:
        return self.enabled and hmac.compare_digest((attempt or "").encode(), self.key.encode())

    def refusal(self, unlocked: bool) -> str | None:
        if not self.enabled or unlocked:
            return None
        return (
            "🔒 Engine-wide settings are locked by the presenter (the app runs with --presenter-key). "
            "Enter the presenter key above to change them; everything else on the page is yours."
        )


def build_presenter_box(presenter: Presenter) -> gr.State:
    unlocked = gr.State(False)
    if not presenter.enabled:
        gr.Markdown(f"ⓘ {SHARED_NOTICE}", elem_id="shared-notice")
        return unlocked
    with gr.Row():
        key = gr.Textbox(
            label="Presenter key (engine-wide settings are locked)", type="password", elem_id="presenter-key", scale=3
        )
        unlock_btn = gr.Button("Unlock", elem_id="unlock", scale=1)
    said = gr.Markdown("🔒 Locked: method, K and the K policy are the presenter's.", elem_id="presenter-status")

    def unlock(attempt: str) -> dict[Component, object]:
        if presenter.check(attempt):
            return {
                unlocked: True,
                said: "🔓 Unlocked for this page: your changes apply to everyone's engine.",
                key: "",
            }
        return {unlocked: False, said: "✕ That is not the presenter key.", key: ""}

    unlock_btn.click(unlock, key, [unlocked, said, key], api_name="unlock")
    key.submit(unlock, key, [unlocked, said, key], api_name=False)
    return unlocked
