"""Catching an idle draft model up on the tokens it skipped: its first pass's inputs, rewritten.

For the idle drafter (``idle_drafter.py``, the worker's side) and the plugin's policy hooks
(``policy_hooks.py``, the scheduler's side, which plans): after a K=0 step the draft model's KV
cache misses the request's tokens of that step. When K is above 0 again, the missed tokens are
put in front of the request's segment of the draft model's first pass, so the pass writes their
KV before anything reads it. Why whole ranges, why in front, and where vLLM 0.32 takes these
inputs: ``docs/catch-up-design.md``.

Contract: pure (numpy only, no vLLM, no torch; a CPU torch tensor goes in through
``np.asarray`` and the results back through ``torch.from_numpy``). Positions and counts are in
tokens.

``prepend_catch_up(token_ids, positions, query_start_loc, missed, budget) -> CatchUp``

- ``token_ids`` [T] int, ``positions`` [T] int: the first pass's flat inputs, request segments
  back to back (vLLM's ``target_token_ids`` and ``target_positions``); each request's positions
  are contiguous and increase by 1.
- ``query_start_loc`` [B+1] int: segment starts, cumulative, ``[0] == 0`` and ``[B] == T``.
- ``missed`` [B]: per request ``None`` or a ``MissedRange``: the ids at positions
  ``start .. start+n-1``, which must end just before the segment's first position
  (``start + n == positions[query_start_loc[i]]``), else ``ValueError``.
- ``budget`` int >= 0: the most tokens prepended in all.

Returns ``CatchUp``: the rewritten ``token_ids`` [T'] and ``positions`` [T'] (the input dtypes),
``query_start_loc`` [B+1], ``max_query_len``, ``num_actual_tokens`` (T' = T + sum of
``caught_up``), ``caught_up`` [B] (tokens prepended per request: 0 or its whole range),
``deferred`` (indices of requests with a non-empty range left out: they keep their holes) and
``source_index`` [T'] (each new token's index in the old arrays, -1 for a caught-up token).

The rule (``select_within_budget``): whole ranges only, oldest hole first (``since_step``, then
batch index), first fit: a range that does not fit what is left of the budget is deferred and the
next one is tried. A part of a range is never taken: a prefix from the hole's start would not be
contiguous with the segment (vLLM gives a segment's tokens the positions ``start_pos + j``, and
attention takes a query as the last tokens of its sequence), and a suffix would leave the
hole's start behind it, where nothing can reach it again (docs/catch-up-design.md, section 4).

``Missed`` is the per-request bookkeeping (first and last position to re-run, the step the hole
opened) and ``update_missed`` its rule across steps, for the scheduler's side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The scheduler-worker side channel (extra attributes, pickled with the objects vLLM sends):
PLAN_ATTR = "spec_explorer_catch_up_plan"  # on SchedulerOutput: {request id: (first position, count)}
APPLIED_ATTR = "spec_explorer_caught_up"  # on ModelRunnerOutput: {request id: tokens re-run}
ZEROED_ATTR = "spec_explorer_holes_zeroed"  # on ModelRunnerOutput of a K=0 step: True if its holes hold zeros
# on ModelRunnerOutput: True when vLLM skipped the draft model's pass in a step with K > 0 (a request
# near the drafter's max model length stops it for the whole batch): every request of it has a hole
PASS_SKIPPED_ATTR = "spec_explorer_draft_pass_skipped"


@dataclass(frozen=True)
class MissedRange:
    """The tokens to put in front of one request's segment: ids at positions ``start``, ``start+1``, ..."""

    start: int  # position of the first id, tokens
    token_ids: Sequence[int] | np.ndarray  # [n] the request's own ids there (the model runner's token_ids_cpu row)
    since_step: int = 0  # engine step at which the hole opened: the catch-up order, oldest first

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class CatchUp:
    """A first pass's inputs with the caught-up tokens in front of their segments (see the module docstring)."""

    token_ids: np.ndarray  # [T'] the input's dtype
    positions: np.ndarray  # [T'] the input's dtype
    query_start_loc: np.ndarray  # [B+1] the input's dtype, cumulative
    max_query_len: int  # tokens, the longest new segment (0 for an empty batch)
    num_actual_tokens: int  # T'
    caught_up: np.ndarray  # [B] int64, tokens prepended per request
    deferred: tuple[int, ...]  # batch indices of requests left with their holes
    source_index: np.ndarray  # [T'] int64, index in the old arrays; -1 for a caught-up token


