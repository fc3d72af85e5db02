"""K policies derived from measurements: the auto table and the slot auction.

Contract (pure functions over numbers; no vLLM, no UI, so the scheduler tap
and the tests call the same code):

- ``expected_tokens(alphas, K)``: E(K) = 1 + sum_{i<=K} prod_{j<=i} alpha_j,
  tokens one request emits per step when its draft position j survives with
  probability alpha_j (given every earlier one did);
- ``derive_auto_table(cost, alphas, k_max, max_batch)``: for every batch size
  the K maximising E(K) / step_s(b, K) (emitted tokens per second; each draft
  position weighed down by ``DRAFT_RISK``, ``risk_weighed``), written as
  vLLM's ``num_speculative_tokens_per_batch_size`` rows, with the curves it
  maximised; where those per-batch-size optima would rise with the batch size,
  the non-increasing K sequence that loses the least (``non_increasing_ks``):
  K falls as the machine fills, never rises;
- ``auction(scores, cost, batch_size)``: (request, position) draft slots
  scored by survival probability, admitted globally best-first until the
  number of slots maximising expected tokens per second under the cost model;
  returns each request's admitted draft length;
- ``equal_slots(lengths, total)``: the same number of slots shared alike (water-filling):
  every request the same draft length, capped at what it drafted, the rest to the others;
- ``best_ceiling(scores, cost)``: how many positions the drafter should
  propose at all, since a model drafter's cost is paid for every position
  (risk-weighed as the auto table);
- ``SlotEstimator``: running per-request, per-position acceptance counts with a
  shrinkage prior from all requests, giving each request's survival scores;
- ``idle_drafter_k(k_policy, ...)``: the K a table policy's step runs with when
  the draft model idles at K = 0 (``idle_drafter.py``).
- ``one_request_outlook(cost, alphas, k_max)``: the hardware's part in a speedup:
  what a draft pass and a verification cost against a plain step at one request's
  best K (risk-weighed), and the speedup that allows (``OneRequestOutlook``).

Units: probabilities in [0, 1]; tokens per step; seconds via ``CostModel``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from engine_adapter.acceptance import survival
from engine_adapter.engine_config import KTable
from engine_adapter.policy.cost_model import CostModel


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """E(K): expected tokens emitted per step (the target's own token included)."""
    if k > len(alphas):
        raise ValueError(f"need acceptance for {k} positions, have {len(alphas)}")
    return 1.0 + sum(survival(alphas[:k]))


@dataclass(frozen=True)
class AutoTable:
    rows: KTable  # vLLM's [start_bs, end_bs, K], inclusive, first starts at 1
    k_by_batch: list[int]  # [max_batch], index b-1 -> chosen K (never rising with b)
    # tokens/s per request for K = 0..k_max at each batch size: [max_batch][k_max + 1]
    rate: list[list[float]]
    alphas: list[float]
    # [max_batch]: K maximising each batch size's own rate, risk-weighed (ties: the smaller), before the
    # never-rising constraint; differs from k_by_batch only where those optima rise
    optimum_by_batch: list[int] = field(default_factory=list)

    def up_to(self, max_batch: int) -> AutoTable:
        """The same choices for batch sizes 1..``max_batch`` only (what a chart shows). Not the
        table ``derive_auto_table`` gives for ``max_batch``: larger batch sizes can hold K up at
        smaller ones (``non_increasing_ks``)."""
        n = min(max_batch, len(self.k_by_batch))
        ks = self.k_by_batch[:n]
        return AutoTable(rows_from_ks(ks), ks, self.rate[:n], self.alphas, self.optimum_by_batch[:n])


# Each draft position a K adds must earn its price's uncertainty: a rate is weighed as
# rate x (1 - DRAFT_RISK)^K when K is chosen, so K=5 wins over K=3 only where the model promises
# about 4 % more. A cell's median over 8 steps of a CPU's 5 % step-to-step noise is sure to about
# 2 % (5 % / sqrt(8)), and a step's cost is least sure at the Ks furthest from the measured cells
# (a CPU's profile measures K 0, 1, 3 at every batch size and k_max at one request, and prices the
# rest by a per-pass line); a near-tie is a guess, and the larger K the dearer one:
# docs/k-policies.md, "A larger K must earn its risk".
DRAFT_RISK = 0.02


def risk_weighed(rate: Sequence[float]) -> list[float]:
    """``rate`` ([K] tokens/s) as K is chosen by: rate[K] x (1 - ``DRAFT_RISK``)^K."""
    return [r * (1.0 - DRAFT_RISK) ** k for k, r in enumerate(rate)]


def best_k(cost: CostModel, alphas: Sequence[float], batch_size: int, k_max: int) -> tuple[int, list[float]]:
    """K in 0..k_max maximising E(K) / step_s(b, K) as ``risk_weighed`` weighs it, and the rate for
    each K (tokens/s per request, as the cost model predicts it: not weighed)."""
    steps = cost.step_s_by_k(batch_size, k_max)
    rate = [expected_tokens(alphas, k) / steps[k] for k in range(k_max + 1)]
    return best_k_of(risk_weighed(rate)), rate


@dataclass(frozen=True)
class OneRequestOutlook:
    """What the machine allows one request, by a cost model and the acceptance measured."""

    plain_s: float  # a plain step (K=0, one request), s
    k: int  # one request's best K, risk-weighed (``risk_weighed``); 1 where none pays (what drafting would cost)
    draft_pass_share: float  # a draft pass at K, on average, over a plain step (K's cells over the fit included)
    verify_share: float  # verifying K + 1 tokens, over a plain step
    speedup: float  # E(K) over the step's cost in plain steps: at K, against plain decoding


def one_request_outlook(cost: CostModel, alphas: Sequence[float], k_max: int) -> OneRequestOutlook | None:
    """The hardware's part in one request's speedup (None: no acceptance measured, or no step time)."""
    usable = min(k_max, len(alphas))
    plain_s = cost.step_s(1, 0)
    if usable < 1 or plain_s <= 0:
        return None
    best, rate = best_k(cost, alphas, 1, usable)
    k = max(best, 1)
    beyond_fit = cost.step_s(1, k) - cost.fit_step_s(1, k)  # K's cells over the fit: the draft passes'
    return OneRequestOutlook(
        plain_s=plain_s,
        k=k,
        draft_pass_share=(cost.draft_cost_s(1, k) + beyond_fit) / k / plain_s,
        verify_share=cost.verify_s(k + 1) / plain_s,
        speedup=rate[k] / rate[0],
    )


def best_k_of(rate: Sequence[float]) -> int:
    """The K with the largest ``rate[K]`` ([k_max + 1]); ties: the smaller K."""
    return max(range(len(rate)), key=lambda k: (rate[k], -k))


def rows_from_ks(k_by_batch: Sequence[int]) -> KTable:
    """Compress a per-batch-size K list into inclusive vLLM rows."""
    rows: KTable = []
    for b, k in enumerate(k_by_batch, 1):
        if rows and rows[-1][2] == k:
            rows[-1] = (rows[-1][0], b, k)
        else:
            rows.append((b, b, k))
    return rows


def non_increasing_ks(rate: Sequence[Sequence[float]]) -> list[int]:
    """The K per batch size, never rising with it, that keeps the most of each batch size's best rate.

    ``rate[b-1][K]`` is tokens/s per request at batch size b with K drafts ([max_batch][k_max + 1]).
    Where the per-batch-size optima (``best_k_of`` each row: ties to the smaller K) never
    rise, they are the answer, exactly. Otherwise: the K_1 >= K_2 >= ... maximising the sum over b
    of rate[b-1][K_b] / max(rate[b-1]), sums equal to 12 decimals counted as ties, which go to the
    smaller K at the smallest batch size first. A row whose best rate is 0 or below scores 0 at
    every K; an empty ``rate`` gives []. Why a constraint: on the fitted curves the optimum can
    rise with the batch size, by a few per cent of rate, where a drafter's fixed cost per step
    spreads over more requests (docs/k-policies.md, "The auto table never rises"). Every batch
    size up to max_batch weighs the same, so the engine's max_num_seqs can move K at the smaller
    ones."""
    optima = [best_k_of(row) for row in rate]
    if all(a >= b for a, b in zip(optima, optima[1:])):
        return optima
    n_k = len(rate[0])
    score = []  # [max_batch][n_k]: each rate as a share of its batch size's best
    for row in rate:
        top = max(row)
        score.append([r / top if top > 0 else 0.0 for r in row])
    # tail[b][k]: the best score of batch sizes b+1.. when batch size b+1 runs K = k at most
    tail = [[0.0] * n_k for _ in range(len(rate) + 1)]
    for b in range(len(rate) - 1, -1, -1):
        best_here = float("-inf")
        for k in range(n_k):
            best_here = max(best_here, score[b][k] + tail[b + 1][k])
            tail[b][k] = best_here
    ks: list[int] = []
    ceiling = n_k - 1
    for b in range(len(rate)):
        # the smallest K at or under the ceiling reaching this batch size's best total
        total = [round(score[b][k] + tail[b + 1][k], 12) for k in range(ceiling + 1)]
        chosen = min(range(ceiling + 1), key=lambda k: (-total[k], k))
        ks.append(chosen)
        ceiling = chosen
    return ks


def derive_auto_table(cost: CostModel, alphas: Sequence[float], k_max: int, max_batch: int) -> AutoTable:
    """The auto table for batch sizes 1..``max_batch`` (the engine's max_num_seqs) and K up to
    ``k_max``: each batch size's rates under ``cost`` with acceptance ``alphas`` per draft position
    (unmeasured positions count as never accepted), its own optimum, and the K chosen so that K
    never rises with the batch size (``non_increasing_ks``)."""
    if k_max < 0 or max_batch < 1:
        raise ValueError("k_max must be >= 0 and max_batch >= 1")
    alphas = list(alphas[:k_max]) + [0.0] * (k_max - len(alphas))  # unmeasured positions: no credit
    optima, rates = zip(*(best_k(cost, alphas, b, k_max) for b in range(1, max_batch + 1)))
    ks = non_increasing_ks([risk_weighed(row) for row in rates])
    return AutoTable(rows_from_ks(ks), ks, list(rates), alphas, list(optima))


@dataclass(frozen=True)
class AuctionResult:
    admitted: dict[str, int]  # request -> draft positions admitted (a prefix)
    slots: int  # total admitted slots (the budget chosen)
    expected_tokens: float  # per step, all requests: batch + sum of admitted scores
    step_s: float  # predicted seconds for the step
    # expected tokens per second for 0..len(candidates) admitted slots (the curve maximised)
    rate_by_slots: list[float] = field(default_factory=list)


def auction(
    scores: Mapping[str, Sequence[float]],
    cost: CostModel,
    batch_size: int | None = None,
    k_drafted: int = 0,
) -> AuctionResult:
    """Admit (request, position) slots best-first while expected tokens/s rises.

    ``scores[r][i-1]`` is the survival probability of request r's draft
    position i (non-increasing in i). ``batch_size`` counts every request in
    the step (default: those scored); each emits at least its target token.
    ``k_drafted``: positions the drafter ran this step (its cost is spent
    whatever is admitted). A slot is taken only with all earlier positions of
    its request, so admission is per-request prefix.
    """
    b = len(scores) if batch_size is None else batch_size
    # a running minimum makes each request's scores non-increasing, so sorting
    # by (score desc, position asc) admits every request's positions in order
    order = sorted(
        (
            (s, pos, rid)
            for rid, ss in scores.items()
            for pos, s in enumerate(accumulate((float(x) for x in ss), min), 1)
        ),
        key=lambda x: (-x[0], x[1], x[2]),
    )
    fixed = cost.draft_cost_s(b, k_drafted)
    # admitting every slot costs what ``step_s`` answers for the auto table (the fit scaled by K's
    # factor, ``CostModel.k_factor``); the fit's slope prices the trimmed slots
    fixed += cost.step_s(b, k_drafted) - cost.fit_step_s(b, k_drafted)
    gain = [float(b)]
    for s, _, _ in order:
        gain.append(gain[-1] + s)
    rate = [g / max(cost.verify_s(b + n) + fixed, 1e-9) for n, g in enumerate(gain)]
    best = max(range(len(rate)), key=lambda n: (rate[n], -n))
    admitted = {rid: 0 for rid in scores}
    for _, _, rid in order[:best]:
        admitted[rid] += 1
    return AuctionResult(admitted, best, gain[best], cost.verify_s(b + best) + fixed, rate)


def equal_slots(lengths: Mapping[str, int], total: int) -> dict[str, int]:
    """``total`` draft slots shared alike between requests (water-filling): each gets the same
    prefix length, a request that drafted fewer keeps what it drafted and its share goes to the
    others; where the slots do not divide evenly, the requests first in ``lengths`` get one more."""
    admitted = {rid: 0 for rid in lengths}
    left = max(0, min(int(total), sum(max(n, 0) for n in lengths.values())))
    open_ = [rid for rid, n in lengths.items() if n > 0]
    while left and open_:
        share, extra = divmod(left, len(open_))
        for i, rid in enumerate(open_):
            give = min(share + (1 if i < extra else 0), lengths[rid] - admitted[rid])
            admitted[rid] += give
            left -= give
        open_ = [rid for rid in open_ if admitted[rid] < lengths[rid]]
    return admitted


# which batch sizes count as "the load that just was" when a new request's drafter
# would be engaged (idle_drafter_k): those of the last RECENT_PEAK_STEPS steps (more
# than the steps between requests of one burst reaching the engine), if they ended
# within RECENT_PEAK_S (an engine idle since then has no recent load)
RECENT_PEAK_STEPS = 8
RECENT_PEAK_S = 2.0  # seconds


def idle_drafter_k(k_policy: int, *, can_draft: bool, fresh: bool, k_at_recent_peak: int) -> int:
    """The K a step runs with under a table policy when the draft model idles at K = 0.

    An idle drafter leaves a hole in a request's draft KV at each K = 0 step (no
    drafts for it until the hole is caught up, and one longer than the per-step
    catch-up budget never is), and it engages a request (runs the draft model's
    prefill over a new prompt, or re-runs a hole: about as long as 2-4 decode
    steps on the packaged pair here) at its first step with K > 0. So, beside the
    policy's K for the batch size:
    - no request in the step can use a draft (``can_draft`` False: none new, and
      every running one with a hole too long to catch up): K = 0, or the draft
      model would propose for nobody;
    - a request is to be engaged (``fresh``: a new one, or a hole to catch up)
      while the batch was larger a moment ago and the policy's K at that size is
      0 (``k_at_recent_peak``): K = 0, since the load that just was is the best
      guess of the load to come, and a drafter engaged now would most likely be
      idled again within a few steps, its pass paid for nothing (requests of one
      burst reach the engine a step or two apart).
    """
    if not can_draft:
        return 0
    if fresh and k_at_recent_peak == 0:
        return 0
    return k_policy


def best_ceiling(
    scores: Mapping[str, Sequence[float]], cost: CostModel, batch_size: int | None = None
) -> tuple[int, list[float]]:
    """How many positions the drafter should propose: the K whose auction rate is highest, as
    ``risk_weighed`` weighs it (the rates returned are not weighed).

    The drafter's cost is paid for every position it proposes (``k_drafted``),
    admitted or not, so a model drafter should not propose positions that the
    auction would deny anyway. Returns (K, best expected tokens/s for each K).
    """
    k_max = max((len(s) for s in scores.values()), default=0)
    rates = [
        max(auction({r: s[:k] for r, s in scores.items()}, cost, batch_size, k_drafted=k).rate_by_slots)
        for k in range(k_max + 1)
    ]
    return best_k_of(risk_weighed(rates)), rates
