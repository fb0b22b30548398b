"""Screenshot a study's dashboard page with headless Chromium (Playwright driving the system's chromium).

python bench/dashboard_screenshot.py --url http://127.0.0.1:8000 --study 1 --out page.png
"""

from __future__ import annotations

import argparse
import shutil

from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--enable-unsafe-swiftshader",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--study", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--select", type=int, help="select this trial before the screenshot")
    args = parser.parse_args()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{args.url}/studies/{args.study}")
        page.wait_for_function("document.getElementById('pareto-plot')?.data?.length > 0", timeout=60_000)
        if args.select is not None:
            page.select_option("#status-filter", "all") if page.query_selector("#status-filter") else None
            row = page.query_selector(f"#trial-table tr[data-trial='{args.select}']")
            if row is not None:
                row.click()
        page.wait_for_timeout(1500)
        page.screenshot(path=args.out, full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
