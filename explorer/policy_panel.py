"""The "K under load" panel: live K policy, K table editor, cost model, auction grid.

Contract: ``build_policy_panel(page, service, foreground, ...)`` adds its components
to the enclosing ``gr.Blocks`` ``page`` and wires them (on load, the controls show
the policy in force); ``foreground`` is the ``gr.State``
holding this page's current request id (to find it in the auction grid).
The table editor is checked on every edit (``table_check``), before any Apply.
It talks to the engine only through ``EngineService`` (``set_policy``,
``profile_cost``, ``policy_view``, ``steps_since``); a service without live
policies (an attached server, a replay) shows why instead.

API names: /set_policy (policy, K, table rows) -> status text; /profile;
/policy_controls -> (policy, K, table) as a newly loaded page shows them.
"""

from __future__ import annotations

import math
import time
from typing import Any

import gradio as gr
import pandas as pd

from engine_adapter.policy.k_policy import derive_auto_table
from engine_adapter.policy.controller import PolicySpec
from engine_adapter.engine_config import check_table
from explorer.presenter import Presenter
from explorer.policy_charts import (
    auction_figure,
    auto_figure,
    operating_point,
    step_time_figure,
    table_in_force_markdown,
)

POLICY_LABELS = [
    ("off: K=0 for every batch size", "off"),
    ("fixed K", "fixed"),
    ("K table (vLLM's num_speculative_tokens_per_batch_size)", "table"),
    ("auto table (derived from the measured cost and acceptance)", "auto"),
    ("slot auction (per request and draft position)", "auction"),
]
TABLE_HEADERS = ["start_bs", "end_bs", "K"]
DEFAULT_TABLE = [[1, 2, 3], [3, 4, 1], [5, 64, 0]]
MAX_TABLE_ROWS = 64


def table_rows(value: Any) -> list[list[int]]:
    """The editor's cells as integer rows; a clear error for anything else (vLLM's rules come after)."""
    if isinstance(value, pd.DataFrame):
        raw = value.values.tolist()
    elif isinstance(value, dict) and "data" in value:  # the API's serialised form
        raw = value["data"]
    else:
        raw = value or []
    rows = []
    for n, row in enumerate(raw, 1):
        cells = list(row)[:3]
        if all(c is None or (isinstance(c, str) and not c.strip()) or (isinstance(c, float) and math.isnan(c))
               for c in cells):
            continue  # an empty row left by the editor
        if len(cells) != 3:
            raise ValueError(f"row {n}: needs three cells, start_bs, end_bs and K")
        ints = []
        for name, c in zip(TABLE_HEADERS, cells):
            try:
                f = float(c)
            except (TypeError, ValueError):
                raise ValueError(f"row {n}: {name} must be a whole number; got {c!r}") from None
            if not f.is_integer():
                raise ValueError(f"row {n}: {name} must be a whole number; got {c!r}")
            ints.append(int(f))
        rows.append(ints)
    if len(rows) > MAX_TABLE_ROWS:
        raise ValueError(f"at most {MAX_TABLE_ROWS} rows")
    return rows


def table_check(rows: Any, k_max: int) -> str:
    """The editor's table judged as it is typed (vLLM's rules, this engine's K cap), before any Apply."""
    try:
        checked = check_table(table_rows(rows), k_max)
    except ValueError as e:
        return f"✕ Not a valid table yet: {e}."
    return f"Valid table {[list(r) for r in checked]}: *Apply policy* with 'K table' chosen sends it."


def policy_status(service) -> str:
    v = service.policy_view()
    if not v.available:
        return f"Live K policies are not available here: {v.why_not}."
    parts = []
    if v.state is not None:
        applied = (f"applied at engine step {v.applied_seq}" if v.applied_seq
                   else "sent; the engine applies it at its next step")
        parts.append(f"**In force:** {v.state.spec.describe()} ({applied}).")
    if v.profiling:
        parts.append(f"◐ **Profiling the cost model:** {v.profiling}. A policy chosen now applies when it ends.")
    elif v.cost is not None:
        parts.append(f"Cost model: {'measured now' if v.cost_source == 'profiled' else 'measured earlier on this machine (cache)'}, "
                     f"{len(v.cost.points)} cells, knee ≈ {v.cost.knee_tokens:.0f} tokens per step.")
    if v.error:
        parts.append(f"✕ {v.error}")
    return " ".join(parts)


