"""parse_metrics on a vLLM-style /metrics text and PromDelta's derived numbers."""

from __future__ import annotations

import pytest

from engine_adapter.engine.prometheus import parse_metrics

LABELS = 'engine="0",model_name="target"'


def metrics_text(
    drafts: float,
    draft_tokens: float,
    accepted: float,
    per_pos: list[float],
    generation: float,
    running: float = 2.0,
    waiting: float = 1.0,
    prompt: float = 100.0,
    success: float = 3.0,
) -> str:
    """A /metrics page laid out as vLLM's prometheus exporter writes it."""
    lines = [
        "# HELP python_gc_objects_collected_total Objects collected during gc",
        "# TYPE python_gc_objects_collected_total counter",
        'python_gc_objects_collected_total{generation="0"} 1234.0',
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{LABELS}}} {running}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{LABELS}}} {waiting}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{LABELS}}} {prompt}",
        f"vllm:prompt_tokens_created{{{LABELS}}} 1.7e+09",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{LABELS}}} {generation}",
        f"vllm:generation_tokens_created{{{LABELS}}} 1.7e+09",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{LABELS},finished_reason="stop"}} {success - 1}',
        f'vllm:request_success_total{{{LABELS},finished_reason="length"}} 1.0',
        f'vllm:request_success_created{{{LABELS},finished_reason="stop"}} 1.7e+09',
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        f"vllm:spec_decode_num_drafts_total{{{LABELS}}} {drafts}",
        f"vllm:spec_decode_num_drafts_created{{{LABELS}}} 1.7e+09",
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{LABELS}}} {draft_tokens}",
        f"vllm:spec_decode_num_draft_tokens_created{{{LABELS}}} 1.7e+09",
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{LABELS}}} {accepted}",
        f"vllm:spec_decode_num_accepted_tokens_created{{{LABELS}}} 1.7e+09",
        "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
    ]
    for pos, v in enumerate(per_pos):
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS},position="{pos}"}} {v}')
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_created{{{LABELS},position="{pos}"}} 1.7e+09')
    return "\n".join(lines) + "\n"


def test_parse_metrics_snapshot():
    snap = parse_metrics(metrics_text(10, 30, 18, [8, 6, 4], 500), t=12.5)
    assert snap.t == 12.5
    assert snap.counters == {
        "drafts": 10,
        "draft_tokens": 30,
        "accepted_tokens": 18,
        "generation_tokens": 500,
        "prompt_tokens": 100,
        "requests_finished": 3,  # summed over finished_reason labels
    }
    assert snap.accepted_per_pos == {0: 8, 1: 6, 2: 4}
    assert (snap.running, snap.waiting) == (2.0, 1.0)


def test_parse_metrics_sums_engines():
    two = metrics_text(10, 30, 18, [8, 6, 4], 500) + metrics_text(5, 15, 3, [2, 1, 0], 100).replace(
        'engine="0"', 'engine="1"'
    )
    # one family per name: merge the second engine's samples under the first's headers
    body = [ln for ln in two.splitlines() if ln.startswith("vllm:")]
    snap = parse_metrics("\n".join(body) + "\n", t=0.0)
    assert snap.counters["drafts"] == 15
    assert snap.counters["accepted_tokens"] == 21
    assert snap.accepted_per_pos == {0: 10, 1: 7, 2: 4}
    assert snap.running == 4.0


DELTA_CASES = [
    # (before, after, seconds, expected)
    pytest.param(
        (10, 30, 18, [8, 6, 4], 500),
        (30, 90, 48, [18, 16, 14], 1500),
        4.0,
        dict(effective_k=3.0, rate=30 / 60, mal=1 + 30 / 20, per_pos=[10 / 20, 10 / 10, 10 / 10], tps=250.0),
        id="K3",
    ),
    pytest.param(
        (0, 0, 0, [0, 0, 0, 0], 0),
        (8, 20, 6, [4, 2, 0, 0], 40),
        2.0,
        dict(effective_k=2.5, rate=6 / 20, mal=1 + 6 / 8, per_pos=[0.5, 0.5, 0.0, None], tps=20.0),
        id="dynamic-K-position-never-reached",
    ),
    pytest.param(
        (4, 12, 5, [3, 2], 50),
        (4, 12, 5, [3, 2], 80),
        3.0,
        dict(effective_k=None, rate=None, mal=None, per_pos=[None, None], tps=10.0),
        id="no-drafts-in-interval",
    ),
    pytest.param(
        (4, 12, 5, [3, 2], 50),
        (4, 12, 5, [3, 2], 50),
        0.0,
        dict(effective_k=None, rate=None, mal=None, per_pos=[None, None], tps=0.0),
        id="zero-seconds",
    ),
]


@pytest.mark.parametrize("before, after, seconds, expected", DELTA_CASES)
def test_prom_delta(before, after, seconds, expected):
    a = parse_metrics(metrics_text(*before), t=100.0)
    b = parse_metrics(metrics_text(*after), t=100.0 + seconds)
    d = b - a
    assert d.seconds == seconds
    assert d.effective_k == (None if expected["effective_k"] is None else pytest.approx(expected["effective_k"]))
    assert d.draft_acceptance_rate == (None if expected["rate"] is None else pytest.approx(expected["rate"]))
    assert d.mean_acceptance_length == (None if expected["mal"] is None else pytest.approx(expected["mal"]))
    per_pos = d.per_position_acceptance
    assert len(per_pos) == len(expected["per_pos"])
    for got, want in zip(per_pos, expected["per_pos"]):
        assert got is None if want is None else got == pytest.approx(want)
    assert d.generation_tokens_per_second == pytest.approx(expected["tps"])
    assert d.running == b.running


def test_delta_without_spec_metrics():
    """A server running without speculation exposes no spec_decode counters."""
    plain = "\n".join(ln for ln in metrics_text(0, 0, 0, [], 0).splitlines() if "spec_decode" not in ln)
    a = parse_metrics(
        plain.replace(
            'vllm:generation_tokens_total{engine="0",model_name="target"} 0',
            'vllm:generation_tokens_total{engine="0",model_name="target"} 10',
        ),
        t=0.0,
    )
    b = parse_metrics(
        plain.replace(
            'vllm:generation_tokens_total{engine="0",model_name="target"} 0',
            'vllm:generation_tokens_total{engine="0",model_name="target"} 70',
        ),
        t=3.0,
    )
    d = b - a
    assert d.effective_k is None and d.draft_acceptance_rate is None and d.mean_acceptance_length is None
    assert d.per_position_acceptance == []
    assert d.generation_tokens_per_second == pytest.approx(20.0)


def test_every_counter_read_is_one_a_snapshot_keeps():
    from engine_adapter.engine.prometheus import VLLM_COUNTERS
    from engine_adapter.records import PROM_COUNTER_KEYS

    assert sorted(VLLM_COUNTERS.values()) == sorted(PROM_COUNTER_KEYS)
