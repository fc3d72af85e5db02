"""A real browser (Debian's chromium, driven by Playwright) against the launched app.

Screenshots go to ``screenshots/`` (look at them after a run).
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from explorer.panels.run import STOP_API
from tests.support.app_process import CHROMIUM_ARGS
from tests.support.browser import CHROMIUM, SHOTS, drag_slider, edit_cell, showing
from tests.support.processes import paused, vllm_compute

playwright = pytest.importorskip("playwright.sync_api")

ABORT_REACHES_VLLM_S = 1.0  # the app's stopped view on the page to vLLM's API server's abort of the closed stream

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh --dev)")


@pytest.fixture(scope="module")
def page(app_url):
    SHOTS.mkdir(exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
        )
        pg = browser.new_page(viewport={"width": 1400, "height": 1100})
        dialogs: list[str] = []
        pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        pg.dialogs = dialogs
        pg.goto(app_url)
        pg.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=120_000)
        # the cost model is profiled at start-up (no cached one on a fresh machine), with up to
        # 16 requests of its own: the load tests below count the engine's requests
        with showing(pg, "#engine-status"):
            pg.wait_for_function(
                "() => !document.querySelector('#engine-status').innerText.includes('Measuring the cost model')",
                timeout=240_000,
            )
        yield pg
        browser.close()


def readout(page) -> str:
    return page.locator("#load-readout").inner_text()


def running_in_engine(page) -> int:
    m = re.search(r"Requests running in the engine: (\d+)", readout(page))
    return int(m.group(1)) if m else -1


def test_code_preset_streams_coloured_tokens_with_ghosts(page):
    page.locator("#prompt textarea").fill("def add(a, b):")
    page.locator("#run").click()
    page.wait_for_selector("#token-view .tv-text .k-prefill", timeout=60_000)
    page.wait_for_selector("#request-card:has-text('draft_acceptance_rate')", timeout=60_000)
    kinds = {
        k
        for k in ("accepted", "recovered", "bonus", "prefill")
        if page.locator(f"#token-view .tv-text .k-{k}").count() > 0
    }
    assert len(kinds) >= 2, kinds
    assert page.locator("#token-view .tv-text .k-rejected").count() > 0, "no rejected-draft ghosts"
    # each step's engine time (Step.t, a plain number) for scripts/ui_latency.py
    times = page.eval_on_selector_all("#token-view .tv-step", "els => els.map(e => e.dataset.t)")
    assert times and all(re.fullmatch(r"\d+\.\d{6}", t) for t in times), times
    page.locator("#token-view .tv-text .k-prefill").first.hover()
    page.screenshot(path=str(SHOTS / "1-tokens.png"), full_page=True)


def test_slider_adds_and_removes_real_load(page):
    drag_slider(page, 16)
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('16 requested')", timeout=30_000
    )
    with showing(page, "#load-readout"):
        page.wait_for_function(
            "() => /running in the engine: (\\d+)/.exec(document.querySelector('#load-readout').innerText)"
            " && +/running in the engine: (\\d+)/.exec(document.querySelector('#load-readout').innerText)[1] >= 8",
            timeout=60_000,
        )
    # the charts refresh once a second; on a loaded 2-core machine a refresh can queue for a while
    with showing(page, "#load-readout"):
        page.wait_for_function(
            "() => document.querySelector('#live-charts').innerText.includes('load → 16')", timeout=30_000
        )
    live = page.locator("#live-charts")
    assert live.locator(".scatterlayer .trace").count() >= 4
    page.screenshot(path=str(SHOTS / "2-under-load.png"), full_page=True)

    # the typed input works too
    number = page.locator("#load input[type=number]")
    number.fill("4")
    number.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('4 requested')", timeout=30_000
    )

    drag_slider(page, 0)
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('No background load')", timeout=30_000
    )
    with showing(page, "#load-readout"):
        page.wait_for_function(
            "() => +/running in the engine: (\\d+)/.exec(document.querySelector('#load-readout').innerText)[1] <= 1",
            timeout=30_000,
        )
    page.screenshot(path=str(SHOTS / "3-load-stopped.png"), full_page=True)


def test_html_and_script_in_the_prompt_render_as_text(page):
    evil = "<img src=x onerror=alert(1)><script>alert(2)</script> ${alert(3)}"
    page.locator("#prompt textarea").fill(evil)
    page.locator("#run").click()
    page.wait_for_function(
        "() => (document.querySelector('#token-view .tv-prompt') || {}).innerText?.includes('onerror')", timeout=60_000
    )
    page.wait_for_selector("#token-view .tv-footer", timeout=60_000)
    page.screenshot(path=str(SHOTS / "4-html-prompt.png"), full_page=False)
    assert page.dialogs == [], f"a script ran: {page.dialogs}"
    assert page.locator("#token-view img").count() == 0
    assert page.locator("#token-view script").count() == 0
    # the prompt is shown, as text
    assert "<img src=x onerror=alert(1)>" in page.locator("#token-view .tv-prompt").inner_text()
    assert "${alert(3)}" in page.locator("#token-view .tv-prompt").inner_text()


def test_the_status_line_says_when_the_app_stops_answering(page):
    """The status line's timer runs in the page (assets/top_lines.js fetches /explorer/top_lines): while the
    app does not answer, the line keeps its last text under a warning; when it answers, the warning goes."""
    status = page.locator("#engine-status")
    page.route("**/explorer/top_lines", lambda route: route.fulfill(status=503, body="down"))
    try:
        page.wait_for_function(
            "() => document.querySelector('#engine-status').innerText.includes('not answering')", timeout=10_000
        )
        text = status.inner_text()
        assert "Engine ready" in text, text  # the last line the app sent, kept under the warning
        assert text.count("not answering") == 1, text  # said once, not once per tick
        page.wait_for_timeout(2500)
        assert status.inner_text().count("not answering") == 1
    finally:
        page.unroute("**/explorer/top_lines")
    page.wait_for_function(
        "() => !document.querySelector('#engine-status').innerText.includes('not answering')", timeout=10_000
    )
    assert "Engine ready" in status.inner_text()


def test_k_policies_switch_live_under_load(page):
    """Edit the K table in the browser, apply it, then the auction: no restart, the panel follows."""
    number = page.locator("#load input[type=number]")
    number.fill("6")
    number.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('6 requested')", timeout=30_000
    )
    # a bad table first: vLLM's rule, said plainly
    page.locator("#policy input[value=table]").check()
    cell = '#k-table [data-testid="cell-0-0"]'
    edit_cell(page, cell, "2")
    # the live check answers the edit: the server has the edited cell before Apply is clicked
    with showing(page, "#table-check"):
        page.wait_for_selector("#table-check:has-text('first row must start at batch size 1')", timeout=30_000)
    page.locator("#apply-policy").click()
    with showing(page, "#policy-said"):
        page.wait_for_selector("#policy-said:has-text('first row must start at batch size 1')", timeout=30_000)
    edit_cell(page, cell, "1")
    with showing(page, "#table-check"):
        page.wait_for_selector(
            "#table-check:has-text('Valid table [[1, 2, 3], [3, 4, 1], [5, 64, 0]]')", timeout=30_000
        )
    page.locator("#apply-policy").click()
    with showing(page, "#policy-said"):  # a stale cell would say the row-1 error again
        page.wait_for_selector("#policy-said:has-text('Sent to the engine: K table')", timeout=60_000)
    with showing(page, "#policy-status"):  # this table, not the fixed K that was in force before
        page.wait_for_selector(
            "#policy-status:has-text('K table [[1, 2, 3], [3, 4, 1], [5, 64, 0]] (applied at engine step')",
            timeout=60_000,
        )
    with showing(page, "#table-in-force"):
        page.wait_for_selector("#table-in-force:has-text('in force')", timeout=30_000)
    assert "Engine ready" in page.locator("#engine-status").inner_text()  # no restart
    page.locator("#policy input[value=auction]").check()
    page.locator("#apply-policy").click()
    with showing(page, "#policy-said"):
        page.wait_for_selector("#policy-said:has-text('Sent to the engine: slot auction')", timeout=60_000)
    with showing(page, "#policy-status"):
        page.wait_for_selector("#policy-status:has-text('slot auction (applied at engine step')", timeout=60_000)
    with showing(page, "#auction-grid"):
        page.wait_for_selector("#auction-grid:has-text('slots admitted')", timeout=60_000)
    with showing(page, "#step-time"):
        page.wait_for_selector("#step-time:has-text('knee')", timeout=30_000)
    page.locator("#policy-status").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "5-k-policies.png"), full_page=True)
    # the policy is engine-wide: a reloaded page shows the one in force, not its default
    page.reload()
    page.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=60_000)
    playwright.expect(page.locator("#policy input[value=auction]")).to_be_checked(timeout=30_000)
    number.fill("6")  # the reload ended this page's session and its load
    number.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('6 requested')", timeout=30_000
    )
    page.locator("#policy input[value=fixed]").check()
    page.locator("#apply-policy").click()
    page.wait_for_selector("#policy-status:has-text('fixed K=3 (applied')", timeout=60_000)
    number.fill("0")
    number.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('No background load')", timeout=30_000
    )


def _engine_url(page) -> str:
    """vLLM's address (the status line on loopback names it)."""
    url = re.search(r"(http://127\.0\.0\.1:\d+)", page.locator("#engine-status").inner_text())
    assert url, "the status line on loopback names the engine's address"
    return url.group(1)


