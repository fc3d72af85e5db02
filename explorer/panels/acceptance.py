"""The "Acceptance rule" panel: trade the lossless guarantee live, engine-wide.

Contract: ``build_acceptance_panel(ctx)`` adds, inside the enclosing
``gr.Blocks``, the rule (vLLM's lossless rule, ``relaxed`` or ``typical``; ``acceptance_rule.py``)
with its parameters and an Apply (the presenter's lock applies, as for the K policy). It talks
to the engine only through the ``Backend`` (``set_acceptance``; ``status().acceptance`` is the
rule in force, which the page's banner, ``explorer.views.status.acceptance_banner_markdown``,
shows on every page while it is lossy). A bad parameter is refused with the reason; the rule in
force is unchanged.

API names: /set_acceptance (rule, top_k, delta, epsilon, alpha) -> the answer (refused to a
session without the presenter's key, however called).
"""

from __future__ import annotations

import gradio as gr

from engine_adapter.acceptance_rule import LOSSLESS, AcceptanceRule
from explorer.panels.context import ENGINE_CHANGES_AT_ONCE, PageContext

RULE_LABELS = (
    ("lossless: vLLM's rejection sampler (outputs are the target model's)", "lossless"),
    ("relaxed: a draft in the target's top-k, within delta of its top token (TensorRT-LLM)", "relaxed"),
    ("typical: p(draft) > min(epsilon, alpha·exp(−entropy)) (Medusa)", "typical"),
)


class AcceptancePanel:
    def __init__(self, ctx: PageContext) -> None:
        self.ctx = ctx
        self.backend = ctx.backend

    def build(self) -> None:
        with gr.Accordion("Acceptance rule: trade the lossless guarantee (engine-wide, live)", open=False):
            gr.Markdown(
                "A lossy rule keeps drafts vLLM's own rule rejects: more tokens per step, but the text is no "
                "longer the target model's. Kept-only-by-the-rule drafts show as **relaxed** tokens; "
                "*Compare with speculation off* shows where the text parts from the target's."
            )
            self.rule = gr.Radio(list(RULE_LABELS), value="lossless", label="Rule", elem_id="acceptance-rule")
            with gr.Row():
                self.top_k = gr.Number(LOSSLESS.top_k, label="relaxed: top_k", precision=0, elem_id="acc-top-k")
                self.delta = gr.Number(LOSSLESS.delta, label="relaxed: delta (probability)", elem_id="acc-delta")
                self.epsilon = gr.Number(LOSSLESS.epsilon, label="typical: epsilon", elem_id="acc-epsilon")
                self.alpha = gr.Number(LOSSLESS.alpha, label="typical: alpha", elem_id="acc-alpha")
            self.apply_btn = gr.Button("Apply acceptance rule", elem_id="apply-acceptance")
            self.said = gr.Markdown("", elem_id="acceptance-said")

    def wire(self) -> None:
        inputs = [self.rule, self.top_k, self.delta, self.epsilon, self.alpha]
        self.apply_btn.click(
            self.apply,
            inputs,
            self.said,
            api_name="set_acceptance",
            trigger_mode="always_last",
            concurrency_id="engine",
            concurrency_limit=ENGINE_CHANGES_AT_ONCE,
        )

    async def apply(
        self, name: str, top_k: float, delta: float, epsilon: float, alpha: float, request: gr.Request
    ) -> str:
        if refusal := self.ctx.refusal(request):
            return refusal
        try:
            rule = AcceptanceRule.from_dict(
                {"name": name, "top_k": top_k, "delta": delta, "epsilon": epsilon, "alpha": alpha}
            )
            await self.backend.set_acceptance(rule)
        except (ValueError, RuntimeError) as e:
            return f"✕ {e}"
        if not rule.lossy:
            return "Sent to the engine: vLLM's lossless rule. Outputs are the target model's again."
        return f"Sent to the engine: **{rule.describe()}**. Outputs are no longer the target model's (see the banner)."


def build_acceptance_panel(ctx: PageContext) -> AcceptancePanel:
    panel = AcceptancePanel(ctx)
    panel.build()
    panel.wire()
    return panel
