"""Open built pages of the documentation site in headless Chromium (Playwright, Debian's chromium)
and check that each renders (a title and body text), that its images load, that its internal links
resolve (the target file exists and its #anchor is an id there) and that the browser logs no errors.

    .venv/bin/python scripts/check_docs_site.py [docs/_build/html] [--pages index.html dropin.html]

Exit 0 and one line per page when all holds; exit 1 with one line per problem otherwise.
"""

import argparse
import os
import shutil
import sys
import time
import urllib.parse

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """Debian's chromium (Playwright's own browsers cannot be downloaded here)."""
    for name in CHROMIUM:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("check_docs_site: no chromium found: apt-get install -y chromium (scripts/setup.sh does)")


def check_page(page, site: str, name: str) -> list[str]:
    problems, console = [], []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console.append(str(e)))
    page.goto("file://" + os.path.join(site, name))
    page.wait_for_load_state("load")
    if not page.title().strip():
        problems.append(f"{name}: no title")
    if len(page.inner_text("main") if page.query_selector("main") else page.inner_text("body")) < 200:
        problems.append(f"{name}: almost no text rendered")
    for img in page.query_selector_all("img"):
        src = img.get_attribute("src")
        if not img.evaluate("i => i.complete && i.naturalWidth > 0"):
            problems.append(f"{name}: image does not load: {src}")
    for a in page.query_selector_all("a[href]"):
        href = a.get_attribute("href")
        if href.startswith(("http:", "https:", "mailto:", "javascript:")):
            continue
        target, _, anchor = href.partition("#")
        path = (
            os.path.normpath(os.path.join(site, os.path.dirname(name), urllib.parse.unquote(target)))
            if target
            else None
        )
        if path and not os.path.exists(path):
            problems.append(f"{name}: broken link {href}")
        elif anchor and (path is None or path.endswith(".html")):
            doc = open(path or os.path.join(site, name), encoding="utf-8").read()
            if f'id="{anchor}"' not in doc:
                problems.append(f"{name}: link {href}: no #{anchor} in its target")
    benign = ("favicon", "Got invalid theme mode")  # no favicon; the theme resets an unset colour mode to auto
    problems += [f"{name}: browser error: {c}" for c in console if not c.startswith(benign) and "favicon" not in c]
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("site", nargs="?", default="docs/_build/html")
    ap.add_argument("--pages", nargs="+", default=["index.html", "dropin.html"])
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    site = os.path.abspath(args.site)
    problems = []
    t0 = time.perf_counter()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True, args=["--no-sandbox"])
        for name in args.pages:
            page = browser.new_page()
            found = check_page(page, site, name)
            problems += found
            n_img, n_links = len(page.query_selector_all("img")), len(page.query_selector_all("a[href]"))
            print(f"check_docs_site: {name}: {n_img} images, {n_links} links, {len(found)} problems")
            page.close()
        browser.close()
    for line in problems:
        print("check_docs_site: " + line, file=sys.stderr)
    print(f"check_docs_site: {len(args.pages)} pages in {time.perf_counter() - t0:.1f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
