"""Acceptance rules on synthetic logits: the lossy verdicts, the rebuilt rows, the rule's checks.

The lossless rule is vLLM's own function (``lossy_sampler`` returns its rows untouched); the
table of ``relax_row`` cases checks the output contract every rule keeps: the accepted prefix
equals the drafts, then exactly one target token, then padding.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine_adapter.acceptance_rule import AcceptanceRule
from engine_adapter.vllm_plugin.acceptance_rules import PAD, lossy_verdicts, relax_row, relax_rows

V = 8  # vocabulary of the synthetic cases


def logits_for(*rows: list[float]) -> torch.Tensor:
    """[T, V] logits whose softmax is each row's probabilities (the rest of V shares what is left)."""
    out = torch.full((len(rows), V), -math.inf)
    for i, probs in enumerate(rows):
        rest = (1.0 - sum(probs)) / (V - len(probs))
        full = list(probs) + [rest] * (V - len(probs))
        out[i] = torch.log(torch.tensor(full))
    return out


RELAXED = AcceptanceRule("relaxed", top_k=3, delta=0.3)
TYPICAL = AcceptanceRule("typical", epsilon=0.09, alpha=0.3)


@pytest.mark.parametrize(
    "case, rule, probs, draft, keep",
    [
        ("top-2, within delta", RELAXED, [0.5, 0.3, 0.1], 1, True),
        ("top-2, outside delta", RELAXED, [0.7, 0.2, 0.05], 1, False),
        (
            "within delta but outside top-k",
            RelaxedK1 := AcceptanceRule("relaxed", top_k=1, delta=0.9),
            [0.5, 0.3],
            1,
            False,
        ),
        ("top-1 itself (lossless would keep it too)", RELAXED, [0.5, 0.3], 0, True),
        ("an unsure target: any top-k candidate", RELAXED, [0.25, 0.24, 0.23], 2, True),
        ("typical, high entropy: p above the capped threshold", TYPICAL, [0.12] * 7, 3, True),
        ("typical, low entropy: p below alpha*exp(-H)", TYPICAL, [0.97, 0.02], 1, False),
        ("typical, low entropy: the confident token", TYPICAL, [0.97, 0.02], 0, True),
        ("lossless keeps nothing by itself", AcceptanceRule(), [0.5, 0.5], 1, False),
    ],
)
def test_lossy_verdict(case, rule, probs, draft, keep):
    v = lossy_verdicts(rule, logits_for(probs), torch.tensor([draft]))
    assert bool(v.keep[0]) is keep, (case, float(v.p_draft[0]), float(v.p_top[0]))
    assert float(v.p_draft[0]) == pytest.approx(probs[draft], rel=1e-5)


@pytest.mark.parametrize("rule", [RELAXED, TYPICAL, AcceptanceRule("relaxed", top_k=1000, delta=1.0)])
def test_a_draft_with_a_non_finite_logit_is_never_kept(rule):
    logits = torch.zeros(1, V)
    logits[0, 5] = -math.inf  # a grammar mask
    assert not bool(lossy_verdicts(rule, logits, torch.tensor([5])).keep[0])
    logits[0, 5] = math.nan
    assert not bool(lossy_verdicts(rule, logits, torch.tensor([5])).keep[0])


def test_typical_threshold_is_min_of_epsilon_and_alpha_exp_minus_entropy():
    probs = torch.tensor([0.6, 0.3, 0.1])
    h = float(-(probs * probs.log()).sum())
    threshold = min(0.2, 0.5 * math.exp(-h))  # 0.5 * exp(-0.898) = 0.204 -> 0.2
    rule = AcceptanceRule("typical", epsilon=0.2, alpha=0.5)
    logits = torch.full((1, V), -math.inf)
    logits[0, :3] = probs.log()
    for draft, expected in [(1, 0.3 > threshold), (2, 0.1 > threshold)]:
        assert bool(lossy_verdicts(rule, logits, torch.tensor([draft])).keep[0]) is expected


def row(*ids: int, k: int = 4) -> torch.Tensor:
    return torch.tensor(list(ids) + [PAD] * (k + 1 - len(ids)), dtype=torch.int32)


