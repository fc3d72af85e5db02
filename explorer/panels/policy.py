"""The "K under load" panel: live K policy, K table editor, cost model, auction grid.

Contract: ``build_policy_panel(page, ctx, k_max)`` adds its components inside the enclosing
``gr.Blocks`` ``page`` and wires them (on load, the controls show the policy in force); ``ctx``
is the page's ``PageContext`` (the presenter's lock refuses Apply and re-measuring to a session
without the key, however called), ``k_max`` the engine's most draft tokens per step (the K
slider's top).
The table editor is checked on every edit (``views.k_table.table_check``),
before any Apply. It talks to the engine only through the ``Backend``
(``set_policy``, ``profile_cost``, ``policy_view``, ``steps_since``); a backend
without live policies (an attached server, a replay) shows why instead. The
auto chart shows the table in force under ``auto``, else
``policy_view().auto_preview``.

API names: /set_policy (policy, K, table rows) -> status text; /profile;
/check_edit (table rows) -> the check; /policy_controls -> (policy, K, table)
as a newly loaded page shows them. ``refresh(foreground, step_times, drawn)`` runs on the
page's chart timer (``explorer.page``, API /charts) into ``tick_outputs``: the status, the
table in force and the live figures. What every page sees alike (the policy's status, the
step-time picture, the auto curve, the auction grid without a request of the page's own) is built
once per refresh tick (``ctx.ticks``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr
import plotly.graph_objects as go
from gradio.components import Component

from engine_adapter.records import EngineStep
from engine_adapter.service.backend import SLOT_POLICIES, PolicySpec
from explorer.panels.context import ENGINE_CHANGES_AT_ONCE, PageContext
from explorer.panels.load import plot_data
from explorer.views.k_table import (
    DEFAULT_TABLE,
    TABLE_HEADERS,
    table_check,
    table_rows,
    table_value,
)
from explorer.views.live_charts import engine_activity, streaming
from explorer.views.policy_charts import (
    auction_figure,
    auto_figure,
    operating_point,
    step_time_figure,
    table_in_force_markdown,
)
from explorer.views.status import policy_status_markdown

if TYPE_CHECKING:
    from engine_adapter.policy.live_state import PolicyView

POLICY_LABELS = (
    ("off: K=0 for every batch size", "off"),
    ("fixed K", "fixed"),
    ("K table (vLLM's num_speculative_tokens_per_batch_size)", "table"),
    ("auto table (derived from the measured cost and acceptance)", "auto"),
    ("slot auction (per request and draft position)", "auction"),
    ("equal slots (the auction's slots, shared alike between requests)", "equal"),
)
DEFAULT_FIXED_K = 3
RECENT_S = 5.0  # seconds of engine steps that make the operating point ("now")
AUCTION_S = 10.0  # seconds of engine steps searched for the latest auction


@dataclass(frozen=True)
class PolicyTick:
    """What every page's policy panel reads in one refresh tick."""

    view: PolicyView
    recent: list[EngineStep]  # the last RECENT_S seconds of steps
    op: tuple[float, float, float, float] | None  # the operating point (``operating_point``)
    auctions: list[EngineStep]  # the steps of the last AUCTION_S seconds that ran the auction
    keys: dict[str, Any]  # what each chart shows (the auction's without a page's own request)
    bidders: set[str]  # request ids in those auctions
    status_md: str
    table_md: str


