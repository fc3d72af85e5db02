"""The quantisation lens in a real browser, on its own app (tiny models, fixed K=3): the presenter
measures the speedup at this load on the full pair, switches the engine to the int8 pair (a
restart; the int8 copies are made on first use) and measures again; the lens then shows plain
decoding's tokens/s against its roofline at each variant, the speculative speedup, and the naive
product of the two speedups beside the measured combination, drawn as bars."""

from __future__ import annotations

import re

import pytest

from tests.support.app_process import CHROMIUM_ARGS, AppNotReady, start_app, tiny_app_args, wait_ready
from tests.support.browser import CHROMIUM, SHOTS, showing, start_speedup_measurement

playwright = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev)")

NUMBER = r"(\d+\.\d+)"


@pytest.fixture(scope="module")
def lens_app(tiny, tmp_path_factory):
    log = tmp_path_factory.mktemp("lens") / "app.log"
    app = start_app(tiny_app_args(tiny.target, tiny.close, "--k", "3", "--policy", "fixed"), log)
    try:
        wait_ready(app, timeout_s=300)
    except AppNotReady as e:
        app.stop()
        pytest.fail(f"the app never became ready: {e}")
    yield app
    assert app.stop(), "the app did not stop on Ctrl-C"


def measure(page, settings: str) -> None:
    """The speedup at this load, measured from the page, until its table names ``settings``."""
    start_speedup_measurement(page, repeats=1, tokens=16)
    with showing(page, "#probe-table"):
        page.wait_for_function(
            "s => { const t = document.querySelector('#probe-table').innerText;"
            " return t.includes('Speedup at this load, measured') && t.includes(s); }",
            arg=settings,
            timeout=240_000,
        )


def test_the_lens_compares_the_full_pair_with_the_int8_pair(lens_app):
    SHOTS.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(lens_app.url)
        page.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=120_000)
        assert "No measurement yet" in page.locator("#lens-table").inner_text()
        measure(page, "target / close; method draft")
        with showing(page, "#lens-table"):
            page.wait_for_selector("#lens-table:has-text('full pair')", timeout=30_000)

        page.locator("#variant input[value=int8-pair]").check()
        page.locator("#apply").click()
        with showing(page, "#engine-said"):
            page.wait_for_selector("#engine-said:has-text('Restart asked for')", timeout=30_000)
        said = page.locator("#engine-said").inner_text()
        assert "int8 target and draft" in said and re.search(r"The last start took \d+ s to ready", said), said
        page.wait_for_selector("#engine-status:has-text('int8 target and draft')", timeout=300_000)
        page.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=300_000)
        measure(page, "target / close (int8-pair)")

        with showing(page, "#lens-table"):
            page.wait_for_selector("#lens-table:has-text('measured together')", timeout=30_000)
        text = page.locator("#lens-table").inner_text()
        for variant in ("full pair", "int8 target and draft"):  # plain tokens/s, its roofline and the fraction
            row = re.search(rf"{variant}[^\n]*?\s0\s+{NUMBER}\s+{NUMBER}\s+(\d+)%\s+{NUMBER}x", text)
            assert row and float(row[1]) > 0 and float(row[2]) > 0 and float(row[4]) > 0, text
        product = re.search(rf"multiplied {NUMBER}x, measured together {NUMBER}x", text)
        assert product and float(product[1]) > 0 and float(product[2]) > 0, text
        compared = re.search(
            rf"int8 target and draft\s+0\s+{NUMBER}x\s+{NUMBER}x\s+{NUMBER}x\s+{NUMBER}x\s+(\d+\.\d)%", text
        )
        assert compared and 0 < float(compared[5]) <= 100, text  # the int8 target's text against the full one
        page.wait_for_function("() => document.querySelectorAll('#lens-plot .barlayer .trace').length == 4")
        page.locator("#lens-plot").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "9-quantisation-lens.png"), full_page=True)
        browser.close()
