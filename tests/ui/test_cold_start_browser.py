"""A newcomer's first minutes, in a real browser: ``python app.py`` with no cost model cached.

Tiny models (the ``close`` draft, so drafting pays and auto drafts), the app's default policy
(auto), an empty cost-model cache: the page says it is measuring this machine and draws the
step-time picture, then says ready (that no visitor's request shares a profiling step, and that
one sent meanwhile is refused, tests/engine/test_cold_start.py checks on the engine's steps); the first request shows
accepted drafts; raising the load slider lowers the K in force the live charts show.
"""

from __future__ import annotations

import time

import pytest

from tests.support.app_process import CHROMIUM_ARGS, start_app, tiny_app_args, wait_ready
from tests.support.browser import CHROMIUM, SHOTS, drag_slider, showing

playwright = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev)")

READY = "● Engine ready"
MEASURING = "Measuring this machine"
# the step-time picture's live operating point: "now: <batch size> req, K=<K in force>" (last 5 s)
NOW_JS = """() => {
  const m = /now: (\\d+) req, K=(\\d+)/.exec(document.querySelector('#step-time').textContent);
  return m ? [+m[1], +m[2]] : null;
}"""


@pytest.fixture(scope="module")
def cold(tiny, tmp_path_factory):
    """The page from its first second, with what ``#engine-status`` said until ready."""
    cache = tmp_path_factory.mktemp("cold-cost-cache")  # no cost model there
    app = start_app(
        tiny_app_args(tiny.target, tiny.close),
        tmp_path_factory.mktemp("cold-app") / "app.log",
        {"SPEC_EXPLORER_CACHE": str(cache)},
    )
    SHOTS.mkdir(exist_ok=True)
    try:
        wait_ready(app, None, timeout_s=120)  # the page serves; the engine is still starting
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pg = browser.new_page(viewport={"width": 1400, "height": 1100})
            pg.goto(app.url)
            said: list[str] = []
            shot = False
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                text = pg.locator("#engine-status").inner_text()
                if not said or said[-1] != text:
                    said.append(text)
                if MEASURING in text and not shot:
                    pg.screenshot(path=str(SHOTS / "cold-1-measuring.png"), full_page=True)
                    shot = True
                if READY in text:
                    break
                pg.wait_for_timeout(200)
            yield pg, said, cache
            browser.close()
    finally:
        app.stop(timeout_s=60)


def test_the_page_measures_this_machine_before_it_says_ready(cold):
    pg, said, cache = cold
    assert READY in said[-1], said[-3:]
    measuring = [s for s in said if MEASURING in s]
    assert measuring, f"never said it was measuring: {said}"
    assert any("cell" in s for s in measuring), measuring  # the cell being measured and the share done
    assert "K policy auto table" in said[-1], said[-1]  # the adaptive default is in force
    assert list((cache / "cost").glob("*.json")), "the measured cost model was not cached"
    # the policy controls, built while nothing was in force, show the policy that now is
    playwright.expect(pg.locator("#policy input[value=auto]")).to_be_checked(timeout=15_000)
    checked = [r.get_attribute("value") for r in pg.locator("#policy input[type=radio]").all() if r.is_checked()]
    assert checked == ["auto"], checked
    # the step-time picture drew the measured cells
    assert pg.locator("#step-time .scatterlayer .trace").count() >= 3


def test_the_first_request_after_ready_shows_accepted_drafts(cold):
    pg, *_ = cold
    pg.locator("#prompt textarea").fill("def fibonacci(n):")
    pg.locator("#run").click()
    with showing(pg, "#request-card"):
        pg.wait_for_selector("#request-card:has-text('draft_acceptance_rate')", timeout=60_000)
    assert pg.locator("#token-view .tv-text .k-accepted").count() > 0, pg.locator("#token-view").inner_text()[:500]
    pg.screenshot(path=str(SHOTS / "cold-2-first-request.png"), full_page=True)


def test_raising_the_load_lowers_the_k_in_force(cold):
    pg, *_ = cold
    pg.locator("#run").click()  # a request of its own: the picture's "now" covers the last 5 s only
    with showing(pg, "#step-time"):
        pg.wait_for_function(f"() => ({NOW_JS})() !== null", timeout=30_000)
    batch, k_alone = pg.evaluate(NOW_JS)
    assert k_alone > 0, (batch, k_alone)  # the first request ran with drafts
    drag_slider(pg, 24)
    try:
        with showing(pg, "#step-time"):
            pg.wait_for_function(
                f"() => {{ const now = ({NOW_JS})(); return now && now[0] >= 16 && now[1] < {k_alone}; }}",
                timeout=120_000,
            )
        pg.screenshot(path=str(SHOTS / "cold-3-under-load.png"), full_page=True)
    finally:
        drag_slider(pg, 0)
