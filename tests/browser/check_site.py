"""Open every page of the built site in headless Chromium and check what a reader would see.

Run by `nox -s site` (not collected by pytest: the file name does not start with `test_`):

    python tests/browser/check_site.py [--site site] [--screenshots /tmp/attention-screenshots]

It serves `site/` on 127.0.0.1 (a free port) and drives Debian's `/usr/bin/chromium` through
playwright (never `playwright install`: no browser download). For every HTML page it checks:

- no console error and no uncaught exception;
- no request to any host but 127.0.0.1 (such requests are blocked and reported), and no
  local request that fails or answers >= 400;
- every formula rendered by MathJax: each `.arithmatex` holds an `mjx-container`, no
  `mjx-merror`, no raw TeX delimiters (`$$`, `\\(`, `\\[`) left in the visible text, and no
  display formula wider than the text column at 1280 or 390 px (it would scroll sideways);
- every figure (`svg`/`img` in the content) visible with a non-zero size, and the text of every
  `attention_site.plot` figure contrasted against the page background in the light and the dark
  palette, and at 390 px no smaller than 9 px (`check_figure_text`);
- the footer's build stamp (versions and device) present;
- every attention explorer (`[data-attention-explorer]`, `docs/javascripts/explorer.js`): its
  model loaded and used as a reader would (explorer_check.py: type, repeat, find the
  induction head, knock out a head, every control, the keyboard, the width, the speed).

On the home page it also types "causal" into the search box and expects results. It saves a
full-page screenshot of every page (light) and of the home and API pages (dark) to the
screenshot directory, outside the repository (the first screen only, once Chromium's capture
of a whole page has stalled: `photograph`).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

from explorer_check import check_explorers  # the same folder: run as a script

CHROMIUM = os.environ.get("ATTENTION_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-sync",
]
# Pages also checked and photographed in the dark palette: home, API, chapters, a notebook.
DARK_TOO = ("", "api/", "simplified/", "heads/", "exercises/03_simplified/")

# Text nodes outside code, scripts and rendered math must not hold raw TeX.
RAW_TEX_JS = r"""
() => {
  const root = document.querySelector(".md-content") || document.body;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode(node) {
      for (let el = node.parentElement; el && el !== root; el = el.parentElement) {
        const tag = el.tagName.toLowerCase();
        if (["pre", "code", "script", "style", "textarea", "mjx-container", "svg"].includes(tag))
          return NodeFilter.FILTER_REJECT;
      }
      return NodeFilter.FILTER_ACCEPT;
    },
  });
  const raw = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent;
    if (/\$\$|\\\(|\\\[|\\frac|\\sqrt|\\operatorname/.test(text)) {
      raw.push(text.trim().slice(0, 80));
    }
  }
  return raw;
}
"""

MATH_JS = """
() => {
  const math = [...document.querySelectorAll(".md-content .arithmatex")];
  return {
    arithmatex: math.length,
    unrendered: math.filter((el) => !el.querySelector("mjx-container")).length,
    // shown (has a layout box) yet zero-width: typeset, but its glyphs did not draw
    blank: [...document.querySelectorAll(".md-content mjx-container")].filter(
      (el) => el.getClientRects().length && el.getBoundingClientRect().width === 0).length,
    containers: document.querySelectorAll(".md-content mjx-container").length,
    errors: document.querySelectorAll("mjx-merror").length,
  };
}
"""

# Display formulas wider than their column at the current width (each would scroll sideways,
# or in a notebook be cut off): the chapters' (pymdownx.arithmatex) and the notebooks' ($$).
WIDE_MATH_JS = """
() => [...document.querySelectorAll(
  '.md-content div.arithmatex, .md-content .jupyter-wrapper mjx-container[display="true"]')]
  .filter((el) => el.scrollWidth > el.clientWidth + 1)
  .map((el) => el.textContent.slice(0, 40))