def build_policy_panel(page: gr.Blocks, service, foreground: gr.State, k_max: int, unlocked: gr.State,
                       presenter: Presenter) -> None:
    with gr.Accordion("K under load: live policy, cost model, auto table, slot auction", open=True):
        with gr.Row():
            with gr.Column(scale=2, min_width=320):
                policy = gr.Radio(POLICY_LABELS, value="fixed", label="K policy (applies live, no restart)",
                                  elem_id="policy")
                k = gr.Slider(0, max(k_max, 1), value=min(3, k_max), step=1,
                              label=f"K for 'fixed K' (this engine drafts at most {k_max})", elem_id="policy-k")
                table = gr.Dataframe(value=DEFAULT_TABLE, headers=TABLE_HEADERS, column_count=(3, "fixed"),
                                     datatype=["number", "number", "number"], interactive=True,
                                     label="K table: inclusive [start_bs, end_bs, K]; first row starts at 1; "
                                           "gaps inherit; K=0 = no drafts", elem_id="k-table")
                checked = gr.Markdown(table_check(DEFAULT_TABLE, k_max), elem_id="table-check")
                with gr.Row():
                    apply_btn = gr.Button("Apply policy", variant="primary", elem_id="apply-policy")
                    profile_btn = gr.Button("Profile the cost model again", elem_id="profile")
                said = gr.Markdown("", elem_id="policy-said")  # the answer to this page's last click
                status = gr.Markdown(policy_status(service), elem_id="policy-status")  # live, for everyone
                in_force = gr.Markdown("", elem_id="table-in-force")
            with gr.Column(scale=3, min_width=420):
                step_plot = gr.Plot(show_label=False, elem_id="step-time")
        with gr.Row():
            auto_plot = gr.Plot(show_label=False, elem_id="auto-curve")
            auction_plot = gr.Plot(show_label=False, elem_id="auction-grid")

    async def apply(kind: str, k_value: float, rows: Any, may: bool) -> str:
        if refusal := presenter.refusal(may):
            return refusal
        try:
            spec = PolicySpec(kind, int(k_value), table_rows(rows) if kind == "table" else None)
            state = await service.set_policy(spec)
        except (ValueError, RuntimeError) as e:
            return f"✕ {e}"
        if state is None:
            return f"Queued: {spec.describe()} applies when profiling ends."
        return f"✓ Sent to the engine: {spec.describe()} (no restart; the line below says when it ran)."

    # the check answers each edit, so an error shows before Apply (and a test can see the edit landed)
    def check_edit(rows: Any) -> str:
        v = service.policy_view()
        return table_check(rows, v.k_max) if v.available else ""  # the status line says why not

    table.change(check_edit, table, checked, show_progress="hidden", queue=False)

    # always_last: a click while the last apply still waits for the engine runs after it
    # (Gradio's default drops it, so a quick "table, then auction" kept the table)
    apply_btn.click(apply, [policy, k, table, unlocked], said, api_name="set_policy", trigger_mode="always_last")

    async def profile(may: bool) -> str:
        if refusal := presenter.refusal(may):
            return refusal
        try:
            await service.profile_cost()
        except RuntimeError as e:
            return f"✕ {e}"
        return "✓ Profiling started (the line below shows its progress)."

    profile_btn.click(profile, unlocked, said, api_name="profile")

    def controls_in_force():
        """The policy the engine runs, in this page's controls (the policy is engine-wide: another
        page, or this one before a reload, may have set it); once, on load, so a choice is never undone."""
        v = service.policy_view()
        if not v.available or v.state is None:
            return gr.skip(), gr.skip(), gr.skip()
        spec = v.state.spec
        return (spec.kind, spec.k if spec.kind == "fixed" else gr.skip(),
                [list(r) for r in spec.table] if spec.kind == "table" and spec.table else gr.skip())

    page.load(controls_in_force, None, [policy, k, table], api_name="policy_controls", show_progress="hidden")

    def refresh(fg: str | None):
        v = service.policy_view()
        now = time.monotonic()
        recent = service.steps_since(now - 5.0)
        op = operating_point(recent)
        b = op[0] if op else 1
        state = v.state
        auction_on = state is not None and state.spec.kind == "auction"
        table_md = table_in_force_markdown(state.table if state else None, op[0] if op else None,
                                           auction_on, v.k_max) if v.available else ""
        auto = None
        chosen_by = ""
        if state is not None and state.auto is not None:
            auto, chosen_by = state.auto, "in force now"
        elif v.cost is not None and v.alphas:
            # what "auto" would choose from the same measurements (not in force)
            auto = derive_auto_table(v.cost, v.alphas, v.k_max, min(service_max_batch(service), 64))
            chosen_by = "preview: what 'auto' would choose now (not in force)"
        return (policy_status(service), table_md, step_time_figure(v.cost, recent, v.profiling),
                auto_figure(auto, b, chosen_by), auction_figure(service.steps_since(now - 10.0), fg))

    gr.Timer(1.0).tick(refresh, foreground, [status, in_force, step_plot, auto_plot, auction_plot],
                       api_name="policy_live", show_progress="hidden")


def service_max_batch(service) -> int:
    cfg = service.status().config
    return cfg.max_num_seqs if cfg else 64
