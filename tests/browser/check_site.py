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
  display formula wider than the text column (it would be cut off at the column's edge);
- every figure (`svg`/`img` in the content) visible with a non-zero size, and the text of every
  `attention.plot` figure contrasted against the page background in the light and the dark
  palette;
- the footer's build stamp (versions and device) present;
- every attention explorer (`[data-attention-explorer]`, `docs/javascripts/explorer.js`) drawn,
  each control labelled, and each control alive: choosing another sentence, layer and head,
  toggling the mask, moving the temperature slider, hovering a token, focusing one and pressing
  ArrowRight must each change what is drawn (cell colours, token strip or caption); Enter pins
  the query; the selected query's weights in the strip must equal a softmax of the page's
  embedded scores computed here; and nothing may overflow the column at 1280 or 390 px.

On the home page it also types "causal" into the search box and expects results. It saves a
full-page screenshot of every page (light) and of the home and API pages (dark) to the
screenshot directory, outside the repository.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import math
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

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
    // display formulas wider than their column (on chapter pages, not the API reference)
    overflowing: [...document.querySelectorAll(".md-content div.arithmatex")]
      .filter((el) => el.scrollWidth > el.clientWidth + 1)
      .map((el) => el.textContent.slice(0, 40)),
  };
}
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

# What an explorer draws, to compare before and after a control is used.
EXPLORER_DRAWN_JS = """
(root) => JSON.stringify({
  heatmap: [...root.querySelectorAll("canvas.ax-heatmap")].map((c) => c.toDataURL()),
  tokens: [...root.querySelectorAll(".ax-token")].map(
    (t) => t.className + t.textContent + getComputedStyle(t).backgroundImage),
  caption: (root.querySelector(".ax-caption") || {}).textContent,
})
"""

# Its state, its data, the strip's weights, whether every control has a label, and its width.
EXPLORER_STATE_JS = """
(root) => {
  const column = root.closest(".md-content__inner") || root.parentElement;
  return {
    state: {...root.dataset},
    data: JSON.parse(root.querySelector("script[type='application/json']").textContent),
    strip: [...root.querySelectorAll(".ax-token .ax-weight")].map((w) => w.textContent),
    focused: document.activeElement && document.activeElement.dataset.index,
    unlabelled: [...root.querySelectorAll("select, input")].filter((el) => !el.labels.length)
      .map((el) => el.id || el.type),
    live: root.querySelectorAll(".ax-caption[aria-live]").length,
    overflow: root.getBoundingClientRect().right - column.getBoundingClientRect().right,
    pageWidth: document.documentElement.scrollWidth - window.innerWidth,
  };
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


def softmax_row(info: dict) -> list[float | None]:
    """The selected query's weights, from the embedded scores, as the explorer should draw them."""
    state, data = info["state"], info["data"]
    sentence = next(s for s in data["sentences"] if s["name"] == state["sentence"])
    i, tau = int(state["query"]), float(state["temperature"])
    row = sentence["scores"][int(state["layer"])][int(state["head"])][i]
    hidden = [state["causal"] == "true" and sentence["hidden"][i][j] == "1"
              for j in range(len(row))]  # fmt: skip
    top = max(v / tau for v, h in zip(row, hidden, strict=True) if not h)
    e = [0.0 if h else math.exp(v / tau - top) for v, h in zip(row, hidden, strict=True)]
    return [None if h else v / sum(e) for v, h in zip(e, hidden, strict=True)]


# A page with an explorer stays small enough to load quickly on a phone (issue 19).
EXPLORER_PAGE_BYTES = 500_000
# And each interaction redraws within this on a CPU four times slower than the runner's.
EXPLORER_MS, EXPLORER_THROTTLE = 50.0, 4

