"""The memory roofline's arithmetic and the bench rows' fraction of it (the bandwidth itself is measured
by ``python -m engine_adapter.bench``, not here: a unit test must not time the machine)."""

from __future__ import annotations

import os

import pytest

from engine_adapter.engine.roofline import roofline_tokens_per_s, weight_bytes, worker_cores
from engine_adapter.measure.throughput import add_roofline


@pytest.mark.parametrize(
    "bandwidth, step_bytes, batch, tokens_per_s",
    [
        (14.0, 3_100_000_000, 1, 4.516),  # one core and the 1.5B target in bf16 (DESIGN.md section 9)
        (28.0, 3_100_000_000, 1, 9.032),
        (28.0, 3_100_000_000, 4, 36.13),  # a batch shares one read of the weights
        (28.0, 0, 1, 0.0),
    ],
)
def test_roofline(bandwidth, step_bytes, batch, tokens_per_s):
    assert roofline_tokens_per_s(bandwidth, step_bytes, batch) == pytest.approx(tokens_per_s, rel=1e-3)


@pytest.mark.parametrize("reserved, cores", [(None, max(1, (os.cpu_count() or 1) - 1)), (0, os.cpu_count() or 1)])
def test_worker_cores(reserved, cores):
    assert worker_cores(reserved) == cores


def test_weight_bytes_are_the_safetensors_files(tmp_path):
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 300)
    (tmp_path / "model-00002.safetensors").write_bytes(b"x" * 200)
    (tmp_path / "config.json").write_text("{}")
    assert weight_bytes(tmp_path) == 500


@pytest.mark.parametrize(
    "row, fraction",
    [
        ({"method": "off", "worker_cores": 2, "concurrency": 1, "tokens_per_s": 8.0}, 0.889),
        ({"method": "off", "worker_cores": 1, "concurrency": 2, "tokens_per_s": 4.5}, 0.5),
        ({"method": "draft", "worker_cores": 1, "concurrency": 1, "tokens_per_s": 9.0}, None),  # not plain decoding
    ],
)
def test_bench_rows_get_their_roofline_fraction(row, fraction):
    machine = {"bandwidth_gbs": {"1": 9.0, "2": 18.0}, "target_weight_bytes": 2_000_000_000}
    add_roofline(row, machine)
    assert row.get("roofline_fraction") == (pytest.approx(fraction, abs=1e-3) if fraction else None)
