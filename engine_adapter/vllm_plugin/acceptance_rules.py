"""Lossy acceptance rules as pure functions over tensors: which drafts a rule keeps.

Contract (torch only, no vLLM; ``lossy_sampler.py`` calls them inside vLLM's worker):

- ``lossy_verdicts(rule, logits, drafts)``: for T draft positions, the processed target
  logits [T, V] (float32) and the draft ids [T], whether the lossy rule alone would keep each
  draft, with the target's own top token and both probabilities (``Verdicts``);
- ``relax_row(...)``: one request's verified row, rebuilt: vLLM's lossless row is the
  accepted prefix, then one target token; from its first rejection on, a draft the lossy
  rule keeps is kept (``relaxed``), the drafts after it are judged again (the lossless rule
  first, then the lossy one), and the row ends with exactly one target token: the target's
  choice at the first draft neither rule keeps (argmax for a greedy request, a sample of the
  residual distribution for a sampled one), or vLLM's bonus token when every draft was kept.

The rules themselves are described in ``engine_adapter.acceptance_rule``. A draft whose
target logit is not finite (a grammar mask) is never kept by a lossy rule. Units:
probabilities in [0, 1], entropy in nats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_adapter.acceptance_rule import AcceptanceRule
from engine_adapter.vllm_plugin.wire import RelaxedRow

PAD = -1  # vLLM's PLACEHOLDER_TOKEN_ID: the row's padding after its target token
# Where the rule travels between vLLM's processes (``lossy_sampler.py``, ``policy_hooks.py``):
RULE_ATTR = "_spec_explorer_acceptance_rule"  # on SchedulerOutput: the rule's dict (absent = lossless)
RELAXED_ATTR = "_spec_explorer_relaxed"  # on ModelRunnerOutput: request id -> [wire.RelaxedRow]


@dataclass(frozen=True)
class Verdicts:
    keep: torch.Tensor  # [T] bool: the lossy rule keeps the draft
    top: torch.Tensor  # [T] int64: the target's most likely token
    p_draft: torch.Tensor  # [T] float32: the target's probability of the draft
    p_top: torch.Tensor  # [T] float32: the target's probability of its top token
    probs: torch.Tensor  # [T, V] float32: the target's distribution


def lossy_verdicts(rule: AcceptanceRule, logits: torch.Tensor, drafts: torch.Tensor) -> Verdicts:
    """The lossy rule's verdict on each draft; all False under ``lossless``."""
    logits = logits.float()  # [T, V]
    drafts = drafts.long()  # [T]
    finite = torch.isfinite(logits.gather(1, drafts[:, None]))[:, 0]  # [T]
    probs = torch.softmax(logits, dim=-1)  # [T, V]; -inf logits get 0
    p_draft = probs.gather(1, drafts[:, None])[:, 0]  # [T]
    p_top, top = probs.max(dim=-1)  # [T]
    if rule.name == "relaxed":
        rank = (probs > p_draft[:, None]).sum(dim=-1)  # [T]: tokens strictly more likely than the draft
        keep = (rank < rule.top_k) & (p_draft >= p_top - rule.delta)
    elif rule.name == "typical":
        entropy = -torch.where(probs > 0, probs * torch.log(probs), torch.zeros_like(probs)).sum(dim=-1)  # [T]
        threshold = torch.minimum(torch.full_like(entropy, rule.epsilon), rule.alpha * torch.exp(-entropy))
        keep = p_draft > threshold
    else:
        keep = torch.zeros_like(finite)
    return Verdicts(keep & finite & (p_draft > 0), top, p_draft, p_top, probs)