def _metrics_at(url: str) -> list[str]:
    """vLLM's own /metrics, of the engine at ``url``."""
    return httpx.get(f"{url}/metrics", timeout=5).text.splitlines()


def _engine_metrics(page) -> list[str]:
    """vLLM's own /metrics, of the engine the page's status line names."""
    return _metrics_at(_engine_url(page))


def _metric(lines: list[str], name: str, having: str = "") -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name) and having in line)


def _engine_counts(page) -> tuple[float, float]:
    """vLLM's counters: tokens generated, requests running."""
    lines = _engine_metrics(page)
    return _metric(lines, "vllm:generation_tokens_total"), _metric(lines, "vllm:num_requests_running")


def _long_requests_finished(page) -> float:
    """Requests vLLM finished with more than 500 tokens (its generation-tokens histogram; an aborted
    request is not counted in it)."""
    lines = _engine_metrics(page)
    everyone = _metric(lines, "vllm:request_generation_tokens_count")
    return everyone - _metric(lines, "vllm:request_generation_tokens_bucket", 'le="500.0"')


def _running_samples(page, seconds: float) -> list[float]:
    deadline, out = time.monotonic() + seconds, []
    while time.monotonic() < deadline:
        out.append(_engine_counts(page)[1])
        time.sleep(0.1)
    return out


