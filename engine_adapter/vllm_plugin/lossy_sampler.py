"""The acceptance rule inside vLLM's worker: vLLM's rejection sampler, then the lossy rule; and the
exact drafts it verified, reported back.

Contract: ``AcceptanceRuleMixin`` goes before vLLM's platform worker in every worker class of the
plugin (``workers_cpu.py``, ``workers_gpu.py``; ``--worker-cls`` from ``paths.worker_class_path``). At
``load_model`` it replaces the module attribute ``rejection_sample`` of
``vllm.v1.sample.rejection_sampler`` (looked up by name at every call, DESIGN.md section 7)
with a wrapper that always runs vLLM's own function first; under ``lossless`` that result is
returned untouched, so outputs are byte-identical to vLLM's. Under a lossy rule the rows with
a rejection are rebuilt by ``acceptance_rules.relax_rows`` (the accepted prefix, then exactly
one target token, then padding: the contract vLLM's scheduler counts by).

The rule travels with each step: the scheduler sets ``RULE_ATTR`` (the rule's dict, or absent
for lossless) on the ``SchedulerOutput``; ``execute_model`` reads it. The relaxed tokens go
back on the ``ModelRunnerOutput`` as ``RELAXED_ATTR``: request id -> [``wire.RelaxedRow``] (the
record the tap sends on, as it is), pickled to the scheduler's process.
A failure in the lossy rule never stops the engine: the step keeps vLLM's lossless rows.

The same wrapper captures the draft ids the sampler verified (``side_channel.VerifiedDrafts``)
and ``sample_tokens`` hands them back as ``side_channel.VERIFIED_ATTR``: request id -> ids. The
scheduler's own copy is a ``-1`` placeholder under async scheduling; this one is exact on every
platform and in every mode.

This module pins vLLM internals: ``vllm_seam`` lists them and checks the version.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import vllm.v1.sample.rejection_sampler as rejection_sampler_module

from engine_adapter.acceptance_rule import LOSSLESS, AcceptanceRule
from engine_adapter.vllm_plugin.acceptance_rules import RELAXED_ATTR, RULE_ATTR, relax_rows
from engine_adapter.vllm_plugin.side_channel import VERIFIED_ATTR, VerifiedDrafts, attach
from engine_adapter.vllm_plugin.vllm_seam import require_tested_vllm
from engine_adapter.vllm_plugin.wire import RelaxedRow

require_tested_vllm()  # the names this module pins are vllm_seam's, checked for one vLLM release

logger = logging.getLogger("vllm").getChild("acceptance_rule")

GREEDY_TEMPERATURE = 0.0  # vLLM's (rejection_sampler.py): a greedy request's temperature


@dataclass
class RuleStep:
    """The rule of the step in progress and what it relaxed (batch row -> tokens)."""

    rule: AcceptanceRule = LOSSLESS
    relaxed: dict[int, list[RelaxedRow]] = field(default_factory=dict)
    verified: VerifiedDrafts | None = None  # the drafts the sampler verified, the step in progress
    failed: int = 0


def greedy_rows(sampling_metadata, batch_size: int) -> list[bool]:
    if sampling_metadata.all_greedy:
        return [True] * batch_size
    if sampling_metadata.all_random or sampling_metadata.temperature is None:
        return [False] * batch_size
    return (sampling_metadata.temperature == GREEDY_TEMPERATURE).tolist()[:batch_size]


def rule_aware(original, step: RuleStep):
    """vLLM's ``rejection_sample``, then the rule in force on the rows it rejected."""

    @functools.wraps(original)
    def rejection_sample(
        draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
        bonus_token_ids, sampling_metadata, *args, **kwargs,
    ):  # fmt: skip
        try:
            step.verified = VerifiedDrafts.capture(draft_token_ids, num_draft_tokens)
        except Exception:  # never stop the engine: the tap then publishes counts, not ids
            step.verified = None
        out = original(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, *args, **kwargs,
        )  # fmt: skip
        if not step.rule.lossy:
            return out
        lossless = out.clone()
        try:
            step.relaxed = relax_rows(
                step.rule,
                out,
                draft_token_ids,
                list(num_draft_tokens),
                target_logits,
                bonus_token_ids,
                greedy_rows(sampling_metadata, len(num_draft_tokens)),
                draft_probs,
                sampling_metadata.generators,
            )
        except Exception:  # never stop the engine: this step keeps vLLM's lossless verdicts
            step.relaxed = {}
            step.failed += 1
            if step.failed == 1:
                logger.exception("acceptance rule %s failed; the step keeps vLLM's verdicts", step.rule.name)
            return lossless
        return out

    rejection_sample.spec_explorer_original = original  # type: ignore[attr-defined]
    return rejection_sample


def install(step: RuleStep) -> None:
    """Put the rule-aware wrapper in place of vLLM's function (once per process)."""
    current = rejection_sampler_module.rejection_sample
    original = getattr(current, "spec_explorer_original", current)
    rejection_sampler_module.rejection_sample = rule_aware(original, step)


class AcceptanceRuleMixin:
    """Mixed in before a vLLM worker class; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._rule_step = RuleStep()

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        install(self._rule_step)
        logger.info("acceptance rules: vLLM's rejection sampler, then the rule each step names")

    def execute_model(self, scheduler_output, *args, **kwargs):
        rule = getattr(scheduler_output, RULE_ATTR, None)
        try:
            self._rule_step.rule = AcceptanceRule.from_dict(rule) if rule else LOSSLESS
        except ValueError:  # the adapter checked it; a bad one falls back to vLLM's rule
            self._rule_step.rule = LOSSLESS
        return super().execute_model(scheduler_output, *args, **kwargs)

    def sample_tokens(self, grammar_output):
        step = self._rule_step
        step.relaxed, step.verified = {}, None
        out = super().sample_tokens(grammar_output)
        relaxed, verified = step.relaxed, step.verified
        step.relaxed, step.verified = {}, None
        if not relaxed and verified is None:
            return out
        return attach(out, lambda output: report(output.req_ids, relaxed, verified))


def report(req_ids: list[str], relaxed: dict[int, list[RelaxedRow]], verified: VerifiedDrafts | None) -> dict:
    """The step's side-channel attributes for the scheduler (pickled back with the output)."""
    attributes: dict = {}
    if relaxed:
        attributes[RELAXED_ATTR] = {req_ids[r]: tokens for r, tokens in relaxed.items() if r < len(req_ids)}
    if verified is not None:
        try:
            attributes[VERIFIED_ATTR] = verified.by_request(req_ids)
        except Exception:  # counts that do not add up, a failed copy: no report, the tap publishes counts
            pass
    return attributes
