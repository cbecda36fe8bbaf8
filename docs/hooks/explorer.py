"""MkDocs hook: write each attention explorer's weights file, and check the browser's forward.

A page that calls `attention_site.explorer.explorer_html` leaves its model's float32 weights, the
model and the sequences to check in `attention_site.explorer.published()`. Once the page is
converted, this hook writes each file where the page's explorer fetches it, then, on the
second core in its turn (`attention_site.runs.in_turn`: after the notebooks and the pages
that run ahead, before the Performance page, which waits for every turn), runs
`docs/javascripts/model.js` (the forward the reader's browser runs) in headless Chromium on
those sequences and fails the build unless every logit and weight is within
`attention_site.explorer.TOLERANCE` of PyTorch's float32 answer and
`attention_site.explorer.EXACT` of its float64 one (`attention_site.explorer.reference`).

Chromium: `ATTENTION_CHROMIUM` (set by `nox -s docs`), else /usr/bin/chromium; playwright
drives it (the `docs` extra installs the Python driver; never `playwright install`).
"""

from __future__ import annotations

import base64
import copy
import functools
import http.server
import logging
import os
import shutil
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.explorer")

CHECK_JS = """
async ({ url, meta, cases }) => {
  const model = attentionModel.load(meta, await (await fetch(url)).arrayBuffer());
  const floats = (text, Type) =>
    new Type(Uint8Array.from(atob(text), (c) => c.charCodeAt(0)).buffer);
  /* the largest |browser - PyTorch|, over max(1, |PyTorch|) where `relative` (NaN: Infinity) */
  const worst = (got, want, relative) => got.reduce((most, v, i) => {
    const scale = relative ? Math.max(1, Math.abs(want[i])) : 1;
    return Math.max(most, Math.abs(v - want[i]) / scale || (v === want[i] ? 0 : Infinity));
  }, 0);
  const errors = cases.map((c) => {
    const out = attentionModel.forward(model, c.ids, c.settings);
    const logits = new Float64Array(c.ids.length * meta.vocab_size);
    c.ids.forEach((_, t) => logits.set(out.logitsAt(t), t * meta.vocab_size));
    const weights = new Float64Array(out.weights.reduce((n, w) => n + w.length, 0));
    out.weights.forEach((w, l) => weights.set(w, l * w.length));
    const want = Object.fromEntries(["logits32", "weights32", "logits64", "weights64"].map(
      (k) => [k, floats(c[k], k.endsWith("32") ? Float32Array : Float64Array)]));
    if (want.logits64.length !== logits.length || want.weights64.length !== weights.length) {
      return [Infinity, Infinity, Infinity, Infinity];
    }
    return [worst(logits, want.logits32, true), worst(weights, want.weights32, false),
      worst(logits, want.logits64, false), worst(weights, want.weights64, false)];
  });
  return errors;
}
"""


def _floats(tensor: Any, dtype: str) -> str:
    """A tensor as base64 little-endian floats (`<f4` or `<f8`), as the JavaScript reads them."""
    return base64.b64encode(tensor.detach().flatten().numpy().astype(dtype).tobytes()).decode()


def _cases(entry: Any) -> list[dict[str, Any]]:
    """Each case with PyTorch's answers: the model's own (float32), and in float64, where
    only the browser's arithmetic can differ (its weights are the same float32s)."""
    from attention_site.explorer import reference

    exact = copy.deepcopy(entry.model).double()
    cases = []
    for idx, settings in entry.cases:
        logits32, weights32 = reference(entry.model, idx, settings)
        logits64, weights64 = reference(exact, idx, settings)
        cases.append({
            "ids": idx[0].tolist(),
            "settings": asdict(settings),  # ablate: a list of [layer, head]
            "logits32": _floats(logits32, "<f4"), "weights32": _floats(weights32, "<f4"),
            "logits64": _floats(logits64, "<f8"), "weights64": _floats(weights64, "<f8"),
        })  # fmt: skip
    return cases


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _check(site: Path, entries: list[Any], model_js: Path) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise PluginError("the explorer check needs playwright (the docs extra)") from exc
    chromium = os.environ.get("ATTENTION_CHROMIUM", "/usr/bin/chromium")
    if not os.path.exists(chromium):
        raise PluginError(
            f"the explorer check needs Chromium: none at {chromium} (set "
            "ATTENTION_CHROMIUM, or `sudo apt-get install chromium`)"
        )
    server, base = _serve(site)
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
    ]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=args)
            page = browser.new_page()
            page.goto(base)  # the served folder's origin, to fetch from it
            page.add_script_tag(path=str(model_js))
            for entry in entries:
                errors = page.evaluate(
                    CHECK_JS, {"url": base + entry.path, "meta": entry.meta, "cases": _cases(entry)}
                )
                _judge(entry, errors)
            browser.close()
    finally:
        server.shutdown()


