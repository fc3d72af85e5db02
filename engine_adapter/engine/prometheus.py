"""Server-wide counters from vLLM's Prometheus ``/metrics``, as deltas.

Contract: ``fetch_snapshot(url)`` reads ``/metrics`` (parsed with
prometheus-client's text parser) into a ``records.PromSnapshot``; ``snapshot_b -
snapshot_a`` gives a ``records.PromDelta`` over that interval with:
- effective K = delta draft tokens / delta drafts (K actually used),
- draft acceptance rate = delta accepted / delta draft tokens,
- per-position acceptance = delta accepted at position i / delta drafts that
  reached i (vLLM counts ``num_accepted_tokens_per_pos`` per position),
- tokens per second from ``generation_tokens``.
Works the same against a server we started and one we attached to.
"""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine_adapter.records import PromSnapshot

# vLLM's counter -> its key in PromSnapshot.counters (records.PROM_COUNTER_KEYS)
VLLM_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:request_success": "requests_finished",
}


def parse_metrics(text: str, t: float | None = None) -> PromSnapshot:
    counters: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    running = waiting = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            base = s.name.removesuffix("_total")
            if base in VLLM_COUNTERS:
                key = VLLM_COUNTERS[base]
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
