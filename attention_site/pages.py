"""What a page shows: its shown code blocks, and which of them need this repository.

A chapter's code blocks are markdown-exec's (`` ```python exec="1" ... ``): a block with
`source=` is shown and run, one without it runs hidden (a figure's or a check's setup). The
shown blocks of a page, copied in order into one Python session, run as they do on the page
(docs/start.md says so); those that import a module the wheel does not bring (`OUTSIDE`:
`attention_site`, in a checkout of the repository only, and `transformers`, a `pip install`
away) need more than the wheel, and so do those that read what such a block made. The build
marks them (docs/hooks/package.py), and the install check runs the others with the site's wheel
alone (tests/browser/check_install.py).
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "OUTSIDE",
    "SHOWN",
    "Block",
    "Need",
    "chapters",
    "is_shown",
    "page_blocks",
    "repository_blocks",
    "shown_blocks",
]

SHOWN = re.compile(
    r"^(?P<indent> *)```python (?P<options>[^\n]*\bexec=[^\n]*)\n(?P<code>.*?)^(?P=indent)```$",
    re.MULTILINE | re.DOTALL,
)
"""A markdown-exec python block, its fence's indent, options and code (shown or not)."""

OUTSIDE = ("attention_site", "transformers")
"""The modules a page imports that the wheel does not bring: the site's tooling (a checkout of
the repository only) and Hugging Face's transformers (the pages compare with its models)."""

_OUTSIDE_IMPORT = re.compile(rf"^\s*(?:from|import) ({'|'.join(OUTSIDE)})\b", re.MULTILINE)
_PART = r"^  - {}:\n((?:      - .*\n)+)"
PARTS = ("The derivation", "What current models use", "Beyond the book")
"""mkdocs.yml's nav sections that hold the chapters, numbered from 1 in this order."""


@dataclass(frozen=True)
class Block:
    """One block: where it is, its code (dedented), whether the page shows it, its session."""

    page: str
    line: int  # of its opening fence, from 1
    code: str
    shown: bool = True
    session: str = ""  # markdown-exec's `session=`: "" runs in a namespace of its own

    @property
    def imports_outside(self) -> tuple[str, ...]:
        """The modules of `OUTSIDE` it imports, in `OUTSIDE`'s order."""
        found = set(_OUTSIDE_IMPORT.findall(self.code))
        return tuple(module for module in OUTSIDE if module in found)

    @property
    def needs_repository(self) -> bool:
        """Does it import `attention_site`, which only a checkout of the repository has?"""
        return "attention_site" in self.imports_outside


@dataclass(frozen=True)
class Need:
    """What a block needs beyond the wheel: the modules of `OUTSIDE` it `imports` itself, and
    the `names` it reads that an earlier block of its session bound, which needed `via`."""

    imports: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    via: tuple[str, ...] = ()

    @property
    def modules(self) -> tuple[str, ...]:
        """Every module of `OUTSIDE` it needs, in `OUTSIDE`'s order."""
        return tuple(module for module in OUTSIDE if module in self.imports + self.via)


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


def page_blocks(markdown: str, page: str = "") -> list[Block]:
    """Every block `markdown` runs, shown or hidden, in order: the page's program.

    Examples:
        >>> text = '```python exec="1" session="s"\\nx = 1\\n```\\n'
        >>> [(b.shown, b.session) for b in page_blocks(text)]
        [(False, 's')]
    """
    blocks = []
    for match in SHOWN.finditer(markdown):
        session = re.search(r'\bsession="([^"]*)"', match["options"])
        line = markdown.count("\n", 0, match.start()) + 1
        blocks.append(Block(page, line, textwrap.dedent(match["code"]), is_shown(match["options"]),
                            session[1] if session else ""))  # fmt: skip
    return blocks


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names a block's code binds (assignments, imports, definitions) and the names it reads."""
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
    return bound, read


def repository_blocks(blocks: list[Block]) -> dict[Block, Need]:
    """The blocks that need more than the wheel, each with what it needs: those that import a
    module of `OUTSIDE` (no names), and those that read a name one of them bound earlier in the
    same session (a figure's helper, or a value computed beside a figure).

    Examples:
        >>> code = ["from attention_site.plot import svg", "x = 1", "print(svg(x))", "y = x",
        ...         "import transformers", "c = transformers.GPT2Config()", "print(c, x)"]
        >>> blocks = [Block("p.md", n, c, session="s") for n, c in enumerate(code)]
        >>> for block, need in repository_blocks(blocks).items():
        ...     print(block.line, need.modules, need.names)
        0 ('attention_site',) ()
        2 ('attention_site',) ('svg',)
        4 ('transformers',) ()
        5 ('transformers',) ('transformers',)
        6 ('transformers',) ('c',)
    """
    needs: dict[Block, Need] = {}
    tainted: dict[str, dict[str, tuple[str, ...]]] = {}  # per session: name -> what it needs
    for block in blocks:
        names = tainted.setdefault(block.session, {}) if block.session else {}
        bound, read = _names(ast.parse(block.code))
        uses = sorted((read - bound) & names.keys())  # a name it binds itself is its own
        via = set().union(*(names[name] for name in uses))
        if block.imports_outside or via:
            needs[block] = Need(block.imports_outside, tuple(uses),
                                tuple(m for m in OUTSIDE if m in via))  # fmt: skip
        for name in bound:
            if block in needs:
                names[name] = needs[block].modules
            else:
                names.pop(name, None)
    return needs


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
