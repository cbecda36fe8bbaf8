"""What a page shows: its shown code blocks, and which of them need this repository.

A chapter's code blocks are markdown-exec's (`` ```python exec="1" ... ``): a block with
`source=` is shown and run, one without it runs hidden (a figure's or a check's setup). The
shown blocks of a page, copied in order into one Python session, run as they do on the page
(docs/start.md says so); those that import `attention_site` need a checkout of the repository,
which the wheel does not hold. The build marks them (docs/hooks/package.py), and the install
check runs the others with the site's wheel alone (tests/browser/check_install.py).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SHOWN", "Block", "chapters", "is_shown", "shown_blocks"]

SHOWN = re.compile(
    r"^(?P<indent> *)```python (?P<options>[^\n]*\bexec=[^\n]*)\n(?P<code>.*?)^(?P=indent)```$",
    re.MULTILINE | re.DOTALL,
)
"""A markdown-exec python block, its fence's indent, options and code (shown or not)."""

_SITE_IMPORT = re.compile(r"^\s*(?:from|import) attention_site\b", re.MULTILINE)
_PART = r"^  - {}:\n((?:      - .*\n)+)"
PARTS = ("The derivation", "What current models use", "Beyond the book")
"""mkdocs.yml's nav sections that hold the chapters, numbered from 1 in this order."""


@dataclass(frozen=True)
class Block:
    """One shown block: where it is, its code (dedented), and whether it needs the repository."""

    page: str
    line: int  # of its opening fence, from 1
    code: str

    @property
    def needs_repository(self) -> bool:
        """Does it import `attention_site`, which only a checkout of the repository has?"""
        return bool(_SITE_IMPORT.search(self.code))


def is_shown(options: str) -> bool:
    """A block's fence options show its source (markdown-exec's `source=`).

    >>> is_shown('exec="1" source="block" result="text"'), is_shown('exec="1" html="1"')
    (True, False)
    """
    return bool(re.search(r"\bsource=", options))


def shown_blocks(markdown: str, page: str = "") -> list[Block]:
    """The blocks `markdown` shows and runs, in order.

    Examples:
        >>> text = '```python exec="1"\\nhidden = 1\\n```\\n\\n'
        >>> text += '  ```python exec="1" source="block"\\n'
        >>> text += '  from attention_site.plot import svg\\n  ```\\n'
        >>> [(b.line, b.code, b.needs_repository) for b in shown_blocks(text)]
        [(5, 'from attention_site.plot import svg\\n', True)]
    """
    return [
        Block(page, markdown.count("\n", 0, match.start()) + 1, textwrap.dedent(match["code"]))
        for match in SHOWN.finditer(markdown)
        if is_shown(match["options"])
    ]


def chapters(root: Path) -> list[str]:
    """The chapters' pages (`simplified.md`, ...), in mkdocs.yml's nav order: chapter 1 first."""
    nav = (root / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n", 1)[1]
    pages: list[str] = []
    for part in PARTS:
        section = re.search(_PART.format(re.escape(part)), nav, re.MULTILINE)
        if section is None:
            raise ValueError(f"mkdocs.yml's nav has no section {part!r}")
        pages += re.findall(r"- ([\w-]+\.md)", section[1])
    return pages
