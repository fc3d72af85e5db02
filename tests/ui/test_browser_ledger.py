"""Who gets the discount, in a real browser on the shared app (tiny models): under a background
load the ledger lists the requests running with their task kinds and draws them, never an id;
the equal allocation switches live from the page; the presenter's measurement of the speedup at
this load runs (every page told), fills its table and exports it."""

from __future__ import annotations

import re

import pytest

from tests.support.app_process import CHROMIUM_ARGS
from tests.support.browser import CHROMIUM, SHOTS, drag_slider, showing, start_speedup_measurement

playwright = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev)")

REQUEST_ID = re.compile(r"load[a-z]*x[0-9a-f]{12}|[0-9a-f]{32}")  # a load request's id, a page's request id


@pytest.fixture(scope="module")
def page(app_url):
    SHOTS.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1100})
        pg.goto(app_url)
        pg.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=120_000)
        yield pg
        drag_slider(pg, 0)
        browser.close()


def test_the_ledger_lists_the_load_by_task_kind_and_no_id(page):
    drag_slider(page, 6)
    with showing(page, "#ledger-summary"):
        page.wait_for_function(
            "() => { const m = /(\\d+) requests running/.exec(document.querySelector('#ledger-summary').innerText);"
            " return m && +m[1] >= 4; }",
            timeout=60_000,
        )
    with showing(page, "#ledger-table"):
        page.wait_for_function(
            "() => document.querySelector('#ledger-table').innerText.includes('load: ')", timeout=30_000
        )
    table = page.locator("#ledger-table").inner_text()
    assert re.search(r"load: (code|math|qa|story|summarisation|translation)", table), table
    summary = page.locator("#ledger-summary").inner_text()
    assert "Jain's fairness index" in summary and "plain decoding's speed" in summary, summary
    page.wait_for_function("() => document.querySelectorAll('#ledger-plot .scatterlayer .trace').length >= 1")
    for part in ("#ledger-summary", "#ledger-table", "#ledger-plot", "#discount-share"):
        html = page.locator(part).inner_html()
        assert not REQUEST_ID.search(html), (part, REQUEST_ID.search(html))
    page.locator("#ledger-plot").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "7-ledger.png"), full_page=True)


def test_the_equal_allocation_switches_live(page):
    page.locator("#policy input[value=equal]").check()
    page.locator("#apply-policy").click()
    with showing(page, "#policy-said"):
        page.wait_for_selector("#policy-said:has-text('Sent to the engine: equal slots')", timeout=30_000)
    with showing(page, "#table-in-force"):
        page.wait_for_selector("#table-in-force:has-text('Equal slots')", timeout=30_000)
    with showing(page, "#auction-grid"):
        page.wait_for_function(
            "() => document.querySelector('#auction-grid').innerText.includes('slots admitted')", timeout=60_000
        )
    page.locator("#policy input[value=fixed]").check()
    page.locator("#apply-policy").click()
    page.wait_for_selector("#policy-said:has-text('Sent to the engine: fixed K=3')", timeout=30_000)


def test_the_speedup_at_this_load_is_measured_from_the_page(page):
    start_speedup_measurement(page, repeats=1, tokens=16)
    with showing(page, "#lossy-banner"):  # every page says a measurement runs
        page.wait_for_selector("#lossy-banner:has-text('A speed measurement is running')", timeout=30_000)
    with showing(page, "#probe-table"):
        page.wait_for_selector("#probe-table:has-text('Speedup at this load, measured')", timeout=240_000)
    text = page.locator("#probe-table").inner_text()
    assert re.search(r"code\s+\d+\.\d\dx", text), text
    assert "method draft, policy fixed K=3" in text and "background request" in text, text
    page.locator("#probe-table").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "8-speedup-measured.png"), full_page=True)
    assert page.locator("#probe-md").count() == 0 and page.locator("#probe-csv").count() == 0  # no empty boxes
    page.locator("#probe-csv-btn").click()
    with showing(page, "#probe-md"):  # the boxes appear with the export
        page.wait_for_function(
            "() => document.querySelector('#probe-md')?.innerText.includes('| code |')", timeout=30_000
        )
    assert page.locator("#probe-csv a").count() >= 1
    # the policy in force is the one before the measurement
    with showing(page, "#policy-status"):
        page.wait_for_selector("#policy-status:has-text('fixed K=3')", timeout=30_000)
