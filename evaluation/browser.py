"""Open an HTML page in headless Chromium (playwright as the driver): collect the
console errors and take a full-page screenshot."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..common.errors import UsageError

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@dataclass
class PageCheck:
    title: str
    console_errors: list[str] = field(default_factory=list)
    found: dict[str, int] = field(default_factory=dict)  # CSS selector → matching elements
    broken_images: int = 0


def chromium_path() -> str | None:
    """A system Chromium (Debian's `chromium`), else None: playwright's own."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def check_page(
    html: str | Path,
    selectors: list[str],
    screenshot: str | Path | None = None,
    wait_until: str = "load",
) -> PageCheck:
    """``html``: a file, or an http(s) URL (a live page such as Prometheus' graph)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UsageError(
            "a screenshot needs playwright (pip install playwright) and a Chromium "
            "(apt-get install chromium, or `playwright install chromium`)"
        ) from None
    live = str(html).startswith(("http://", "https://"))
    url = str(html) if live else Path(html).resolve().as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url, wait_until=wait_until)
            found = {sel: page.locator(sel).count() for sel in selectors}
            broken = page.evaluate(
                "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
                ".length"
            )
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
            return PageCheck(page.title(), errors, found, int(broken))
        finally:
            browser.close()