def relax_row(
    row: torch.Tensor,
    drafts: torch.Tensor,
    verdicts: Verdicts,
    bonus: int,
    greedy: bool,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, list[RelaxedRow]]:
    """One request's row [K+1] (int32, vLLM's lossless verdict on its n drafts, PAD after its
    target token) rebuilt under the lossy rule; returns the row and the relaxed tokens.

    ``draft_probs`` [n, V] is the drafter's distribution when it sampled (else its drafts count as
    certain, q = 1, as in vLLM); ``generator`` is the request's own, for a seeded sampled request."""
    n = drafts.numel()
    accepted = int((row != PAD).sum()) - 1  # vLLM's rule: the row's length less its target token
    if accepted >= n:
        return row, []  # every draft kept losslessly
    ids = drafts.tolist()
    kept: list[int] = ids[:accepted]
    relaxed: list[RelaxedRow] = []
    final: int | None = None
    for j in range(accepted, n):
        if j > accepted and _lossless_keeps(j, ids[j], verdicts, greedy, draft_probs, generator):
            kept.append(ids[j])
            continue
        if bool(verdicts.keep[j]):
            kept.append(ids[j])
            relaxed.append(
                RelaxedRow(
                    position=j + 1,
                    target_id=int(verdicts.top[j]),
                    p_draft=float(verdicts.p_draft[j]),
                    p_target=float(verdicts.p_top[j]),
                )
            )
            continue
        # neither rule keeps draft j: the target's token ends the row (vLLM's own at its rejection)
        final = (
            int(row[accepted]) if j == accepted else _target_token(j, ids[j], verdicts, greedy, draft_probs, generator)
        )
        break
    if final is None:
        final = bonus  # every draft kept: vLLM's bonus token, sampled after the last draft
    out = torch.full_like(row, PAD)
    values = kept + [final]
    out[: len(values)] = torch.tensor(values, dtype=row.dtype)
    return out, relaxed


def _lossless_keeps(
    j: int, draft: int, v: Verdicts, greedy: bool, draft_probs: torch.Tensor | None, gen: torch.Generator | None
) -> bool:
    if greedy:
        return draft == int(v.top[j])
    q = 1.0 if draft_probs is None else float(draft_probs[j, draft])
    device = gen.device if gen is not None else "cpu"  # a request's generator is a CUDA one on a GPU
    u = float(torch.rand((), generator=gen, device=device))
    return q > 0 and u < min(1.0, float(v.p_draft[j]) / q)


def _target_token(
    j: int, draft: int, v: Verdicts, greedy: bool, draft_probs: torch.Tensor | None, gen: torch.Generator | None
) -> int:
    """The target's token where draft j is rejected: argmax, or a sample of max(p - q, 0), normalised."""
    if greedy:
        return int(v.top[j])
    residual = v.probs[j].clone()  # [V]
    if draft_probs is None:
        residual[draft] = 0.0
    else:
        residual = torch.clamp(residual - draft_probs[j].float(), min=0.0)
    total = float(residual.sum())
    if total <= 0:
        return int(v.top[j])
    return int(torch.multinomial(residual / total, 1, generator=gen))


def relax_rows(
    rule: AcceptanceRule,
    out: torch.Tensor,
    drafts: torch.Tensor,
    num_drafts: list[int],
    logits: torch.Tensor,
    bonus: torch.Tensor,
    greedy: list[bool],
    draft_probs: torch.Tensor | None = None,
    generators: dict[int, torch.Generator] | None = None,
) -> dict[int, list[RelaxedRow]]:
    """vLLM's whole verified batch under the lossy rule, rebuilt in place.

    ``out`` [B, max_spec_len + 1] int32 (vLLM's lossless rows), ``drafts`` [T] (every request's
    drafts, concatenated), ``num_drafts`` [B], ``logits`` [T, V] (processed), ``bonus`` [B, 1],
    ``greedy`` [B], ``draft_probs`` [T, V] or None, ``generators`` batch index -> the request's
    own. Returns batch index -> its relaxed tokens (rows with none are left out)."""
    relaxed: dict[int, list[RelaxedRow]] = {}
    start = 0
    for r, n in enumerate(num_drafts):
        seg = slice(start, start + n)
        start += n
        if n == 0 or int((out[r] != PAD).sum()) - 1 >= n:
            continue  # no drafts, or all kept by vLLM's own rule: nothing to relax
        verdicts = lossy_verdicts(rule, logits[seg], drafts[seg])
        q = None if draft_probs is None else draft_probs[seg]
        row, kept = relax_row(out[r], drafts[seg], verdicts, int(bonus[r, 0]), greedy[r], q, (generators or {}).get(r))
        out[r] = row
        if kept:
            relaxed[r] = kept
    return relaxed