def _judge(entry: Any, errors: list[list[float]]) -> None:
    """Fail unless the browser is within TOLERANCE of PyTorch's float32 answer (logits
    relative to their size, at least 1), and within EXACT of its float64 one. (How fast the
    forward runs is the site check's to measure: tests/browser/explorer_check.py.)"""
    from attention_site.explorer import EXACT, TOLERANCE

    worst = [max(e[k] for e in errors) for k in range(4)]
    log.info(
        f"explorer {entry.path}: {len(errors)} sequences in Chromium; largest "
        f"difference from PyTorch in float32: logits {worst[0]:.1e} (relative), weights "
        f"{worst[1]:.1e}; in float64: {worst[2]:.1e}, {worst[3]:.1e}"
    )
    limits = [TOLERANCE, TOLERANCE, EXACT, EXACT]
    bad = [i for i, e in enumerate(errors) if not all(map(float.__le__, e, limits))]
    if bad:
        raise PluginError(
            f"explorer {entry.path}: the browser's forward differs from PyTorch's on cases "
            f"{bad[:10]}: float32 {worst[0]:.1e}, {worst[1]:.1e} (limit {TOLERANCE}), float64 "
            f"{worst[2]:.1e}, {worst[3]:.1e} (limit {EXACT})"
        )


def publish(site: Path, model_js: Path) -> Future[None] | None:
    """Write the explorers' weights the pages published into `site`, and start checking them
    in Chromium against PyTorch, in turn (None: nothing was published). The check serves
    its own copy of the weights and reads `model_js` where it is (the site's
    `javascripts/model.js` may not be written yet)."""
    from attention_site.explorer import published
    from attention_site.runs import in_turn

    # the check's own copy of each model: the pages go on using theirs while it runs
    entries = [replace(entry, model=copy.deepcopy(entry.model)) for entry in published()]
    published().clear()
    if not entries:
        return None
    for entry in entries:
        target = site / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(entry.data)
    return in_turn().submit(_check_copy, entries, model_js)


def _check_copy(entries: list[Any], model_js: Path) -> None:
    served = Path(tempfile.mkdtemp(prefix="attention-explorer-"))
    try:
        (served / "index.html").write_text("<!doctype html><title>explorer check</title>")
        for entry in entries:
            (served / entry.path).parent.mkdir(parents=True, exist_ok=True)
            (served / entry.path).write_bytes(entry.data)
        _check(served, entries, model_js)
    finally:
        shutil.rmtree(served, ignore_errors=True)


_checks: list[Future[None]] = []
"""The checks started, one per page with explorers: on the second core, in turn."""


def on_pre_build(config: MkDocsConfig) -> None:
    _checks.clear()  # a build that failed left its checks behind (mkdocs serve builds again)


def on_page_content(html: str, page: Any, config: MkDocsConfig, files: Any) -> str:
    """Publish what the page's explorers left, and start their check."""
    check = publish(Path(config.site_dir), Path(config.docs_dir) / "javascripts" / "model.js")
    if check is not None:
        _checks.append(check)
    return html


def on_post_build(config: MkDocsConfig) -> None:
    """Wait for the checks; fail the build if one failed."""
    while _checks:
        _checks.pop(0).result()  # raises what the check raised
