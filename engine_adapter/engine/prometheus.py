"""Server-wide counters from vLLM's Prometheus ``/metrics``, as deltas.

Contract: ``fetch_snapshot(url)`` reads ``/metrics`` (parsed with
prometheus-client's text parser) into a ``PromSnapshot``; ``snapshot_b -
snapshot_a`` gives a ``PromDelta`` over that interval with:
- effective K = delta draft tokens / delta drafts (K actually used),
- draft acceptance rate = delta accepted / delta draft tokens,
- per-position acceptance = delta accepted at position i / delta drafts that
  reached i (vLLM counts ``num_accepted_tokens_per_pos`` per position),
- tokens per second from ``generation_tokens``.
Works the same against a server we started and one we attached to.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:request_success": "requests_finished",
}


@dataclass(frozen=True)
class PromSnapshot:
    t: float  # time.monotonic() when read
    counters: dict[str, float]
    accepted_per_pos: dict[int, float]
    running: float  # vllm:num_requests_running
    waiting: float  # vllm:num_requests_waiting

    def __sub__(self, earlier: PromSnapshot) -> PromDelta:
        d = {k: self.counters.get(k, 0.0) - earlier.counters.get(k, 0.0) for k in _COUNTERS.values()}
        positions = sorted(set(self.accepted_per_pos) | set(earlier.accepted_per_pos))
        per_pos = [self.accepted_per_pos.get(p, 0.0) - earlier.accepted_per_pos.get(p, 0.0) for p in positions]
        return PromDelta(seconds=self.t - earlier.t, counts=d, accepted_per_pos=per_pos, running=self.running)


@dataclass(frozen=True)
class PromDelta:
    seconds: float
    counts: dict[str, float]
    accepted_per_pos: list[float] = field(default_factory=list)
    running: float = 0.0

    @property
    def effective_k(self) -> float | None:
        drafts = self.counts["drafts"]
        return self.counts["draft_tokens"] / drafts if drafts else None

    @property
    def draft_acceptance_rate(self) -> float | None:
        n = self.counts["draft_tokens"]
        return self.counts["accepted_tokens"] / n if n else None

    @property
    def mean_acceptance_length(self) -> float | None:
        drafts = self.counts["drafts"]
        return 1.0 + self.counts["accepted_tokens"] / drafts if drafts else None

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """P(position i kept | position i reached); position 1 is reached by every draft."""
        out: list[float | None] = []
        reached = self.counts["drafts"]
        for accepted in self.accepted_per_pos:
            out.append(accepted / reached if reached else None)
            reached = accepted  # position i+1 is reached only if i was kept
        return out

    @property
    def generation_tokens_per_second(self) -> float:
        return self.counts["generation_tokens"] / self.seconds if self.seconds > 0 else 0.0


def parse_metrics(text: str, t: float | None = None) -> PromSnapshot:
    counters: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    running = waiting = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            base = s.name.removesuffix("_total")
            if base in _COUNTERS:
                key = _COUNTERS[base]
                counters[key] = counters.get(key, 0.0) + s.value
            elif base == "vllm:spec_decode_num_accepted_tokens_per_pos":
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
            elif s.name == "vllm:num_requests_running":
                running += s.value
            elif s.name == "vllm:num_requests_waiting":
                waiting += s.value
    return PromSnapshot(time.monotonic() if t is None else t, counters, per_pos, running, waiting)


async def fetch_snapshot(client: httpx.AsyncClient, base_url: str) -> PromSnapshot:
    r = await client.get(f"{base_url.rstrip('/')}/metrics")
    r.raise_for_status()
    return parse_metrics(r.text)