# One interaction, timed in the page: the handlers' script, then the frame that draws it
# (style, layout, paint: from the next animation frame to a task after it), without the idle
# wait for that frame.
EXPLORER_TIME_JS = """
async ([root, what, k]) => {
  const fire = {
    temperature: () => {
      const el = root.querySelector("input[type=range]");
      el.value = String(k % 2 ? -0.5 + 0.05 * k : 0.5 - 0.05 * k);
      el.dispatchEvent(new Event("input", { bubbles: true }));
    },
    layer: () => root.querySelector("select[id$=-layer]"),
    head: () => root.querySelector("select[id$=-head]"),
    sequence: () => root.querySelector("select[id$=-sentence]"),
    mask: () => root.querySelector("input[type=checkbox]").click(),
    "hovering a token": () => root.querySelectorAll(".ax-token")[2 + 2 * k].dispatchEvent(
      new PointerEvent("pointerover", { bubbles: true })),
    "hovering the heatmap": () => {
      const box = root.querySelector("canvas.ax-heatmap").getBoundingClientRect();
      root.querySelector("canvas.ax-heatmap").dispatchEvent(new PointerEvent("pointermove", {
        bubbles: true, clientX: box.left + box.width * (0.25 + 0.1 * k),
        clientY: box.top + box.height * (0.95 - 0.1 * k) }));
    },
  }[what];
  const start = performance.now();
  const el = fire();
  if (el instanceof HTMLSelectElement) {
    el.selectedIndex = (el.selectedIndex + 1) % el.options.length;
    el.dispatchEvent(new Event("change", { bubbles: true }));
  }
  const script = performance.now() - start;
  let frame = 0;
  await new Promise((done) => requestAnimationFrame(() => {
    frame = performance.now();
    setTimeout(done, 0);
  }));
  return script + (performance.now() - frame);
}
"""


def check_explorers(page, result: PageResult) -> None:
    """Drive every control of every attention explorer; each must change what is drawn."""
    roots = page.locator("[data-attention-explorer]")
    if not roots.count():
        return
    size = page.evaluate("() => performance.getEntriesByType('navigation')[0].decodedBodySize")
    if size > EXPLORER_PAGE_BYTES:
        result.problems.append(
            f"page with an explorer: {size / 1e3:.0f} KB of HTML (at most "
            f"{EXPLORER_PAGE_BYTES / 1e3:.0f} KB)"
        )
    for k in range(roots.count()):
        check_explorer(page, roots.nth(k), f"explorer {k + 1}", result)
        check_explorer_speed(page, roots.nth(k), f"explorer {k + 1}", result)


def check_explorer_speed(page, root, name: str, result: PageResult) -> None:
    """Each interaction, at 4x CPU throttling (Chromium's own), redraws in under 50 ms."""
    cdp = page.context.new_cdp_session(page)
    root.scroll_into_view_if_needed()
    cdp.send("Emulation.setCPUThrottlingRate", {"rate": EXPLORER_THROTTLE})
    try:
        times = {}
        for what in ("temperature", "layer", "head", "mask", "sequence", "hovering a token",
                     "hovering the heatmap"):  # fmt: skip
            handle = root.element_handle()
            runs = sorted(page.evaluate(EXPLORER_TIME_JS, [handle, what, k]) for k in range(5))
            times[what] = runs[2]  # the median of five: a slow run or two is the runner's noise
    finally:
        cdp.send("Emulation.setCPUThrottlingRate", {"rate": 1})
        cdp.detach()
    slow = {what: ms for what, ms in times.items() if ms >= EXPLORER_MS}
    if slow:
        result.problems.append(
            f"{name}: slower than {EXPLORER_MS:.0f} ms at {EXPLORER_THROTTLE}x CPU throttling: "
            + ", ".join(f"{what} {ms:.0f} ms" for what, ms in slow.items())
        )
    result.notes.append(
        f"{name} at {EXPLORER_THROTTLE}x throttling: "
        + ", ".join(f"{what} {ms:.0f} ms" for what, ms in times.items())
    )


