"""Open built pages of the documentation site in headless Chromium (Playwright, Debian's chromium)
and check that each renders (a title and body text), that its images load, that its internal links
resolve (the target file exists and its #anchor is an id there), that the browser logs no errors,
and its layout at 1600 px: a content column of at least 900 px, 120-column code without scrolling,
a copy button on every code block that leaves "$ " prompts out, figures as wide as the column, one
search box.

    .venv/bin/python scripts/check_docs_site.py [docs/_build/html] [--pages index.html dropin.html]

(every page the site has but Sphinx's generated indexes when ``--pages`` is not given).

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
    raise SystemExit("check_docs_site: no chromium found: apt-get install -y chromium (bash scripts/setup.sh ci does)")


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


VIEWPORT = {"width": 1600, "height": 1000}  # a laptop's full-screen window
GENERATED = ("genindex.html", "search.html", "py-modindex.html")  # Sphinx's own index pages
MIN_CONTENT = 900  # px: the article column (the theme's default capped it at about 720 px)
CODE_COLUMNS = 120  # the code's line length (ruff): such lines fit without scrolling
# What a copy button puts on the clipboard (clipboard.js copies a selected textarea's text), recorded
COPIED = """window.__copied = [];
const execCommand = document.execCommand.bind(document);
document.execCommand = (cmd, ...args) => {
  if (cmd !== 'copy') return execCommand(cmd, ...args);
  const e = document.activeElement;
  window.__copied.push(e && 'value' in e ? e.value : String(window.getSelection()));
  return true;
};"""
LAYOUT = """() => {
  const art = document.querySelector('article.bd-article') || document.querySelector('main');
  const lines = p => p.innerText.split(String.fromCharCode(10));
  const visible = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  return {
    content: art.getBoundingClientRect().width,
    blocks: document.querySelectorAll('div.highlight').length,
    buttons: [...document.querySelectorAll('button.copybtn')].map(b => { b.click(); return window.__copied.pop(); }),
    scrolled: [...art.querySelectorAll('div.highlight pre')].filter(p => p.scrollWidth > p.clientWidth + 1)
      .map(p => Math.max(...lines(p).map(l => l.length))),
    images: [...art.querySelectorAll('img')].map(i => [i.src, i.getBoundingClientRect().width, i.naturalWidth]),
    search: [...document.querySelectorAll('input[type=search], .search-button-field, form.bd-search')]
      .filter(visible).length,
  };
}"""


def check_layout(page, name: str) -> list[str]:
    """At ``VIEWPORT``: a wide content column, code lines of ``CODE_COLUMNS`` without scrolling, a copy
    button on every code block whose copied text has no "$ " prompt, figures as wide as the column
    (those at least 600 px wide), one search box."""
    got = page.evaluate(LAYOUT)
    out = []
    if got["content"] < MIN_CONTENT:
        out.append(f"{name}: the content column is {got['content']:.0f} px wide at {VIEWPORT['width']} px")
    out += [f"{name}: a code block of {n}-character lines scrolls" for n in got["scrolled"] if n <= CODE_COLUMNS]
    if len(got["buttons"]) < got["blocks"]:
        out.append(f"{name}: {got['blocks'] - len(got['buttons'])} code blocks without a copy button")
    for text in got["buttons"]:
        if any(line.startswith(("$ ", ">>> ")) for line in text.splitlines()):
            out.append(f"{name}: a copy button copies its prompt: {text.splitlines()[0][:60]!r}")
    for src, width, natural in got["images"]:
        if natural >= 600 and width < 0.9 * got["content"]:
            out.append(f"{name}: figure {src} shown {width:.0f} px wide in a {got['content']:.0f} px column")
    if got["search"] != 1:
        out.append(f"{name}: {got['search']} search boxes")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("site", nargs="?", default="docs/_build/html")
    ap.add_argument("--pages", nargs="+", help="default: every page Sphinx built but its generated indexes")
    args = ap.parse_args(argv)
    if not args.pages:
        args.pages = sorted(n for n in os.listdir(args.site) if n.endswith(".html") and n not in GENERATED)
    from playwright.sync_api import sync_playwright

    site = os.path.abspath(args.site)
    problems = []
    t0 = time.perf_counter()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True, args=["--no-sandbox"])
        for name in args.pages:
            page = browser.new_page(viewport=VIEWPORT)
            page.add_init_script(COPIED)
            found = check_page(page, site, name) + check_layout(page, name)
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
