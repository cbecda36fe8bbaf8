"""The MkDocs build and the Zensical build of the site: the same pages, the same outputs.

    python tests/browser/compare_builds.py --mkdocs site --zensical site-zensical

Checks that both hold the same pages (every `index.html`) and that a sample of pages shows the
same executed outputs: the text of every `<pre>` block in the article, code and printed
results, in order (chapters' markdown-exec blocks; an exercise notebook's cells). The pages
sampled print only seeded, machine-independent numbers. Exit status 1 on a difference.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

SAMPLE = ("simplified", "qkv", "causal", "multihead", "exercises/03_simplified",
          "exercises/06_causal")  # fmt: skip
_PRE = re.compile(r"<pre\b[^>]*>(.*?)</pre>", re.DOTALL)
_TAG = re.compile(r"<[^>]+>")
_CODE_OF_PAGE = re.compile(r"<(script|style)\b.*?</\1>", re.DOTALL)  # not a page's text


def pages(site: Path) -> set[str]:
    """Every page of a build: the folder of each `index.html`, relative to the site."""
    return {path.parent.relative_to(site).as_posix() for path in site.rglob("index.html")}


def outputs(page: Path) -> list[str]:
    """The text of each `<pre>` block of the page's article, whitespace normalised."""
    text = page.read_text(encoding="utf-8")
    start = text.find("<article")
    article = text[start : text.find("</article>", start)] if start >= 0 else text
    article = _CODE_OF_PAGE.sub("", article)
    blocks = (html.unescape(_TAG.sub("", block)) for block in _PRE.findall(article))
    return [" ".join(block.split()) for block in blocks if block.strip()]


def compare(mkdocs: Path, zensical: Path) -> list[str]:
    """What differs between the two builds (empty: nothing)."""
    problems = []
    ours, theirs = pages(mkdocs), pages(zensical)
    if ours != theirs:
        problems.append(f"pages only under MkDocs: {sorted(ours - theirs)[:10]}; only under "
                        f"Zensical: {sorted(theirs - ours)[:10]}")  # fmt: skip
    for name in SAMPLE:
        a, b = (outputs(site / name / "index.html") for site in (mkdocs, zensical))
        if not a or a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            problems.append(f"{name}: {len(a)} blocks under MkDocs, {len(b)} under Zensical; "
                            f"first difference at block {first}")  # fmt: skip
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mkdocs", type=Path, default=Path("site"))
    parser.add_argument("--zensical", type=Path, default=Path("site-zensical"))
    args = parser.parse_args()
    problems = compare(args.mkdocs, args.zensical)
    for problem in problems:
        print("FAIL", problem)
    count = len(pages(args.mkdocs))
    print(f"builds compared: {count} pages under MkDocs, {len(pages(args.zensical))} under "
          f"Zensical; outputs of {len(SAMPLE)} pages: {len(problems)} differences")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