# greedy rows: the target's argmax per position is 0, 1, 2, 3 (probabilities 0.5, then 0.3 for 4, 5, 6, 7)
GREEDY_LOGITS = torch.stack([logits_for([0.5 if j == i else 0.0 for j in range(4)])[0] for i in range(4)])
GREEDY_LOGITS[:, 4:] = math.log(0.125)  # the rest: 0.5 / 4 each


@pytest.mark.parametrize(
    "case, drafts, lossless_row, keep, expect_row, relaxed_positions",
    [
        ("all kept by vLLM: untouched", [0, 1, 2, 3], row(0, 1, 2, 3, 9), [1, 1, 1, 1], row(0, 1, 2, 3, 9), []),
        ("early mismatch, not relaxable: vLLM's row", [0, 5, 2, 3], row(0, 1), [0, 0, 0, 0], row(0, 1), []),
        ("mismatch relaxed, rest match: bonus", [0, 5, 2, 3], row(0, 1), [0, 1, 0, 0], row(0, 5, 2, 3, 9), [2]),
        ("mismatch relaxed, next mismatch not: target token", [0, 5, 6, 3], row(0, 1), [0, 1, 0, 0], row(0, 5, 2), [2]),
        ("two relaxed in a row", [4, 5, 2, 3], row(0), [1, 1, 0, 0], row(4, 5, 2, 3, 9), [1, 2]),
        ("relaxed at the last position: bonus", [0, 1, 2, 7], row(0, 1, 2, 3), [0, 0, 0, 1], row(0, 1, 2, 7, 9), [4]),
    ],
)
def test_relax_row_keeps_the_output_contract(case, drafts, lossless_row, keep, expect_row, relaxed_positions):
    d = torch.tensor(drafts)
    v = lossy_verdicts(AcceptanceRule("relaxed", top_k=V, delta=1.0), GREEDY_LOGITS, d)
    v = type(v)(torch.tensor(keep, dtype=torch.bool), v.top, v.p_draft, v.p_top, v.probs)  # the verdicts of the case
    out, relaxed = relax_row(lossless_row, d, v, bonus=9, greedy=True)
    assert out.tolist() == expect_row.tolist(), case
    assert [r.position for r in relaxed] == relaxed_positions, case
    n = int((out != PAD).sum())
    assert out[: n - 1].tolist() == drafts[: n - 1] and (out[n:] == PAD).all()  # prefix, one token, padding
    for r in relaxed:  # the target's own choice, and its probability, beside the kept draft
        assert r.target_id == r.position - 1 and r.p_target == pytest.approx(0.5)


def test_a_sampled_row_ends_with_a_residual_sample_never_the_rejected_draft():
    logits = logits_for([0.4, 0.35, 0.25], [0.6, 0.2, 0.2])
    drafts = torch.tensor([1, 1])  # position 1 relaxed; position 2 then judged losslessly, else resampled
    rule = AcceptanceRule("relaxed", top_k=3, delta=0.1)
    seen = set()
    for seed in range(200):
        gen = torch.Generator().manual_seed(seed)
        v = lossy_verdicts(rule, logits, drafts)
        out, relaxed = relax_row(row(0, k=2), drafts, v, bonus=7, greedy=False, generator=gen)
        ids = [int(x) for x in out if int(x) != PAD]
        assert ids[0] == 1 and [r.position for r in relaxed] == [1]
        seen.add(tuple(ids))
    # the second draft kept with probability 0.2 (then the bonus), else a token of the residual (0 or 2)
    assert (1, 1, 7) in seen and any(len(s) == 2 and s[1] != 1 for s in seen), seen