class PolicyPanel:
    def __init__(self, ctx: PageContext, k_max: int) -> None:
        self.ctx = ctx
        self.backend = ctx.backend
        self.k_max = k_max

    def build(self) -> None:
        k_max = self.k_max
        with gr.Accordion("K under load: live policy, cost model, auto table, slot auction", open=True):
            with gr.Row():
                with gr.Column(scale=2, min_width=320):
                    self.policy = gr.Radio(
                        list(POLICY_LABELS),
                        value="fixed",
                        elem_id="policy",
                        label="K policy (applies live, no restart)",
                    )
                    self.k = gr.Slider(
                        0,
                        max(k_max, 1),
                        value=min(DEFAULT_FIXED_K, k_max),
                        step=1,
                        label=f"K for 'fixed K' (this engine drafts at most {k_max})",
                        elem_id="policy-k",
                    )
                    self.table = gr.Dataframe(
                        value=table_value(DEFAULT_TABLE),
                        headers=list(TABLE_HEADERS),
                        column_count=(3, "fixed"),
                        datatype=["number", "number", "number"],
                        interactive=True,
                        label="K table: inclusive [start_bs, end_bs, K]; first row starts at 1; gaps inherit; "
                        "K=0 = no drafts",
                        elem_id="k-table",
                    )
                    self.checked = gr.Markdown(table_check(DEFAULT_TABLE, k_max), elem_id="table-check")
                    with gr.Row():
                        self.apply_btn = gr.Button("Apply policy", variant="primary", elem_id="apply-policy")
                        self.profile_btn = gr.Button("Measure the cost model again (visitors wait)", elem_id="profile")
                    self.said = gr.Markdown("", elem_id="policy-said")  # the answer to this page's last click
                    self.status = gr.Markdown(
                        policy_status_markdown(self.backend.policy_view()), elem_id="policy-status"
                    )  # live, for everyone
                    self.in_force = gr.Markdown("", elem_id="table-in-force")
                with gr.Column(scale=3, min_width=420):
                    self.step_plot = gr.Plot(show_label=False, elem_id="step-time")
            with gr.Row():
                self.auto_plot = gr.Plot(show_label=False, elem_id="auto-curve")
                self.auction_plot = gr.Plot(show_label=False, elem_id="auction-grid")

    def wire(self, page: gr.Blocks) -> None:
        # the check answers each edit, so an error shows before Apply (and a test can see the edit landed)
        self.table.change(
            self.check_edit, self.table, self.checked, api_name="check_edit", show_progress="hidden", queue=False
        )
        # always_last: a click while the last apply still waits for the engine runs after it
        # (Gradio's default drops it, so a quick "table, then auction" kept the table)
        self.apply_btn.click(
            self.apply,
            [self.policy, self.k, self.table],
            self.said,
            api_name="set_policy",
            trigger_mode="always_last",
            concurrency_id="engine",
            concurrency_limit=ENGINE_CHANGES_AT_ONCE,
        )
        self.profile_btn.click(
            self.profile,
            None,
            self.said,
            api_name="profile",
            concurrency_id="engine",
            concurrency_limit=ENGINE_CHANGES_AT_ONCE,
        )
        page.load(
            self.controls_in_force,
            None,
            [self.policy, self.k, self.table],
            api_name="policy_controls",
            show_progress="hidden",
        )
        # a page opened while the engine was starting (a cold start) learns the policy once it is
        # in force; the timer then stops itself
        self.sync_timer = gr.Timer(1.0)
        self.sync_timer.tick(
            self.controls_once_in_force,
            None,
            [self.policy, self.k, self.table, self.sync_timer],
            show_progress="hidden",
            queue=False,  # a plain request: fewer status messages for the page (panels/engine.py)
        )
        self.drawn = gr.State(None)  # chart -> the key of what this page's chart shows (``refresh``)
        # refresh's, on the page's chart timer (explorer.page)
        self.tick_outputs = [self.status, self.in_force, self.step_plot, self.auto_plot, self.auction_plot, self.drawn]

    async def apply(self, kind: str, k_value: float, rows: Any, request: gr.Request) -> str:
        if refusal := self.ctx.refusal(request):
            return refusal
        try:
            spec = PolicySpec(kind, int(k_value), table_rows(rows) if kind == "table" else None)
            state = await self.backend.set_policy(spec)
        except (ValueError, RuntimeError) as e:
            return f"✕ {e}"
        if state is None:
            return f"Queued: {spec.describe()} applies when profiling ends."
        return f"✓ Sent to the engine: {spec.describe()} (no restart; the line below says when it ran)."

    def check_edit(self, rows: Any) -> str:
        v = self._view()
        return table_check(rows, v.k_max) if v.available else ""  # the status line says why not

    def _view(self) -> PolicyView:
        return self.ctx.ticks.get("policy_view", self.backend.policy_view)

    async def profile(self, request: gr.Request) -> str:
        if refusal := self.ctx.refusal(request):
            return refusal
        try:
            await self.backend.profile_cost()
        except RuntimeError as e:
            return f"✕ {e}"
        return (
            "✓ Measuring again: visitors' requests wait until it ends (the status line at the top shows its progress)."
        )

    def controls_in_force(self) -> dict[Component, Any]:
        """The policy the engine runs, in this page's controls (the policy is engine-wide: another
        page, or this one before a reload, may have set it); once, on load, so a choice is never undone."""
        # one skip() for every output: nothing in force to show
        return self._in_force(self.backend.policy_view()) or gr.skip()

    def _in_force(self, v: PolicyView) -> dict[Component, Any] | None:
        if not v.available or v.state is None:
            return None
        spec = v.state.spec
        shown: dict[Component, Any] = {self.policy: spec.kind}
        if spec.kind == "fixed":
            shown[self.k] = spec.k
        if spec.kind == "table" and spec.table:
            shown[self.table] = table_value(spec.table)
        return shown

    def controls_once_in_force(self) -> Any:
        """``controls_in_force`` for a page loaded before the start policy was in force (a cold
        start): the first time the engine is ready, then the timer stops, so a choice made on the
        page is never undone. Not while measuring: the profiler's own K is in force then."""
        if self.backend.status().state != "ready":
            return gr.skip()
        v = self.backend.policy_view()
        if v.profiling or (shown := self._in_force(v)) is None:
            return gr.skip()
        return {**shown, self.sync_timer: gr.Timer(active=False)}

    def refresh_readout(self) -> dict[Component, Any]:
        """The status and the table in force, no chart (the page's chart gate said no redraw)."""
        tick = self._tick()
        return {self.status: tick.status_md, self.in_force: tick.table_md}

    def _tick(self) -> PolicyTick:
        return self.ctx.ticks.get("policy_tick", self._build_tick)

    def _build_tick(self) -> PolicyTick:
        """What every page's policy panel reads this tick (one computation for all of them)."""
        v = self.backend.policy_view()
        now = time.monotonic()
        recent = self.backend.steps_since(now - RECENT_S)
        op = operating_point(recent)
        state = v.state
        auction_on = state is not None and state.spec.kind in SLOT_POLICIES
        table_md = (
            table_in_force_markdown(
                state.table if state else None,
                op[0] if op else None,
                auction_on,
                v.k_max,
                equal=state is not None and state.spec.kind == "equal",
            )
            if v.available
            else ""
        )
        cost_key = (v.cost.base_s, v.cost.slope_s, len(v.cost.points)) if v.cost else None
        auctions = [s for s in self.backend.steps_since(now - AUCTION_S) if s.auction_slots is not None]
        keys = {
            "step": (engine_activity(self.backend, now), cost_key, v.cost_source, v.profiling),
            "auto": (
                (state.control, state.t, state.table) if state else None,  # a policy sent (auto: re-derived)
                v.auto_preview.rows if v.auto_preview else None,
                round(op[0], 1) if op else None,
                cost_key,
            ),
            "auction": auctions[-1].seq if auctions else None,
        }
        bidders = {b.request_id for s in auctions for b in s.bids}
        return PolicyTick(v, recent, op, auctions, keys, bidders, self.ctx.shown(policy_status_markdown(v)), table_md)

    def refresh(self, fg: str | None, fg_steps: list | None, drawn: dict | None) -> dict[Component, Any]:
        """The status and the table in force every tick; each chart only when what it shows changed
        since this page drew it (``drawn``: chart -> key): the step-time picture with the engine's
        steps, the cost model and a profile's progress; the auto curve with the policy, the preview
        and the operating point; the auction grid with the auction's steps and this page's request.
        While this page's own request streams (``fg_steps``), the charts wait for its end."""
        tick = self._tick()
        shown: dict[Component, Any] = {self.status: tick.status_md, self.in_force: tick.table_md}
        if streaming(time.monotonic(), fg_steps or []):  # the charts wait for the end of this page's request
            return shown
        mine = fg if fg in tick.bidders else None  # a request of this page's in the auction grid
        keys = {**tick.keys, "auction": (tick.keys["auction"], mine)}
        drawn = dict(drawn or {})
        v, op = tick.view, tick.op
        if keys["step"] != drawn.get("step"):
            build = lambda: plot_data(step_time_figure(v.cost, tick.recent, v.profiling))  # noqa: E731
            shown[self.step_plot] = self.ctx.ticks.get(("step", keys["step"]), build)
        if keys["auto"] != drawn.get("auto"):
            build = lambda: plot_data(self._auto_figure(v, op[0] if op else 1))  # noqa: E731
            shown[self.auto_plot] = self.ctx.ticks.get(("auto", keys["auto"]), build)
        if keys["auction"] != drawn.get("auction"):
            if mine is None:
                build = lambda: plot_data(auction_figure(tick.auctions, None))  # noqa: E731
                shown[self.auction_plot] = self.ctx.ticks.get(("auction", keys["auction"]), build)
            else:
                with self.ctx.polls.slot() as free:
                    if not free:  # every slot taken: this page's grid waits for the next tick
                        keys["auction"] = drawn.get("auction")
                    else:
                        shown[self.auction_plot] = auction_figure(tick.auctions, mine)
        if keys != drawn:
            shown[self.drawn] = keys
        return shown

    @staticmethod
    def _auto_figure(v: PolicyView, batch_size: float) -> go.Figure:
        """The auto table in force, else what auto would choose now (the backend's preview)."""
        if v.state is not None and v.state.auto is not None:
            return auto_figure(v.state.auto, batch_size, "in force now")
        if v.auto_preview is not None:
            return auto_figure(v.auto_preview, batch_size, "preview: what 'auto' would choose now (not in force)")
        return auto_figure(None, batch_size, "")


def build_policy_panel(page: gr.Blocks, ctx: PageContext, k_max: int) -> PolicyPanel:
    panel = PolicyPanel(ctx, k_max)
    panel.build()
    panel.wire(page)
    return panel
