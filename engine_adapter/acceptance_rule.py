"""The acceptance rule in force: vLLM's lossless rule, or a lossy one that keeps more drafts.

Contract: ``AcceptanceRule`` names a rule and its parameters; ``from_dict`` checks them and
says plainly what is wrong (``ValueError``); ``to_dict`` is what the control channel, the
trace's run header and the sweep CSV carry. No torch, no vLLM: the decision itself is
``vllm_plugin.acceptance_rules`` (inside vLLM's worker), on the target's processed
probabilities p (softmax of the logits vLLM samples from, temperature and top-k/top-p applied
for sampled requests, temperature 1 for greedy ones):

- ``lossless``: vLLM's own rejection sampler, untouched (greedy: draft == argmax; sampled:
  accept with probability min(1, p/q)). Outputs are the target model's.
- ``relaxed`` (TensorRT-LLM's ``use_relaxed_acceptance_for_thinking``): a draft the lossless
  rule rejected is kept when it is among the target's ``top_k`` most likely tokens and
  p(draft) >= p(top-1) - ``delta``. Delta is a difference of probabilities, not of
  log-probabilities: TensorRT-LLM's config documents "only candidates with prob >= (top-1
  prob - delta) are kept", and its PyTorch MTP path takes the top-k of the softmax, so its
  recommended delta 0.6 means the same here. It makes the rule loosest where the target is
  unsure (p(top-1) <= delta: any top-k candidate passes) and strict where it is sure.
- ``typical`` (Medusa's typical acceptance): kept when p(draft) > min(``epsilon``,
  ``alpha`` * exp(-H(p))), H the entropy of p in nats; Medusa's defaults 0.09 and 0.3.

FLy (loosely accepting a mismatch when the target is unsure and the next drafts match) is not
offered: its verdict on a draft near the end of a step depends on drafts the next step has not
proposed yet, so it must defer, and vLLM's one-step output contract (accepted prefix, one
target token) has no way to hold a verdict open.

A token with a non-finite target logit (a grammar mask, a banned word) is never kept.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

RuleName = Literal["lossless", "relaxed", "typical"]
RULE_NAMES: tuple[RuleName, ...] = ("lossless", "relaxed", "typical")


@dataclass(frozen=True)
class AcceptanceRule:
    name: RuleName = "lossless"
    top_k: int = 10  # relaxed: the draft must be among the target's top_k tokens
    delta: float = 0.6  # relaxed: p(draft) >= p(top-1) - delta (probabilities, 0..1)
    epsilon: float = 0.09  # typical: the threshold's cap (a probability)
    alpha: float = 0.3  # typical: scale of exp(-entropy)

    @property
    def lossy(self) -> bool:
        return self.name != "lossless"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> AcceptanceRule:
        """A checked rule; ``ValueError`` saying which parameter is wrong and why."""
        d = dict(d or {})
        name = d.pop("name", "lossless")
        if name not in RULE_NAMES:
            raise ValueError(f"unknown acceptance rule {name!r}: choose one of {', '.join(RULE_NAMES)}")
        unknown = set(d) - {"top_k", "delta", "epsilon", "alpha"}
        if unknown:
            raise ValueError(f"unknown parameter(s) {sorted(unknown)} for an acceptance rule")
        rule = cls(name=name, **{k: _number(k, v) for k, v in d.items()})
        rule.check()
        return rule

    def check(self) -> None:
        if not (isinstance(self.top_k, int) and 1 <= self.top_k <= 1000):
            raise ValueError(f"top_k must be a whole number from 1 to 1000, not {self.top_k!r}")
        if not 0.0 <= self.delta <= 1.0:
            raise ValueError(f"delta is a difference of probabilities, from 0 to 1, not {self.delta!r}")
        if not 0.0 < self.epsilon <= 1.0:
            raise ValueError(f"epsilon is a probability above 0 and at most 1, not {self.epsilon!r}")
        if not 0.0 <= self.alpha <= 10.0:
            raise ValueError(f"alpha must be from 0 to 10, not {self.alpha!r}")

    def describe(self) -> str:
        """One line for people: the rule and its parameters."""
        if self.name == "relaxed":
            return f"relaxed (top_k={self.top_k}, delta={self.delta:g})"
        if self.name == "typical":
            return f"typical (epsilon={self.epsilon:g}, alpha={self.alpha:g})"
        return "lossless (vLLM's rejection sampler)"


def lossless_accepted(accepted: int, relaxed_positions: Sequence[int]) -> int:
    """Of a step's ``accepted`` drafts, those vLLM's own rule kept: every draft before the first one
    only a lossy rule kept (positions 1-based), which vLLM's rule rejected. The acceptance estimates
    learn this verdict, so acceptance stays a property of the text, not of the rule."""
    return min(accepted, min(relaxed_positions) - 1) if relaxed_positions else accepted


def _number(key: str, value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, not {value!r}")
    if key == "top_k":
        if int(value) != value:
            raise ValueError(f"top_k must be a whole number, not {value!r}")
        return int(value)
    return float(value)


LOSSLESS = AcceptanceRule()
PARAMETERS = ("top_k", "delta", "epsilon", "alpha")  # every rule's parameters, as the CLIs name them


def add_parameter_arguments(parser: argparse.ArgumentParser) -> None:
    """The rules' parameters as command-line flags (``--top-k``, ``--delta``, ``--epsilon``, ``--alpha``)."""
    flags = [
        ("--top-k", int, LOSSLESS.top_k, "relaxed: top-k candidates"),
        ("--delta", float, LOSSLESS.delta, "relaxed: probability gap"),
        ("--epsilon", float, LOSSLESS.epsilon, "typical: epsilon"),
        ("--alpha", float, LOSSLESS.alpha, "typical: alpha"),
    ]
    for flag, kind, default, what in flags:
        parser.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")


def pop_parameters(args: dict[str, Any]) -> dict[str, Any]:
    """The parameters ``add_parameter_arguments`` parsed, taken out of ``vars(namespace)``."""
    return {name: args.pop(name) for name in PARAMETERS}