def check_explorer(page, root, name: str, result: PageResult) -> None:
    if root.get_attribute("data-ready") is None or not root.locator("canvas.ax-heatmap").count():
        result.problems.append(f"{name}: not drawn (is javascripts/explorer.js loaded?)")
        return

    def changes(what: str, act) -> None:
        before = root.evaluate(EXPLORER_DRAWN_JS)
        act()
        if root.evaluate(EXPLORER_DRAWN_JS) == before:
            result.problems.append(f"{name}: {what} changed nothing")
        info = root.evaluate(EXPLORER_STATE_JS)
        drawn = [None if w == "\u2013" else float(w) for w in info["strip"]]
        expected = softmax_row(info)
        if len(drawn) != len(expected) or any(
            (a is None) != (b is None) or (a is not None and abs(a - b) > 0.006)
            for a, b in zip(drawn, expected, strict=False)
        ):
            result.problems.append(
                f"{name}: after {what}, the strip shows {drawn[:6]}..., a softmax of the "
                f"embedded scores gives {[b and round(b, 2) for b in expected[:6]]}..."
            )

    selects = root.locator("select")
    for s in range(selects.count()):
        select = selects.nth(s)
        label = select.evaluate("(el) => el.labels[0].textContent")
        options = select.locator("option").count()
        if options > 1:
            other = (int(select.input_value()) + 1) % options
            changes(f"the {label} select", functools.partial(select.select_option, index=other))
    changes("the mask checkbox", root.locator("input[type=checkbox]").click)
    changes("the temperature slider", lambda: root.locator("input[type=range]").fill("-1"))
    tokens = root.locator(".ax-token")
    changes("hovering a token", tokens.nth(1).hover)
    changes("focusing a token", tokens.nth(3).focus)
    changes("ArrowRight", lambda: page.keyboard.press("ArrowRight"))
    if root.evaluate(EXPLORER_STATE_JS)["focused"] != "4":
        result.problems.append(f"{name}: ArrowRight did not move the focus to the next token")
    page.keyboard.press("Enter")
    page.mouse.move(0, 0)
    page.evaluate("() => document.activeElement.blur()")
    info = root.evaluate(EXPLORER_STATE_JS)
    if info["state"]["query"] != "4":
        result.problems.append(f"{name}: Enter did not pin the query (now {info['state']})")
    if info["unlabelled"] or info["live"] != 1:
        result.problems.append(
            f"{name}: controls without a label {info['unlabelled']}, "
            f"{info['live']} aria-live captions"
        )
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        info = root.evaluate(EXPLORER_STATE_JS)
        if info["overflow"] > 1 or info["pageWidth"] > 0:
            result.problems.append(
                f"{name}: wider than the column at {width} px by {info['overflow']:.0f} px "
                f"(page {info['pageWidth']} px wider than the window)"
            )
    page.set_viewport_size({"width": 1280, "height": 900})
    result.notes.append(f"{name}: controls driven")


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
    if math["overflowing"]:
        result.problems.append(f"display formulas wider than the column: {math['overflowing']}")
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

    check_explorers(page, result)
    if path == "":
        check_tables_fit(page, result)

    stamp = page.locator(".build-stamp")
    if stamp.count() != 1 or "torch" not in stamp.inner_text():
        result.problems.append("footer: no build stamp with the torch version")

    if path == "" and scheme == "light":
        page.locator("input.md-search__input").click(force=True)
        page.keyboard.type("causal", delay=30)  # real key events: Material reacts to them
        try:
            page.wait_for_selector(".md-search-result__item", timeout=10_000)
            hits = page.locator(".md-search-result__item").count()
            result.notes.append(f'search "causal": {hits} results')
        except Exception:  # playwright's TimeoutError
            result.problems.append('search for "causal" returned no results')
        page.keyboard.press("Escape")

    name = re.sub(r"[^\w]+", "_", path.strip("/")) or "home"
    page.screenshot(path=str(shots / f"{name}-{scheme}.png"), full_page=True)
    page.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path("site"))
    parser.add_argument(
        "--screenshots",
        type=Path,
        default=Path(os.environ.get("ATTENTION_SCREENSHOTS", "/tmp/attention-screenshots")),
    )
    parser.add_argument("--chromium", default=CHROMIUM)
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
        paths = page_paths(args.site)
        for scheme in ("light", "dark"):
            context = browser.new_context(
                color_scheme=scheme, viewport={"width": 1280, "height": 900}
            )
            context.route("**/*", guard)
            for path in paths:
                if scheme == "dark" and path not in DARK_TOO:
                    continue
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
