"""The session trace format: written, read back, cut short, and the shipped traces."""

from __future__ import annotations

import json

import pytest

from engine_adapter.package_data import data_path
from engine_adapter.records import EngineStep
from engine_adapter.service.replay_service import ReplayService
from engine_adapter.trace.format import (
    TRACE_FORMAT,
    read_session,
    trace_format,
)
from tests.support.trace_samples import engine_step, request, write_trace

TRACES = data_path("traces")


def test_session_trace_round_trip(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["session"] is True and lines[0]["vllm_version"] == "0.32.0"
    assert lines[0]["format"] == TRACE_FORMAT
    assert {x["type"] for x in lines} == {"run", "engine_step", "load", "policy", "request", "summary"}
    trace = read_session(path)
    assert trace.duration_s == pytest.approx(4.0)
    # engine steps: every field back, times relative to the session start
    original = engine_step(7, 1000.7, batch=1)
    back = trace.steps[6]
    assert back.t == pytest.approx(0.7) and back.seq == 7
    for name in EngineStep.__dataclass_fields__:
        a, b = getattr(back, name), getattr(original, name)
        if name != "t":
            assert (a == pytest.approx(b, abs=1e-5)) if isinstance(b, float) else a == b, name
    assert trace.loads == [(2.0, 4)]
    assert trace.policies == [{"type": "policy", "t": 1.0, "kind": "fixed", "k": 1}]
    # the request: the recorder's line plus session times and token texts, rebuilt exactly
    r0, r = request(1000.5), trace.requests[0]
    line = trace.request_lines[0]
    assert set(line) >= {
        "request_id",
        "prompt",
        "text",
        "token_ids",
        "kinds",
        "steps",
        "spec_decode_metrics",
        "tokens_per_second",
        "ttft_s",
        "wall_s",
        "t_start",
        "t_end",
    }
    assert r.token_ids == r0.token_ids and r.kinds == r0.kinds and r.text == r0.text
    assert r.t_start == pytest.approx(0.5) and r.t_end == pytest.approx(r0.t_end - 1000)
    assert r.spec_decode_metrics == r0.spec_decode_metrics
    for a, b in zip(r.steps, r0.steps):
        assert (a.drafted, a.accepted, a.emitted, a.k) == (b.drafted, b.accepted, b.emitted, b.k)
        assert [(t.id, t.text, t.kind, t.draft_pos) for t in a.tokens] == [
            (t.id, t.text, t.kind, t.draft_pos) for t in b.tokens
        ]
        assert [(t.id, t.text) for t in a.rejected] == [(t.id, t.text) for t in b.rejected]
        assert a.t == pytest.approx(b.t - 1000)
    assert r.tokens_per_second == pytest.approx(r0.tokens_per_second, rel=1e-3)


def test_reader_copes_with_a_cut_last_line(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    text = path.read_text().splitlines()[:-1]  # no summary: the app was killed
    path.write_text("\n".join(text) + '\n{"type":"engine_step","seq":99,"t":')
    trace = read_session(path)
    assert trace.summary is None and len(trace.steps) == 40 and len(trace.requests) == 1
    assert trace.cut_line == len(text) + 1  # skipped, and said
    with pytest.raises(ValueError, match="starts with"):
        (tmp_path / "bad.jsonl").write_text('{"type": "request"}\n')
        read_session(tmp_path / "bad.jsonl")


@pytest.mark.parametrize(
    "bad_line, said",
    [
        ('{"type":"engine_step","seq":', "not JSON"),  # cut in the middle of the file: never dropped silently
        ('{"type":"engine_step","seq":5}', "a malformed engine_step line"),
        ('{"type":"load","t":"soon","concurrency":4}', "a malformed load line (ValueError"),
        ('{"type":"request","steps":[{"emitted":[1]}]}', "a malformed request line (missing field 'accepted')"),
        ('{"type":"policy"}', "a malformed policy line (missing field 't')"),
        ("[1, 2, 3]", "a line of a trace is a JSON object, not list"),
    ],
)
def test_a_bad_line_before_the_last_names_the_file_and_the_line(tmp_path, bad_line, said):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    lines = path.read_text().splitlines()
    lines.insert(3, bad_line)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as e:
        read_session(path)
    assert f"{path}:4: " in str(e.value) and said in str(e.value)


def test_a_recorder_trace_replays_its_requests(tmp_path):
    """A trace from `python -m engine_adapter.record` (engine-host clock, no timeline) plays too."""
    from engine_adapter.trace.format import request_line

    path = tmp_path / "rec.jsonl"
    lines = [
        {"type": "run", "method": "draft", "k": 3},
        request_line(request(5000.0)),
        request_line(request(5003.0, prompt="The quick brown fox")),
        {"type": "summary", "wall_s": 4.0, "total_tokens": 18, "tokens_per_second": 4.5},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    trace = read_session(path)
    assert [r.t_start for r in trace.requests] == [0.0, pytest.approx(3.0)]
    assert trace.requests[1].steps[0].t == pytest.approx(3.25) and trace.duration_s == pytest.approx(4.01)
    assert [t.text for t in trace.requests[0].tokens][:2] == ["⟨11⟩", "⟨21⟩"]  # no texts: ids shown
    svc = ReplayService(path, speed=50.0)
    assert svc.replay_prompt("The quick brown fox") == "The quick brown fox"


@pytest.mark.parametrize("name", ["low_load.jsonl", "load_0_32_0.jsonl"])
def test_shipped_traces_are_small_and_complete(name):
    path = TRACES / name
    assert path.stat().st_size < 2_000_000
    trace = read_session(path)
    assert trace.header["session"] and trace.header["vllm_version"]
    assert trace_format(trace.header) in range(1, TRACE_FORMAT + 1)
    assert trace.summary is not None and len(trace.steps) > 50 and trace.requests
    for line in trace.request_lines:
        assert [i for s in line["steps"] for i in s["emitted"]] == line["token_ids"]
        assert "".join(x for s in line["steps"] for x in s["texts"]) == line["text"]
    if name.startswith("load_0_32"):
        assert max(n for _, n in trace.loads) == 32 and trace.loads[-1][1] == 0
        assert max(s.batch_size for s in trace.steps) >= 30


def test_a_trace_without_a_format_is_format_one_and_a_newer_one_is_refused_in_words(tmp_path):
    path = tmp_path / "s.jsonl"
    write_trace(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    del header["format"]
    assert trace_format(header) == 1
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert len(read_session(path).requests) == 1  # read as every trace before the field was
    for bad, said in ((TRACE_FORMAT + 1, "written by a newer explorer"), ("2", "not a positive whole number")):
        path.write_text("\n".join([json.dumps({**header, "format": bad}), *lines[1:]]) + "\n")
        with pytest.raises(ValueError, match=f"s.jsonl:1: .*{said}"):
            read_session(path)
