"""The lossy lens in a real browser: a relaxed rule applied from the page, the banner every page
shows while it is in force, the relaxed tokens' colour and tooltip, the comparison with
speculation off, and the way back to vLLM's lossless rule (tiny models, the shared app)."""

from __future__ import annotations

import pytest
from gradio_client import Client

from tests.support.app_process import CHROMIUM_ARGS
from tests.support.browser import CHROMIUM, SHOTS, showing

playwright = pytest.importorskip("playwright.sync_api")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev)")

BANNER = "Lossy acceptance rule in force"


@pytest.fixture(scope="module")
def browser(app_url):
    SHOTS.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
    # the shared app goes back to vLLM's rule whatever happened above
    Client(app_url, verbose=False).predict("lossless", 10, 0.6, 0.09, 0.3, False, api_name="/set_acceptance")


def open_page(browser, url):
    pg = browser.new_page(viewport={"width": 1400, "height": 1100})
    pg.goto(url)
    pg.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=120_000)
    return pg


def set_number(pg, elem_id: str, value: str) -> None:
    box = pg.locator(f"#{elem_id} input")
    box.fill(value)
    box.press("Tab")


def test_a_relaxed_rule_from_the_page_colours_its_tokens_and_flags_every_page(browser, app_url):
    pg = open_page(browser, app_url)
    other = open_page(browser, app_url)  # another visitor's page
    assert BANNER not in pg.locator("#lossy-banner").inner_text()
    pg.get_by_text("Acceptance rule: trade the lossless guarantee").click()
    pg.locator("#acceptance-rule input[value=relaxed]").check()
    set_number(pg, "acc-top-k", "20")
    set_number(pg, "acc-delta", "0.5")
    pg.locator("#apply-acceptance").click()
    with showing(pg, "#acceptance-said"):
        pg.wait_for_selector("#acceptance-said:has-text('relaxed (top_k=20, delta=0.5)')", timeout=30_000)
    for page in (pg, other):  # engine-wide: the banner is on every page, at its timer's next tick
        with showing(page, "#lossy-banner"):
            page.wait_for_selector(f"#lossy-banner:has-text('{BANNER}')", timeout=15_000)
    pg.locator("#prompt textarea").fill("Once upon a time, in a small village,")
    pg.locator("#run").click()
    with showing(pg, "#request-card"):
        pg.wait_for_selector("#request-card:has-text('relaxed-only')", timeout=60_000)
    relaxed = pg.locator("#token-view .tv-text .k-relaxed")
    assert relaxed.count() > 0, pg.locator("#token-view").inner_text()[:500]
    assert pg.locator("#token-view .tv-legend .k-relaxed").count() == 1
    tip = relaxed.first.get_attribute("data-tip")
    assert "the target's own top choice: id" in tip and "this draft had p=" in tip, tip
    relaxed.first.scroll_into_view_if_needed()
    relaxed.first.hover()
    pg.screenshot(path=str(SHOTS / "lossy-1-relaxed-tokens.png"), full_page=True)
    # the comparison: the same prompt with speculation off parts from this text at the first relaxed token
    pg.get_by_role("button", name="Compare with speculation off").click()
    pg.locator("#lossless").click()
    with showing(pg, "#verdict"):
        pg.wait_for_selector("#verdict:has-text('agree once the texts are aligned')", timeout=180_000)
    verdict = pg.locator("#verdict").inner_text()
    assert "exactly at the first relaxed token" in verdict and "without them" in verdict, verdict
    pg.screenshot(path=str(SHOTS / "lossy-2-compare.png"), full_page=True)
    # and back: vLLM's own rule, no banner anywhere
    pg.locator("#acceptance-rule input[value=lossless]").check()
    pg.locator("#apply-acceptance").click()
    with showing(pg, "#acceptance-said"):
        pg.wait_for_selector("#acceptance-said:has-text('lossless rule')", timeout=30_000)
    for page in (pg, other):
        page.wait_for_function(
            f"() => !document.querySelector('#lossy-banner').innerText.includes('{BANNER}')", timeout=15_000
        )
    pg.close()
    other.close()


def test_a_bad_parameter_is_refused_and_the_rule_stays(app_url):
    client = Client(app_url, verbose=False)
    said = client.predict("relaxed", 0, 0.6, 0.09, 0.3, False, api_name="/set_acceptance")
    assert said.startswith("✕") and "top_k" in said, said
    assert BANNER not in client.predict(api_name="/acceptance_banner")
