"""Take the README's screenshot: a running explorer, mid-run, under load.

    .venv/bin/python scripts/readme_screenshot.py --url http://127.0.0.1:7860 \
        [--load 8] [--out docs/screenshot.png]

Drives Debian's chromium with Playwright: types a code prompt, starts it,
moves the background-load slider to --load, waits, and captures the page while
the foreground request is still streaming. The load is set back to 0 at the end.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--load", type=int, default=8)
    p.add_argument("--warm-s", type=float, default=40.0, help="seconds of load before the foreground run")
    p.add_argument("--out", type=Path, default=Path("docs/screenshot.png"))
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=shutil.which("chromium"),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        for _ in range(120):  # the app may still be starting its web server
            try:
                page.goto(args.url)
                break
            except Exception:
                page.wait_for_timeout(1000)
        page.wait_for_selector("#engine-status:has-text('● Engine ready')", timeout=600_000)
        number = page.locator("#load input[type=number]")
        for _ in range(10):  # until the page confirms the load is running
            number.fill(str(args.load))
            number.press("Enter")
            page.wait_for_timeout(3000)
            if f"{args.load} requested" in page.locator("#load-readout").inner_text():
                break
        page.wait_for_timeout(args.warm_s * 1000)
        page.locator("#prompt textarea").fill(
            "Write a Python function that returns the n-th Fibonacci number, with a docstring."
        )
        page.locator("#run").click()
        page.wait_for_selector("#token-view .k-accepted", timeout=300_000)
        page.wait_for_timeout(25_000)
        page.screenshot(path=str(args.out), full_page=True)
        number.fill("0")
        number.press("Enter")
        page.wait_for_timeout(2000)
        browser.close()
    print(args.out)


if __name__ == "__main__":
    main()
