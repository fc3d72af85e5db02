"""A first start with a shipped cost model for its CPU kind: ready after timing two cells instead of
the whole profile, the first request drafts, and the page names where its cost model came from.

Tiny models (the ``close`` draft), the app's default policy (auto), an empty cost-model cache and
a prior for exactly this engine in ``SPEC_EXPLORER_COST_PRIORS`` (written with ``write_prior``
from a cost model made up for the test: the start scales it to this machine, which is the point).
"""

from __future__ import annotations

import re
import time

import pytest

from app import engine_config, parse_args
from engine_adapter.engine.platform import cpu_platform
from engine_adapter.policy.cost_model import CostModel, CostPoint, fit_cost_model
from engine_adapter.policy.cost_prior import PRIORS_ENV, SCALE_RANGE, TIMING_SUFFIX, write_prior
from tests.support.app_process import CHROMIUM_ARGS, start_app, tiny_app_args, wait_ready
from tests.support.browser import CHROMIUM, SHOTS, showing

playwright = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev)")

READY = "● Engine ready"
# a made-up machine far slower than the tiny pair runs anywhere: the timing pulls it down to the clamp
MADE_UP = CostModel(base_s=2.0, slope_s=0.02, knee_tokens=4, draft_s=0.3, first_s=0.3)


def made_up_prior() -> CostModel:
    cells = [(b, k) for b in (1, 4, 16) for k in (3, 1, 0)]
    return fit_cost_model([CostPoint(b, k, b * (k + 1), MADE_UP.fit_step_s(b, k), 6) for b, k in cells], True)


@pytest.fixture(scope="module")
def shipped(tiny, tmp_path_factory):
    args = tiny_app_args(tiny.target, tiny.close)
    priors = tmp_path_factory.mktemp("priors")
    write_prior(priors / "tiny.json", engine_config(parse_args(args)), cpu_platform(), made_up_prior(), None)
    cache = tmp_path_factory.mktemp("prior-cost-cache")  # no cost model there
    env = {"SPEC_EXPLORER_CACHE": str(cache), PRIORS_ENV: str(priors)}
    app = start_app(args, tmp_path_factory.mktemp("prior-app") / "app.log", env)
    SHOTS.mkdir(exist_ok=True)
    try:
        wait_ready(app, None, timeout_s=120)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pg = browser.new_page(viewport={"width": 1400, "height": 1100})
            pg.goto(app.url)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and READY not in pg.locator("#engine-status").inner_text():
                pg.wait_for_timeout(200)
            yield pg, cache
            browser.close()
    finally:
        app.stop(timeout_s=60)


def test_ready_after_timing_the_shipped_model_not_profiling(shipped):
    pg, cache = shipped
    status = pg.locator("#engine-status").inner_text()
    assert READY in status and "K policy auto table" in status, status
    took = re.search(r"([\d.]+) s of it spent measuring this machine", status)
    assert took and float(took[1]) < 30, status  # two cells of one request, not nine of up to 16
    profiles = [p for p in (cache / "cost").glob("*.json") if not p.name.endswith(TIMING_SUFFIX)]
    assert not profiles, "a profile ran and was cached: the prior was not used"
    policy = pg.locator("#policy-status")
    playwright.expect(policy).to_contain_text("shipped for", timeout=15_000)
    text = policy.inner_text()
    scaled = re.search(r"scaled ×([\d.]+) \(verification\) and ×([\d.]+) \(drafter\) by [12] timed cells", text)
    assert scaled, text
    assert float(scaled[1]) == SCALE_RANGE[0], f"the made-up prior is far slower than this machine: {text}"


def test_the_first_request_drafts_and_the_model_learns_from_it(shipped):
    pg, _ = shipped
    pg.locator("#prompt textarea").fill("def fibonacci(n):")
    pg.locator("#run").click()
    with showing(pg, "#request-card"):
        pg.wait_for_selector("#request-card:has-text('draft_acceptance_rate')", timeout=60_000)
    assert pg.locator("#token-view .tv-text .k-accepted").count() > 0, pg.locator("#token-view").inner_text()[:500]
    # the policy's refit (every 30 s) reads the request's steps: the page says what it learned from
    playwright.expect(pg.locator("#policy-status")).to_contain_text("learned since from", timeout=120_000)
    pg.screenshot(path=str(SHOTS / "prior-1-first-request.png"), full_page=True)
