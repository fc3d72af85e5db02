"""Live K policies for one running engine: off, fixed K, table, auto table, auction.

Contract: ``PolicyController(client, k_max, max_batch)`` turns a ``PolicySpec``
into control-channel commands for the scheduler tap and remembers what is in
force:

- ``off``: K=0 for every batch size (the drafter, if a model, still runs;
  docs/k-policies.md: judge it against an engine started with speculation off);
- ``fixed``: K for every batch size;
- ``table``: vLLM's ``num_speculative_tokens_per_batch_size`` rows;
- ``auto``: the table ``k_policy.derive_auto_table`` derives from the cost
  model and the measured per-position acceptance; ``rederive(alphas)``
  re-sends it when acceptance drifts (only if the table changed);
- ``auction``: the tap's slot auction under the cost model;
- ``equal``: as many slots as the auction admits each step, shared alike between the
  requests (``k_policy.equal_slots``): the same budget, spent on fairness instead.

``auto``, ``auction`` and ``equal`` need a cost model (``profiler.profile_engine``).
Nothing here knows the UI.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from engine_adapter.engine_config import KTable, check_table
from engine_adapter.policy.cost_model import CostModel
from engine_adapter.policy.k_policy import AutoTable, derive_auto_table

PolicyKind = Literal["off", "fixed", "table", "auto", "auction", "equal"]
POLICY_KINDS: tuple[PolicyKind, ...] = ("off", "fixed", "table", "auto", "auction", "equal")
SLOT_POLICIES = ("auction", "equal")  # the tap's per-request slots, under the cost model
COST_POLICIES = ("auto", *SLOT_POLICIES)  # those that need the measured cost model


@dataclass(frozen=True)
class PolicySpec:
    kind: PolicyKind
    k: int = 3  # for "fixed"
    table: KTable | None = None  # for "table"

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed K={self.k}"
        if self.kind == "table":
            return f"K table {[list(r) for r in self.table or []]}"
        return {
            "off": "K=0 (no drafts)",
            "auto": "auto table",
            "auction": "slot auction",
            "equal": "equal slots (the auction's slots, shared alike)",
        }[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "k": self.k, "table": [list(r) for r in self.table] if self.table else None}


@dataclass(frozen=True)
class PolicyState:
    spec: PolicySpec
    table: KTable | None  # the batch-size -> K table sent (None under the auction)
    control: int  # client.controls_sent after sending: the tap acknowledges it
    t: float  # time.monotonic() when sent
    auto: AutoTable | None = None  # what "auto" derived (the curves it maximised)
    alphas: list[float] = field(default_factory=list)


class PolicyController:
    def __init__(self, client, k_max: int, max_batch: int) -> None:
        self.client = client
        self.k_max = k_max
        self.max_batch = max_batch
        self.cost: CostModel | None = None
        self.state: PolicyState | None = None

    def check(self, spec: PolicySpec) -> PolicySpec:
        """Validate a spec (vLLM's table rules, K range, a cost model where needed)."""
        if spec.kind not in POLICY_KINDS:
            raise ValueError(f"policy must be one of {', '.join(POLICY_KINDS)}; got {spec.kind!r}")
        if spec.kind == "fixed" and not 0 <= spec.k <= self.k_max:
            raise ValueError(
                f"K must be between 0 and {self.k_max} (this engine's num_speculative_tokens); got {spec.k}"
            )
        if spec.kind == "table":
            return PolicySpec("table", spec.k, check_table(spec.table, self.k_max))
        if spec.kind in COST_POLICIES and self.cost is None:
            raise ValueError(f"the {spec.kind} policy needs the measured cost model: profile the engine first")
        return spec

    async def apply(self, spec: PolicySpec, alphas: list[float] | None = None) -> PolicyState:
        spec = self.check(spec)
        auto = None
        table: KTable | None
        if spec.kind in SLOT_POLICIES:
            # the estimator's start where it has seen nothing yet: the measured acceptance, not a guess
            prior = {"prior": alphas[0]} if alphas else {}
            await self.client.set_auction(self.cost, **prior, allocation=spec.kind)
            table = None
        else:
            if spec.kind == "off":
                table = [(1, self.max_batch, 0)]
            elif spec.kind == "fixed":
                table = [(1, self.max_batch, spec.k)]
            elif spec.kind == "table":
                table = list(spec.table)
            else:
                auto = derive_auto_table(self.cost, alphas or [], self.k_max, self.max_batch)
                table = auto.rows
            await self.client.set_k_table(table)
        self.state = PolicyState(spec, table, self.client.controls_sent, time.monotonic(), auto, list(alphas or []))
        return self.state

    async def rederive(self, alphas: list[float]) -> bool:
        """Under "auto": derive again from fresh acceptance; send only a changed table."""
        st = self.state
        if st is None or st.spec.kind != "auto" or self.cost is None:
            return False
        auto = derive_auto_table(self.cost, alphas, self.k_max, self.max_batch)
        if auto.rows == st.table:
            self.state = PolicyState(st.spec, st.table, st.control, st.t, auto, list(alphas))
            return False
        await self.client.set_k_table(auto.rows)
        self.state = PolicyState(st.spec, auto.rows, self.client.controls_sent, time.monotonic(), auto, list(alphas))
        return True
