"""The profiler's cells, derived from the machine: which (batch size, K) pin the cost model's curve.

Contract: ``profile_grid(platform, max_num_seqs, k_max, capture_sizes, max_num_batched_tokens)``
is a pure function to a ``ProfileGrid`` (batch sizes ascending, Ks descending, the CUDA-graph
capture sizes the engine pads its steps to, in tokens); ``config_profile_grid(config, platform)``
takes them from an ``EngineConfig`` as ``engine.server_args`` launches it (``capture_sizes``,
``batched_tokens``). On this CPU the grid is the cells ``default_grid`` gives (batch sizes
1, 4, 16 x K 3, 1, 0) and one request at k_max; on a GPU it reaches past the knee (hundreds of tokens per step) and
records the capture sizes its steps are padded to; ``profile_grid`` says why, and what it costs.
``profiler.profile_engine`` measures a grid's cells; ``cost_model.CostModel`` pads steps to its ``capture_sizes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine_adapter.engine import server_args
from engine_adapter.engine.platform import Platform
from engine_adapter.engine_config import EngineConfig

DEFAULT_BATCH_SIZES = (1, 4, 16)  # a CPU's batch sizes (its knee: a handful of tokens per step)
GPU_BATCH_GROWTH = 4  # a GPU's batch sizes: 1, 4, 16, 64, 256, ... then max_num_seqs


def default_ks(k_max: int) -> list[int]:
    """The Ks profiled, highest first (K=0 last: after a K=0 step an idle drafter's
    requests have a hole, and a K>0 cell would time its catch-up); the fit prices the rest."""
    return sorted({0, 1, min(3, k_max)}, reverse=True)


@dataclass(frozen=True)
class ProfileGrid:
    """The cells a profile measures, and the step sizes the engine pads its steps to."""

    batch_sizes: tuple[int, ...]  # ascending
    ks: tuple[int, ...]  # descending: K=0 last
    capture_sizes: tuple[int, ...] = ()  # tokens per step with a CUDA graph, ascending; () = none (CPU, eager)
    one_request_ks: tuple[int, ...] = ()  # further Ks measured at batch size 1 only (a CPU's k_max)

    def ks_at(self, batch_size: int) -> list[int]:
        """The Ks measured at ``batch_size``, highest first: ``ks``, and at 1 ``one_request_ks`` too."""
        extra = self.one_request_ks if batch_size == 1 else ()
        return sorted({*self.ks, *extra}, reverse=True)

    @property
    def cells(self) -> list[tuple[int, int]]:
        """(batch size, K) in the order measured: batch sizes ascending, K descending within each."""
        return [(b, k) for b in sorted(set(self.batch_sizes)) for k in self.ks_at(b)]

    def cells_around(self, k_by_batch: Sequence[int], k_max: int) -> list[tuple[int, int]]:
        """At each of the grid's batch sizes a K table covers (``k_by_batch[b - 1]``), the K it
        chooses and the Ks either side within 0..``k_max``, highest first: the cells that tell
        whether a neighbouring K would do better there (what idle time explores)."""
        return [
            (b, k)
            for b in sorted(set(self.batch_sizes))
            if b <= len(k_by_batch)
            for k in (k_by_batch[b - 1] + 1, k_by_batch[b - 1], k_by_batch[b - 1] - 1)
            if 0 <= k <= k_max
        ]


def top_of_one_request(k_max: int) -> tuple[int, ...]:
    """(k_max,) where ``default_ks`` stop below it: the largest step one request can take, measured
    rather than priced by the fit's per-pass line, which the top draft passes outran on both CPU
    kinds (docs/k-policies.md, "A larger K must earn its risk")."""
    return (k_max,) if k_max > max(default_ks(k_max)) else ()


def default_grid(k_max: int) -> ProfileGrid:
    """This CPU's grid: batch sizes 1, 4, 16 x ``default_ks``, and one request at k_max
    (``top_of_one_request``); nothing padded."""
    return ProfileGrid(DEFAULT_BATCH_SIZES, tuple(default_ks(k_max)), one_request_ks=top_of_one_request(k_max))


def profile_grid(
    platform: Platform,
    max_num_seqs: int,
    k_max: int,
    capture_sizes: Sequence[int] = (),
    max_num_batched_tokens: int | None = None,
) -> ProfileGrid:
    """The cells that pin the cost model's curve on this machine, derived from it alone (pure).

    CPU: batch sizes 1, 4, 16 x ``default_ks(k_max)`` (K 3, 1, 0), the nine cells measured on 2 cores
    (``profiler``'s docstring): the knee lies at a handful of tokens, and 16 x 4 = 64 tokens are well
    past it (each capped at ``max_num_seqs``: a smaller engine never holds a batch of 16); and one
    request at K = k_max (``top_of_one_request``: seconds), the top the policies choose at one request.

    GPU: the knee lies at hundreds of tokens, so the batch sizes grow geometrically
    (``GPU_BATCH_GROWTH``: 1, 4, 16, 64, 256, ...) up to ``max_num_seqs`` itself, the largest batch
    the engine runs, and K = ``k_max`` joins the Ks: its cell at the top batch size is the largest
    step the policies can choose (max_num_seqs x (k_max+1) tokens), measured rather than
    extrapolated past a knee the smaller cells may not reach. On both, a batch size is capped so
    its largest step fits ``max_num_batched_tokens``.

    Where steps are padded to CUDA-graph ``capture_sizes`` (tokens) the grid keeps them, for the
    fit: a cell's step time is that of the captured size it is padded up to. Under
    ``cuda_graph_capture_sizes`` (n x (K+1) for every K at vLLM's batch sizes, and every 8th size
    up to 512 tokens) a step is padded by at most 7 tokens up to 512, so the cells stay at
    the geometric sizes, max_num_seqs included, rather than move onto exact graph sizes.

    Cost on a GPU: |ks| (4 for k_max >= 4) x (1 + ceil(log4 max_num_seqs)) batch sizes: 16 cells
    at max_num_seqs 64, 20 at 256, 24 at 1024; each cell 4-8 steps of tens of milliseconds after a
    K switch and a settling step, plus one prefill of ``b`` short prompts per batch size. The
    largest batch holds max_num_seqs x (prompt + ``profiler.cell_max_tokens``) tokens of KV cache.
    """
    ks = sorted({*default_ks(k_max), k_max} if platform.is_gpu else set(default_ks(k_max)), reverse=True)
    one_request = () if platform.is_gpu else top_of_one_request(k_max)
    top = max_num_seqs
    if max_num_batched_tokens is not None:  # the top cell's step must fit the step's token budget
        top = max(1, min(top, max_num_batched_tokens // (ks[0] + 1)))
    wanted = _geometric(top, GPU_BATCH_GROWTH) if platform.is_gpu else DEFAULT_BATCH_SIZES
    sizes = tuple(sorted(set(capture_sizes)))
    batch_sizes = sorted({min(b, top) for b in wanted})
    return ProfileGrid(tuple(batch_sizes), tuple(ks), sizes, one_request)


def _geometric(top: int, growth: int) -> list[int]:
    """1, growth, growth^2, ... below ``top``, then ``top``."""
    out = [1]
    while out[-1] * growth < top:
        out.append(out[-1] * growth)
    return sorted(set(out + [top]))


def config_profile_grid(config: EngineConfig, platform: Platform) -> ProfileGrid:
    """``profile_grid`` for an engine with live policies started from ``config`` on ``platform``: its
    capture sizes and step budget as ``server_args`` launches it."""
    k_max = config.k_max if config.live_policies else config.k
    sizes = server_args.capture_sizes(config, platform)
    return profile_grid(platform, config.max_num_seqs, k_max, sizes, server_args.batched_tokens(config, platform))
