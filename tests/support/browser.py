"""Browser helpers for the tests that drive Debian's chromium with Playwright.

``SHOTS``: where screenshots go (look at them after a run); ``CHROMIUM``: the browser's path or
None; ``drag_slider(page, value)`` drags the load slider's thumb with the mouse;
``showing(page, selector)`` makes a Playwright wait that times out say what ``selector`` showed;
``edit_cell(page, selector, text)`` types ``text`` into a table cell as a person does;
``start_speedup_measurement(page, repeats, tokens)`` starts the presenter's speed measurement.
"""

from __future__ import annotations

import contextlib
import shutil

from engine_adapter.package_data import PROJECT_ROOT

SHOTS = PROJECT_ROOT / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def drag_slider(page, value: int, maximum: int = 64) -> None:
    """Drag the load slider's thumb with the mouse to ``value``."""
    track = page.locator("#load input[type=range]")
    track.scroll_into_view_if_needed()
    box = track.bounding_box()
    x0 = box["x"] + box["width"] * float(track.input_value()) / maximum
    y = box["y"] + box["height"] / 2
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * value / maximum, y, steps=8)
    page.mouse.up()
    # the thumb's width makes a pixel drag land within a step or two: finish with the keys
    for _ in range(8):
        now = int(float(track.input_value()))
        if now == value:
            break
        track.press("ArrowRight" if now < value else "ArrowLeft")
    assert int(float(track.input_value())) == value


@contextlib.contextmanager
def showing(page, selector: str):
    """A wait that times out inside says what ``selector`` showed then (a bare
    playwright timeout names only the condition)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # a dev dependency (scripts/setup.sh --dev)

    try:
        yield
    except PlaywrightTimeout as e:
        shown = page.locator(selector).first.inner_text() if page.locator(selector).count() else "(absent)"
        raise AssertionError(f"{e.message.splitlines()[0]}; {selector} showed: {shown!r}") from e


def edit_cell(page, selector: str, text: str, tries: int = 3) -> None:
    """Double-click the table cell ``selector``, replace its text with ``text``, press Enter, and
    see the cell show it. On a loaded page a re-render of the table can swallow the keys (the cell
    keeps its old text, as a person would see): then edit again, up to ``tries`` times in all.
    A cell's text is its first line (Gradio's cell menu button "⋮" follows it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    cell = page.locator(selector)
    shown = ""
    for _ in range(tries):
        cell.scroll_into_view_if_needed()
        cell.dblclick()
        page.keyboard.press("Control+A")
        page.keyboard.type(text)
        page.keyboard.press("Enter")
        try:
            page.wait_for_function(
                "([sel, t]) => document.querySelector(sel)?.innerText.trim().split('\\n')[0].trim() === t",
                arg=[selector, text],
                timeout=5_000,
            )
            return
        except PlaywrightTimeout:
            shown = cell.inner_text()
    raise AssertionError(f"cell {selector} shows {shown!r} after {tries} edits to {text!r}")


def start_speedup_measurement(page, repeats: int = 1, tokens: int = 16) -> None:
    """Set the speed measurement's repeats and tokens per request, press Measure, see it start."""
    for selector, value in (("#probe-repeats", repeats), ("#probe-tokens", tokens)):
        page.locator(f"{selector} input[type=number]").fill(str(value))
        page.locator(f"{selector} input[type=number]").press("Enter")
    page.locator("#probe").click()
    with showing(page, "#probe-said"):
        page.wait_for_selector("#probe-said:has-text('Started')", timeout=30_000)
