"""Custom Gradio components of the explorer.

Contract: ``TokenView(value=None, **kwargs)`` is a ``gr.HTML`` whose template,
CSS and JavaScript are the files ``assets/token_view.{html,css,js}`` (found
with ``engine_adapter.package_data``); its value is what
``explorer.views.token_view.token_view_value`` returns (strings already inert).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from engine_adapter.package_data import assets_dir
from explorer.views.token_view import token_view_value


class TokenView(gr.HTML):
    """Coloured tokens with rejected-draft ghosts, a legend and tooltips."""

    def __init__(self, value: dict[str, Any] | None = None, **kwargs: Any) -> None:
        assets = assets_dir()
        super().__init__(
            value=value or token_view_value([]),
            html_template=(assets / "token_view.html").read_text(),
            css_template=(assets / "token_view.css").read_text(),
            js_on_load=(assets / "token_view.js").read_text(),
            apply_default_css=False,
            **kwargs,
        )