def select_within_budget(lengths: Sequence[int], since_steps: Sequence[int], budget: int) -> list[bool]:
    """Which requests' whole ranges fit ``budget`` tokens: oldest hole first, first fit.

    ``lengths[i]`` tokens to catch up for request i (0: nothing to do, never taken, never
    deferred); ``since_steps[i]`` the step its hole opened. Shared by the scheduler (to plan)
    and the worker (to apply), so both take the same requests.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if len(lengths) != len(since_steps):
        raise ValueError("lengths and since_steps differ in length")
    take = [False] * len(lengths)
    left = budget
    for i in sorted(range(len(lengths)), key=lambda j: (since_steps[j], j)):
        n = lengths[i]
        if n < 0:
            raise ValueError(f"request {i}: negative range length {n}")
        if 0 < n <= left:
            take[i] = True
            left -= n
    return take


def _check_layout(ids: np.ndarray, pos: np.ndarray, qsl: np.ndarray, missed: Sequence[MissedRange | None]) -> None:
    if ids.ndim != 1 or pos.shape != ids.shape:
        raise ValueError(f"token_ids {ids.shape} and positions {pos.shape} must be the same 1-D shape")
    if qsl.ndim != 1 or len(qsl) < 1 or qsl[0] != 0 or qsl[-1] != len(ids) or np.any(np.diff(qsl) < 0):
        raise ValueError("query_start_loc must be cumulative from 0 to len(token_ids)")
    if len(missed) != len(qsl) - 1:
        raise ValueError(f"missed has {len(missed)} entries for {len(qsl) - 1} requests")
    for i, m in enumerate(missed):
        if m is None or len(m) == 0:
            continue
        if qsl[i + 1] == qsl[i]:
            raise ValueError(f"request {i}: a range to catch up before an empty segment")
        if m.start < 0:
            raise ValueError(f"request {i}: range starts at negative position {m.start}")
        first = int(pos[qsl[i]])
        if m.start + len(m) != first:
            raise ValueError(
                f"request {i}: range {m.start}..{m.start + len(m) - 1} does not end just before"
                f" the segment's first position {first}"
            )


def prepend_catch_up(
    token_ids: Sequence[int] | np.ndarray,
    positions: Sequence[int] | np.ndarray,
    query_start_loc: Sequence[int] | np.ndarray,
    missed: Sequence[MissedRange | None],
    budget: int,
) -> CatchUp:
    """The first pass's inputs with each chosen request's missed range in front of its segment."""
    ids, pos, qsl = np.asarray(token_ids), np.asarray(positions), np.asarray(query_start_loc)
    _check_layout(ids, pos, qsl, missed)
    b = len(qsl) - 1
    lengths = [0 if m is None else len(m) for m in missed]
    take = select_within_budget(lengths, [0 if m is None else m.since_step for m in missed], budget)
    caught = np.array([n if t else 0 for n, t in zip(lengths, take)], dtype=np.int64)
    new_q = np.diff(qsl).astype(np.int64) + caught
    new_qsl = np.zeros(b + 1, dtype=qsl.dtype)
    np.cumsum(new_q, out=new_qsl[1:], dtype=qsl.dtype)
    total = int(new_qsl[-1])
    out_ids = np.empty(total, dtype=ids.dtype)
    out_pos = np.empty(total, dtype=pos.dtype)
    source = np.empty(total, dtype=np.int64)
    for i in range(b):
        at, c = int(new_qsl[i]), int(caught[i])
        if c:
            m = missed[i]
            out_ids[at : at + c] = np.asarray(m.token_ids, dtype=ids.dtype)
            out_pos[at : at + c] = np.arange(m.start, m.start + c, dtype=pos.dtype)
            source[at : at + c] = -1
        lo, hi = int(qsl[i]), int(qsl[i + 1])
        seg = slice(at + c, at + c + hi - lo)
        out_ids[seg] = ids[lo:hi]
        out_pos[seg] = pos[lo:hi]
        source[seg] = np.arange(lo, hi, dtype=np.int64)
    return CatchUp(
        token_ids=out_ids,
        positions=out_pos,
        query_start_loc=new_qsl,
        max_query_len=int(new_q.max()) if b else 0,
        num_actual_tokens=total,
        caught_up=caught,
        deferred=tuple(i for i in range(b) if lengths[i] and not take[i]),
        source_index=source,
    )


@dataclass(frozen=True)
class Missed:
    """One request's hole in the draft model's KV cache: the positions to re-run, inclusive.

    ``first`` is the first position whose draft KV cannot be trusted. Everything from there up
    to the request's next segment must be re-run, also what the draft model wrote after the hole
    opened (its attention read the hole), so ``last`` is kept at the position just before the
    segment of the step being scheduled (``refreshed``).
    """

    first: int  # position, tokens
    last: int  # position, tokens (>= first)
    since_step: int  # engine step at which the hole opened

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def refreshed(self, segment_start: int) -> Missed | None:
        """The range as of a step whose segment starts at ``segment_start``: ``first .. segment_start-1``.

        None when the segment starts at or before ``first`` (a preempted request recomputed from
        there): the step's pass rewrites every position from ``segment_start`` on.
        """
        if segment_start <= self.first:
            return None
        return Missed(self.first, segment_start - 1, self.since_step)

    def as_range(self, token_row: Sequence[int] | np.ndarray) -> MissedRange:
        """The ids to re-run, from the request's row of known token ids (position -> id)."""
        return MissedRange(self.first, np.asarray(token_row[self.first : self.last + 1]), self.since_step)


def update_missed(
    missed: Missed | None,
    *,
    segment_start: int,
    num_scheduled: int,
    drafter_ran: bool,
    caught_up: bool,
    step: int,
) -> Missed | None:
    """A scheduled request's hole after one step.

    ``segment_start``: its first position in the step (``num_computed_tokens`` at the step's
    start, as SchedulerOutput carries it); ``num_scheduled``: its scheduled tokens, drafts
    included; ``drafter_ran``: the step's K was above 0 (the idle drafter skips the pass at 0);
    ``caught_up``: the worker put the whole range in front of its segment in this step.

    - K=0: the pass is skipped; the hole opens at ``segment_start`` or grows over the step's
      tokens (``last`` is an upper bound until the next refresh: drafts may be rejected);
    - K>0 and caught up: no hole;
    - K>0 and deferred: the hole stays; it reaches up to the next segment at the next refresh.
    """
    if caught_up and not drafter_ran:
        raise ValueError("nothing is caught up in a step whose drafter pass is skipped")
    current = missed.refreshed(segment_start) if missed is not None else None
    if not drafter_ran:
        last = segment_start + max(num_scheduled, 1) - 1
        if current is None:  # a new hole (a refreshed-away one keeps its place in the order)
            return Missed(segment_start, last, step if missed is None else missed.since_step)
        return Missed(current.first, max(current.last, last), current.since_step)
    if caught_up:
        return None
    return current