def test_relax_rows_leaves_rows_without_a_rejection_alone():
    out = torch.stack([row(0, 1, 9, k=2), row(0, 1, k=2), row(8, k=2)])  # all kept; a rejection; no drafts
    drafts = torch.tensor([0, 1, 0, 5])
    logits = torch.cat([GREEDY_LOGITS[:2], GREEDY_LOGITS[:2]])
    rule = AcceptanceRule("relaxed", top_k=V, delta=1.0)
    relaxed = relax_rows(rule, out, drafts, [2, 2, 0], logits, torch.tensor([[9], [9], [8]]), [True] * 3)
    assert out.tolist() == [[0, 1, 9], [0, 5, 9], [8, PAD, PAD]]
    assert list(relaxed) == [1] and relaxed[1][0].position == 2


@pytest.mark.parametrize(
    "given, error",
    [
        ({"name": "fly"}, "unknown acceptance rule"),
        ({"name": "relaxed", "top_k": 0}, "top_k"),
        ({"name": "relaxed", "top_k": 2.5}, "whole number"),
        ({"name": "relaxed", "delta": 1.5}, "delta"),
        ({"name": "relaxed", "delta": "0.5"}, "finite number"),
        ({"name": "typical", "epsilon": 0}, "epsilon"),
        ({"name": "typical", "alpha": float("nan")}, "finite number"),
        ({"name": "typical", "beta": 1}, "unknown parameter"),
    ],
)
def test_a_bad_rule_is_refused_saying_why(given, error):
    with pytest.raises(ValueError, match=error):
        AcceptanceRule.from_dict(given)


def test_a_rule_round_trips_and_describes_itself():
    rule = AcceptanceRule.from_dict({"name": "relaxed", "top_k": 10, "delta": 0.6})
    assert AcceptanceRule.from_dict(rule.to_dict()) == rule and rule.lossy
    assert rule.describe() == "relaxed (top_k=10, delta=0.6)"
    assert not AcceptanceRule.from_dict(None).lossy


def greedy_batch(seed: int) -> tuple:
    """A random greedy batch as vLLM's rejection_sample takes it (drafts often equal to the argmax)."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(seed)
    num_drafts = torch.randint(0, 5, (6,), generator=g).tolist()
    t = sum(num_drafts)
    logits = torch.randn(t, 50, generator=g)
    argmax = logits.argmax(-1)
    drafts = torch.where(torch.rand(t, generator=g) < 0.7, argmax, torch.randint(0, 50, (t,), generator=g))
    cu = torch.tensor(num_drafts).cumsum(0).to(torch.int32)
    bonus = torch.randint(0, 50, (6, 1), generator=g, dtype=torch.int64)
    meta = SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
    return drafts.to(torch.int32), num_drafts, max(num_drafts), cu, None, logits, bonus, meta


@pytest.fixture(scope="module")
def vllm_rejection_sample():
    """vLLM's function, its kernels as the CPU platform registers them when an engine starts."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import rejection_sample

    if current_platform.is_cpu():
        current_platform.register_triton_kernel_overrides()
    return rejection_sample


@pytest.mark.parametrize("seed", range(5))
def test_under_the_lossless_rule_the_wrapper_returns_vllms_own_rows(seed, vllm_rejection_sample):
    rejection_sample = vllm_rejection_sample

    from engine_adapter.vllm_plugin.lossy_sampler import RuleStep, rule_aware

    batch = greedy_batch(seed)
    expected = rejection_sample(*batch)
    assert torch.equal(rule_aware(rejection_sample, RuleStep())(*batch), expected)
    # a relaxed rule that keeps only the target's top token is the greedy lossless rule again
    strict = RuleStep(AcceptanceRule("relaxed", top_k=1, delta=0.0))
    assert torch.equal(rule_aware(rejection_sample, strict)(*batch), expected)
    assert strict.relaxed == {}
    # a loose one keeps at least as many drafts, each row still a draft prefix plus one token
    loose = RuleStep(AcceptanceRule("relaxed", top_k=50, delta=1.0))
    got = rule_aware(rejection_sample, loose)(*batch)
    drafts, num_drafts = batch[0].tolist(), batch[1]
    start = 0
    for r, n in enumerate(num_drafts):
        kept = int((got[r] != PAD).sum()) - 1
        assert kept >= int((expected[r] != PAD).sum()) - 1
        assert got[r, :kept].tolist() == drafts[start : start + kept]
        start += n
