"""The web page's screenshots in docs/screenshots/, taken in Debian's Chromium with Playwright
against a running `tandem serve` (the README's main command, the default pair):

    tandem serve --port 8092 &
    python experiments/page_screenshots.py http://127.0.0.1:8092/ docs/screenshots

A code edit at temperature 0, then "Compare without speculation"; a wide and a phone-sized
window. Prints the answer's statistics and the comparison.
"""

from __future__ import annotations

import sys
import time

from playwright.sync_api import sync_playwright

PROMPT = """Rename the variable `x` to `total` and add type hints:

```python
def add_all(items):
    x = 0
    for item in items:
        x += item
    return x
```"""


def main(url: str, out: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_context(viewport={"width": 1360, "height": 860}).new_page()
        page.goto(url)
        page.wait_for_function(
            "document.querySelector('#model').textContent.includes('speculation')",
            timeout=600_000)
        page.fill("#settings [name=temperature]", "0")
        page.fill("#settings [name=max_tokens]", "200")
        page.fill("#input", PROMPT)
        page.keyboard.press("Enter")
        page.wait_for_selector(".msg.assistant .stats", timeout=600_000)
        page.click(".compare-button")
        page.wait_for_selector(".compare .same", timeout=600_000)
        time.sleep(2.5)  # the live panel's next poll
        page.screenshot(path=f"{out}/page.png")
        print(page.inner_text(".msg.assistant .stats"))
        print(page.inner_text(".compare"))
        page.set_viewport_size({"width": 390, "height": 844})
        time.sleep(0.5)
        page.screenshot(path=f"{out}/page-narrow.png")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
