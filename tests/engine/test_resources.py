"""A machine too small for the models is told so before anything starts, in words, on the page too."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapter.engine.launcher import EngineProcess, EngineStartError
from engine_adapter.engine.resources import (
    DISK_ENV,
    FIT_MARGIN,
    MEM_ENV,
    SKIP_ENV,
    NotEnoughResources,
    check_resources,
    estimate,
    fits_together,
)
from engine_adapter.engine_config import EngineConfig
from engine_adapter.service.engine_service import EngineService
from explorer.views.status import status_markdown
from tests.support.fixtures import tiny_config


def test_not_enough_memory_is_refused_before_anything_starts(tiny, monkeypatch):
    monkeypatch.setenv(MEM_ENV, "0.5")  # pretend the machine has half a GiB free
    cfg = tiny_config(tiny, "draft", "same")
    proc = EngineProcess(cfg, resolve=Path)
    with pytest.raises(EngineStartError) as err:
        proc.start(timeout_s=60)
    text = str(err.value)
    assert "not enough free memory" in text and "0.5 GiB is available" in text
    assert "needs about 2.5 GiB" in text  # tiny weights + 1 GiB KV cache + 1.5 GiB for the processes
    assert "--kv-cache-gib" in text and "close other programs" in text
    assert proc.pid is None  # refused before vLLM was started


def test_not_enough_disk_for_the_packaged_models_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_EXPLORER_CACHE", str(tmp_path / "cache"))  # nothing converted there yet
    monkeypatch.setenv(DISK_ENV, "1")
    cfg = EngineConfig(method="draft", target="packaged:1.5b", draft="packaged:0.5b")
    need = estimate(cfg)
    assert need.build == ["packaged:1.5b", "packaged:0.5b"]
    with pytest.raises(EngineStartError) as err:
        EngineProcess(cfg).start(timeout_s=60)
    text = str(err.value)
    assert "not enough free disk space to prepare packaged:1.5b and packaged:0.5b" in text
    assert f"{need.disk_bytes / (1 << 30):.1f} GiB in {tmp_path / 'cache'}" in text and "1.0 GiB is free" in text


def test_resource_estimate_counts_the_draft_only_for_the_draft_method(tiny):
    off = estimate(tiny_config(tiny, "off"))
    draft = estimate(tiny_config(tiny, "draft", "random"))
    assert [r for r, _, _ in off.models] == ["target"] and [r for r, _, _ in draft.models] == ["target", "draft"]
    assert draft.memory_bytes > off.memory_bytes > (1 + 1.5) * (1 << 30)
    check_resources(tiny_config(tiny, "draft"), available=64 << 30)  # plenty: no error
    with pytest.raises(NotEnoughResources):
        check_resources(tiny_config(tiny, "draft"), available=1 << 30)


@pytest.mark.parametrize(
    ("of_the_need", "fits"),  # the memory available, as a share of the two engines' summed estimate
    [(12.0, True), (1.12, True), (1.05, False), (0.8, False), (0.5, False)],  # each tiny engine: about 2.5 GiB
)
def test_two_engines_fit_together_only_in_their_summed_memory_and_its_margin(tiny, of_the_need, fits):
    """With less than ``FIT_MARGIN`` (10 %) beyond the summed estimate, two engines run one after the
    other: a running float32 engine took 5 % more than its estimate before its KV cache filled."""
    configs = [tiny_config(tiny, "off"), tiny_config(tiny, "draft", "same")]
    need = sum(estimate(c).memory_bytes for c in configs)
    available = int(of_the_need * need)
    why = fits_together(configs, available=available)
    assert (why is None) == fits
    if not fits:
        margin = int(FIT_MARGIN * need)
        assert f"{(need + margin) / (1 << 30):.1f} GiB at once (off " in why
        assert f"{available / (1 << 30):.1f} GiB is available" in why
        assert f"and {margin / (1 << 30):.1f} GiB for what the estimate leaves out" in why


def test_fitting_together_follows_the_overrides(tiny, monkeypatch):
    configs = [tiny_config(tiny, "off"), tiny_config(tiny, "off")]
    monkeypatch.setenv(MEM_ENV, "3")
    assert "3.0 GiB is available" in fits_together(configs)
    monkeypatch.setenv(SKIP_ENV, "1")
    assert fits_together(configs) is None


def test_the_page_says_what_is_missing(tiny, monkeypatch):
    monkeypatch.setenv(MEM_ENV, "0.5")
    svc = EngineService()
    try:
        svc.start(tiny_config(tiny, "off")).result(timeout=60)
        st = svc.status()
        assert st.state == "failed" and "not enough free memory" in st.error
        assert "Engine failed to start" in status_markdown(svc) and "0.5 GiB is available" in status_markdown(svc)
    finally:
        svc.close()