"""

FIGURES_JS = """
() => {
  const lum = (rgb) => {
    const [r, g, b] = rgb.match(/[0-9.]+/g).slice(0, 3).map((v) => {
      v = Number(v) / 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const background = () => {
    for (let el = document.querySelector(".md-content"); el; el = el.parentElement) {
      const bg = getComputedStyle(el).backgroundColor;
      if (bg && !bg.startsWith("rgba(0, 0, 0, 0)") && bg !== "transparent") return bg;
    }
    return "rgb(255, 255, 255)";
  };
  const bg = lum(background());
  const figures = [...document.querySelectorAll(
    ".md-content svg.attention-figure, .md-content img, .md-content .jp-OutputArea-output svg"
  )];
  return figures.map((el) => {
    const box = el.getBoundingClientRect();
    const style = getComputedStyle(el);
    let contrast = null;
    if (el.classList && el.classList.contains("attention-figure")) {
      const label = [...el.querySelectorAll("text")].find((t) => /[a-z]/i.test(t.textContent)
        && getComputedStyle(t).fill.startsWith("rgb") && t.textContent !== "-inf"
        && !/^[0-9.]+$/.test(t.textContent));
      if (label) {
        const fg = lum(getComputedStyle(label).fill);
        contrast = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
      }
    }
    return {
      tag: el.tagName.toLowerCase(),
      name: el.getAttribute("aria-label") || el.getAttribute("src") || el.id || "",
      width: box.width,
      height: box.height,
      visible: style.visibility !== "hidden" && style.display !== "none" && box.width > 0
        && box.height > 0,
      contrast,
      tooltips: el.querySelectorAll ? el.querySelectorAll("title").length : 0,
    };
  });
}
"""


@dataclass
class PageResult:
    url: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve `site` on 127.0.0.1, on a free port, from a daemon thread."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def page_paths(site: Path) -> list[str]:
    """Every HTML page of the built site, as a path relative to its root ("" = home)."""
    paths = []
    for html in sorted(site.rglob("index.html")):
        rel = html.parent.relative_to(site).as_posix()
        if rel.startswith(("assets", "search")):
            continue
        paths.append("" if rel == "." else rel + "/")
    return paths


def check_page(context, base: str, path: str, scheme: str, shots: Path) -> PageResult:
    url = base + path
    result = PageResult(f"{url} [{scheme}]")
    page = context.new_page()
    page.on(
        "console",
        lambda msg: msg.type == "error" and result.problems.append(f"console error: {msg.text}"),
    )
    page.on("pageerror", lambda exc: result.problems.append(f"uncaught exception: {exc}"))
    page.on(
        "requestfailed",
        lambda req: (
            urlparse(req.url).hostname == "127.0.0.1"
            and result.problems.append(f"request failed: {req.url} ({req.failure})")
        ),
    )
    page.on(
        "response",
        lambda resp: (
            resp.status >= 400 and result.problems.append(f"HTTP {resp.status}: {resp.url}")
        ),
    )
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    page.evaluate(
        "() => (window.MathJax && MathJax.startup && MathJax.startup.promise"
        " ? MathJax.startup.promise : Promise.resolve()).then(() => document.fonts.ready)"
        ".then(() => true)"
    )

    math = page.evaluate(MATH_JS)
    if math["unrendered"] or math["errors"] or math["blank"]:
        result.problems.append(
            f"math: {math['unrendered']} of {math['arithmatex']} formulas not rendered, "
            f"{math['blank']} drawn blank, {math['errors']} TeX errors"
        )
    check_formulas_fit(page, result)
    raw = page.evaluate(RAW_TEX_JS)
    if raw:
        result.problems.append(f"raw TeX in the text: {raw[:3]}")
    result.notes.append(f"{math['containers']} formulas")

    figures = page.evaluate(FIGURES_JS)
    for fig in figures:
        if not fig["visible"]:
            result.problems.append(
                f"figure not visible: <{fig['tag']}> {fig['name']!r} "
                f"({fig['width']:.0f}x{fig['height']:.0f})"
            )
        if fig["contrast"] is not None and fig["contrast"] < 4.5:
            result.problems.append(
                f"figure text hard to read in {scheme} mode: contrast {fig['contrast']:.1f} "
                f"< 4.5 in {fig['name']!r}"
            )
    result.notes.append(f"{len(figures)} figures")

    if scheme == "light":
        check_figure_text(page, result)
    check_explorers(page, result)
    if path == "":
        check_tables_fit(page, result)

    stamp = page.locator(".build-stamp")
    if stamp.count() != 1 or "torch" not in stamp.inner_text():
        result.problems.append("footer: no build stamp with the torch version")

    if path == "" and scheme == "light":
        check_search(page, result)

    name = re.sub(r"[^\w]+", "_", path.strip("/")) or "home"
    photograph(page, shots / f"{name}-{scheme}.png", result)
    page.close()
    return result


FULL_PAGE_SHOTS = True  # until a full-page capture times out


def photograph(page, file: Path, result: PageResult) -> None:
    """Save the whole page as a PNG for a person to look at; the picture checks nothing.

    Chromium's full-page capture of a tall page can stall on a slow machine (it took 3.3 s
    for the 26,000 px Performance page on the 2-core Intel Xeon, and over 30 s once in CI),
    so a capture that does not finish in a minute falls back to the first screen (for this page
    and the pages after it: the check must end), and one that still fails is a note, not a
    failure."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    global FULL_PAGE_SHOTS
    if FULL_PAGE_SHOTS:
        try:
            page.screenshot(path=str(file), full_page=True, timeout=60_000)
            return
        except PlaywrightTimeout:
            FULL_PAGE_SHOTS = False
            result.notes.append("full-page screenshot timed out: first screens from here on")
    try:
        page.screenshot(path=str(file), timeout=30_000)
    except PlaywrightTimeout:
        result.notes.append("no screenshot (timed out)")


def check_search(page, result: PageResult) -> None:
    """Type "causal" into the search: Material's box (MkDocs), or Zensical's dialog, which a
    button opens and which says how many results it found."""
    zensical = page.locator("input.md-search__input").count() == 0
    if zensical:
        page.locator(".md-search__button").first.click()
    else:
        page.locator("input.md-search__input").click(force=True)
    page.keyboard.type("causal", delay=30)  # real key events: the search reacts to them
    try:
        if zensical:
            counted = page.get_by_text(re.compile(r"^\d+ results?$")).first
            counted.wait_for(timeout=10_000)
            hits = int(counted.inner_text().split()[0])
        else:
            page.wait_for_selector(".md-search-result__item", timeout=10_000)
            hits = page.locator(".md-search-result__item").count()
        result.notes.append(f'search "causal": {hits} results')
    except Exception:  # playwright's TimeoutError
        result.problems.append('search for "causal" returned no results')
    page.keyboard.press("Escape")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path("site"))
    parser.add_argument(
        "--screenshots",
        type=Path,
        default=Path(os.environ.get("ATTENTION_SCREENSHOTS", "/tmp/attention-screenshots")),
    )
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--pages", nargs="*", help="only these pages, e.g. heads/ ('' = home)")
    args = parser.parse_args()

    if not (args.site / "index.html").is_file():
        print(f"no built site in {args.site}/: run `nox -s docs` first", file=sys.stderr)
        return 2
    if not Path(args.chromium).is_file():
        print(
            f"no Chromium at {args.chromium}: `apt-get install -y chromium` (Debian), "
            "or point ATTENTION_CHROMIUM at one",
            file=sys.stderr,
        )
        return 2
    from playwright.sync_api import sync_playwright

    args.screenshots.mkdir(parents=True, exist_ok=True)
    server, base = serve(args.site)
    outside: list[str] = []

    def guard(route, request) -> None:
        host = urlparse(request.url).hostname
        if request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            route.continue_()
        else:
            outside.append(request.url)
            route.abort()

    results: list[PageResult] = []
    with sync_playwright() as p:
        # launch() gives the browser a fresh temporary profile (user-data-dir) every time
        browser = p.chromium.launch(
            executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS
        )
        paths = page_paths(args.site) if args.pages is None else args.pages
        for scheme in ("light", "dark"):
            context = browser.new_context(
                color_scheme=scheme, viewport={"width": 1280, "height": 900}
            )
            context.route("**/*", guard)
            for path in paths:
                if scheme == "dark" and path not in DARK_TOO:
                    continue
                print(f"checking /{path} [{scheme}]", file=sys.stderr, flush=True)
                results.append(check_page(context, base, path, scheme, args.screenshots))
            context.close()
        browser.close()
    server.shutdown()

    links = PageResult("in-site links and their #anchors")
    links.problems = broken_anchors(args.site)
    results.append(links)
    failed = [r for r in results if r.problems]
    for r in results:
        mark = "FAIL" if r.problems else "ok  "
        print(f"{mark} {r.url}  ({', '.join(r.notes)})")
        for problem in r.problems:
            print(f"       - {problem}")
    if outside:
        print(f"FAIL requests to other hosts (blocked): {sorted(set(outside))[:10]}")
    print(f"screenshots: {args.screenshots}/")
    print(f"site check: {len(results) - len(failed)} passed, {len(failed) + bool(outside)} failed")
    return 1 if failed or outside else 0


# Each table's right edge against its column's, at the current width (> 0: a column is cut off).
TABLES_JS = """
() => [...document.querySelectorAll(".md-content table")].map((table) => {
  const column = (table.closest(".md-content__inner") || document.body).getBoundingClientRect();
  return {
    overflow: table.getBoundingClientRect().right - column.right,
    header: (table.querySelector("th") || {}).textContent || "",
  };
})
"""


def check_formulas_fit(page, result: PageResult) -> None:
    """No display formula wider than its column, at 1280 px nor on a 390 px phone: MathJax
    does not break lines, so a long one is broken in its source (`aligned`, `gathered`)."""
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        wide = page.evaluate(WIDE_MATH_JS)
        if wide:
            result.problems.append(f"display formulas wider than the column at {width} px: {wide}")
    page.set_viewport_size({"width": 1280, "height": 900})


# Each attention_site figure's smallest text as drawn, in CSS px: its font size times the
# scale the page draws it at (the SVG's screen matrix); hidden text (a heatmap's values on a
# phone) left out.
FIGURE_TEXT_JS = """
() => [...document.querySelectorAll(".md-content svg.attention-figure")].map((svg) => {
  let least = Infinity, text = "";
  for (const t of svg.querySelectorAll("text")) {
    if (!t.getClientRects().length || !t.textContent.trim()) continue;
    const m = t.getScreenCTM();
    const px = parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);
    if (px < least) [least, text] = [px, t.textContent];
  }
  return { name: svg.getAttribute("aria-label") || "", least, text };
})
"""
SMALLEST_TEXT_PX = 9.0


def check_figure_text(page, result: PageResult) -> None:
    """At 390 px no text of a figure smaller than SMALLEST_TEXT_PX: a figure scales down to
    the phone's column, its text with it."""
    page.set_viewport_size({"width": 390, "height": 900})
    for fig in page.evaluate(FIGURE_TEXT_JS):
        if fig["least"] < SMALLEST_TEXT_PX:
            result.problems.append(
                f"figure {fig['name']!r}: text {fig['text']!r} drawn at {fig['least']:.1f} px "
                f"at 390 px (< {SMALLEST_TEXT_PX:g})"
            )
    page.set_viewport_size({"width": 1280, "height": 900})


def check_tables_fit(page, result: PageResult) -> None:
    """At 390 px every table of the page (the home page's map of the chapters) must fit its
    column: a table wider than the phone's column hides its last column off-screen."""
    page.set_viewport_size({"width": 390, "height": 900})
    for table in page.evaluate(TABLES_JS):
        if table["overflow"] > 1:
            result.problems.append(
                f"table {table['header']!r}...: wider than the column at 390 px by "
                f"{table['overflow']:.0f} px (a column is cut off)"
            )
    page.set_viewport_size({"width": 1280, "height": 900})


class _Anchors(HTMLParser):
    """The ids a page defines and the hrefs of its links."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if named.get("id"):
            self.ids.add(str(named["id"]))
        if tag == "a" and named.get("name"):
            self.ids.add(str(named["name"]))
        if tag == "a" and named.get("href"):
            self.hrefs.append(str(named["href"]))


def broken_anchors(site: Path) -> list[str]:
    """Every link from one built page to another (or to itself) whose `#anchor` names no id on
    the target page: `page: href`. A table of contents built from other slugs than the
    headings' own ids (a notebook's, say) shows up here."""
    pages: dict[str, _Anchors] = {}
    for html in sorted(site.rglob("*.html")):
        parsed = _Anchors()
        parsed.feed(html.read_text(encoding="utf-8"))
        pages[html.relative_to(site).as_posix()] = parsed
    broken = []
    for name, parsed in pages.items():
        for href in parsed.hrefs:
            url = urlparse(urljoin(f"http://site/{name}", href))
            if url.netloc != "site" or not url.fragment:
                continue
            target = url.path.lstrip("/")
            target = target + "index.html" if target.endswith("/") or not target else target
            if target in pages and unquote(url.fragment) not in pages[target].ids:
                broken.append(f"{name}: {href}")
    return sorted(set(broken))


if __name__ == "__main__":
    sys.exit(main())