def _wait_for(done, seconds: float, what: str, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, f"waited {seconds:.0f} s for {what}"
        time.sleep(poll_s)


def _steps_settled(page, seconds: float) -> bool:
    """Whether the token view took no new step for ``seconds``."""
    steps = page.locator("#token-view .tv-step").count()
    time.sleep(seconds)
    return page.locator("#token-view .tv-step").count() == steps


def _long_runs_under_load(page, load: int) -> None:
    """A background load of ``load``, running in vLLM, and runs of 1000 tokens."""
    number = page.locator("#load input[type=number]")
    number.fill(str(load))
    number.press("Enter")
    page.locator("#max-tokens input[type=number]").fill("1000")
    page.locator("#max-tokens input[type=number]").press("Enter")
    _wait_for(lambda: _engine_counts(page)[1] >= load, 60, f"the background load of {load} to start in vLLM")


def _short_runs_without_load(page) -> None:
    """Back to the page's defaults: runs of 128 tokens, no background load (asked for)."""
    page.locator("#max-tokens input[type=number]").fill("128")
    page.locator("#max-tokens input[type=number]").press("Enter")
    number = page.locator("#load input[type=number]")
    number.fill("0")
    number.press("Enter")


REACTS_JS = """() => {
  window.__reacts = [];
  const gd = document.querySelector('#live-charts .js-plotly-plot');
  const streaming = () => !!document.querySelector('#token-view .tv-cursor');
  gd.on('plotly_react', () => window.__reacts.push([performance.now(), streaming()]));
}"""


def test_the_live_chart_redraws_while_the_pages_own_request_streams(page):
    """The live chart draws itself (assets/live_chart.js, every 2 s): under a background load, while
    the page's own long request streams, it keeps redrawing, with the request's own tokens/s."""
    load = 8
    _long_runs_under_load(page, load)
    page.evaluate(REACTS_JS)
    page.locator("#prompt textarea").fill("Write a very long essay about the sea.")
    page.locator("#run").click()
    page.wait_for_function(  # this request's view (not the last one's), streaming
        "() => document.querySelector('#token-view .tv-cursor')"
        " && document.querySelector('#token-view .tv-prompt').innerText.includes('essay about the sea')",
        timeout=30_000,
    )
    started = time.monotonic()
    # three redraws while it streams, or the request's end, or 40 s (a busy runner's page is slow)
    while time.monotonic() - started < 40 and page.locator("#token-view .tv-cursor").count():
        if page.evaluate("() => window.__reacts.filter(([, streaming]) => streaming).length") >= 3:
            break
        time.sleep(0.25)
    streamed_s = time.monotonic() - started
    reacts = page.evaluate("() => window.__reacts")
    legend = page.locator("#live-charts").inner_text()
    page.locator("#live-charts").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "4b-chart-while-streaming.png"), full_page=False)
    if page.locator("#token-view .tv-cursor").count():
        page.locator("#stop").click()
    _short_runs_without_load(page)
    while_streaming = [t for t, streaming in reacts if streaming]
    log = page.evaluate("() => window.__specExplorerLiveChart.log")
    # the tiny pair streams its 1000 tokens in 3-8 s at hundreds of tokens a second, and on a busy runner
    # the token view's redraws take the page's main thread for seconds (one CI run: a draw of 4.9 s, its
    # timer 3 s late, one redraw in 8.3 s): the chart keeps drawing, not paused while the page's own
    # request streams; how often it draws is scripts/ui_latency.py's to measure, on the packaged pair
    assert while_streaming, f"no redraw in {streamed_s:.1f} s of streaming: {log}"
    assert "foreground tokens/s" in legend, "the page's own request is not on the chart"
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('No background load')", timeout=30_000
    )
    _wait_for(lambda: _engine_counts(page)[1] == 0, 30, "vLLM to end the stopped request and the load")


def _stop_fn(page) -> int:
    """The Gradio fn id of the app's /stop, from the page's config."""
    config = httpx.get(page.url.split("?")[0].rstrip("/") + "/config", timeout=10).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == STOP_API)


def test_enter_then_stop_ends_the_run_in_vllm(page, shared_app):
    """A run started from the prompt box (its submit event: Shift+Enter in a multi-line box; not the
    Run button) is stopped by Stop, in vLLM too: vLLM runs it no more and never finishes its 1000
    tokens. A background load of LOAD keeps the engine busy: vLLM runs LOAD + 1 requests while the
    run is in it, at most LOAD after Stop.

    The tiny pair streams its 1000 tokens in 3-8 s, and a busy runner's page lags the engine by
    seconds: so vLLM's engine core and worker are held (SIGSTOP) from the moment vLLM runs the
    request until the page shows the app's stopped view (the app closed the stream to vLLM's API
    server, which runs on) and ABORT_REACHES_VLLM_S more. The engine then goes on, and the request it
    was running is aborted before it could finish."""
    load = 8
    _long_runs_under_load(page, load)
    long_before = _long_requests_finished(page)
    prompt = page.locator("#prompt textarea")
    prompt.fill("Write a very long essay about the sea.")  # runs to its 1000 tokens on the tiny pair
    prompt.press("Shift+Enter")
    url = _engine_url(page)  # asked of the page once: a busy page answers slowly
    stop_fn = _stop_fn(page)

    def stop_call(response) -> bool:  # the page's own Stop call: the door bounds it as a Stop, not a poll
        body = response.request.post_data or "{}"
        return response.url.endswith("/gradio_api/run/predict") and json.loads(body).get("fn_index") == stop_fn

    def running() -> float:
        return _metric(_metrics_at(url), "vllm:num_requests_running")

    _wait_for(lambda: running() > load, 30, "vLLM to run the prompt box's request", poll_s=0.05)
    with paused(vllm_compute(shared_app.pid)):
        # vLLM ran at least one step of it: the page shows it (tokens on the page say it runs)
        page.wait_for_function("() => document.querySelectorAll('#token-view .tv-step').length >= 1", timeout=30_000)
        with page.expect_response(stop_call, timeout=30_000):  # request_limits.StopCall knows it
            page.locator("#stop").click()
        # the run's last update, after every one it sent before: what streamed, stopped
        playwright.expect(page.locator("#token-view .tv-footer")).to_contain_text("Stopped:", timeout=30_000)
        time.sleep(ABORT_REACHES_VLLM_S)
    # vLLM must come down to the load's LOAD requests (which come and go: fewer running at one moment
    # says nothing, so 3 s in a row), without the run finishing its 1000 tokens (the load's are 128 at most)
    deadline = time.monotonic() + 20
    while max(samples := _running_samples(page, 3.0)) > load:
        assert time.monotonic() < deadline, f"vLLM still runs the stopped request: {samples}"
    assert _long_requests_finished(page) == long_before, "the stopped run went on to its 1000 tokens in vLLM"
    _wait_for(lambda: _steps_settled(page, 1.0), 20, "the page to take no more tokens after Stop")
    # the page says it stopped, and where; Gradio saw a run that ended normally (no error badge)
    playwright.expect(page.locator("#token-view .tv-prompt")).to_contain_text("essay about the sea")
    playwright.expect(page.locator("#token-view .tv-footer")).to_contain_text("Stopped:")
    assert page.locator("#token-view .tv-cursor").count() == 0, "a stopped request keeps no cursor"
    playwright.expect(page.locator("#request-card")).to_contain_text("Stopped after")
    assert "Error" not in page.locator("#token-view").locator("xpath=..").inner_text()
    page.locator("#token-view").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "5-enter-then-stop.png"), full_page=False)
    _short_runs_without_load(page)
    page.wait_for_function(
        "() => document.querySelector('#load-readout').innerText.includes('No background load')", timeout=30_000
    )


def test_changing_the_method_restarts_the_engine_visibly(page):
    page.get_by_label("ngram (prompt lookup)").check()
    page.locator("#apply").click()
    page.wait_for_selector("#engine-status:has-text('Engine starting')", timeout=30_000)
    page.screenshot(path=str(SHOTS / "6-restarting.png"))
    page.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=180_000)
    assert "method ngram" in page.locator("#engine-status").inner_text()
    # the page still works after the restart
    page.locator("#prompt textarea").fill("ab ab ab ab ab ab")
    page.locator("#run").click()
    page.wait_for_function(
        "() => (document.querySelector('#token-view .tv-prompt') || {}).innerText?.includes('ab ab ab')", timeout=60_000
    )
    page.wait_for_selector("#token-view .tv-footer", timeout=60_000)
    # the shared app goes back to its defaults for the modules after this one (tests/support/fixtures.py)
    page.get_by_label("draft model").check()
    page.locator("#apply").click()  # restarts at most every 30 s: it may wait for that
    page.wait_for_selector("#engine-status:has-text('Engine starting')", timeout=60_000)
    page.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=180_000)
    assert "method draft" in page.locator("#engine-status").inner_text()
