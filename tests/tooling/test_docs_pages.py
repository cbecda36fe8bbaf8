"""The documentation pages as a reader sees them: no shown code relies on hidden code.

A markdown-exec block without `source=` runs but is not shown (a figure, a printed source).
A name that a shown block uses must be defined by a shown block before it (or in itself), or
the reader who copies the page's code gets a NameError.
"""

from __future__ import annotations

import ast
import builtins
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(
    r"^```python (?P<options>[^\n]*exec=\"1\"[^\n]*)\n(?P<code>.*?)^```$", re.M | re.S
)


def defined_and_used(code: str) -> tuple[set[str], set[str]]:
    """Names a block binds anywhere (imports, assignments, defs, loop and `as` targets,
    arguments), and names it reads."""
    tree = ast.parse(code)
    defined: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, ast.alias):
            defined.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    return defined, used


def hidden_names(page: Path) -> list[str]:
    """`block N uses NAME` for each name a shown block takes from a hidden one."""
    shown: dict[str, set[str]] = {}  # session -> names defined by shown blocks so far
    hidden: dict[str, set[str]] = {}  # session -> names defined by hidden blocks so far
    problems = []
    for number, match in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8")), 1):
        session = re.search(r'session="([^"]+)"', match["options"])
        key = session[1] if session else f"block {number}"
        defined, used = defined_and_used(match["code"])
        if "source=" in match["options"]:
            seen = shown.setdefault(key, set()) | defined | set(dir(builtins))
            problems += [
                f"block {number} uses {name!r}"
                for name in sorted(used - seen)
                if name in hidden.get(key, set())
            ]
            shown[key] |= defined
        else:
            hidden.setdefault(key, set()).update(defined)
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_shown_code_does_not_use_names_only_hidden_code_defines(page: Path) -> None:
    assert hidden_names(page) == []


def test_the_check_finds_a_name_from_a_hidden_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        '```python exec="1" session="s"\nfrom attention import causal_mask\nx = 1\n```\n\n'
        '```python exec="1" source="block" session="s"\nprint(causal_mask(x), len([x]))\n```\n'
    )
    assert hidden_names(page) == ["block 2 uses 'causal_mask'", "block 2 uses 'x'"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_executed_blocks_are_short(page: Path) -> None:
    """Pages demonstrate; code longer than a screenful belongs in the package."""
    long = [
        f"block {number}: {match['code'].count(chr(10))} lines"
        for number, match in enumerate(BLOCK.finditer(page.read_text(encoding="utf-8")), 1)
        if match["code"].count("\n") > 25
    ]
    assert long == []


COLUMN = 82
"""Characters of code a page's column shows at 1280 px: a longer line scrolls sideways."""

FENCE = re.compile(
    r"^(?P<indent> *)```python(?P<options>[^\n]*)\n(?P<code>.*?)^(?P=indent)```$", re.M | re.S
)


def long_shown_lines(page: Path, limit: int = COLUMN) -> list[str]:
    """`path:line: N characters` for each shown code line longer than `limit`: the lines of
    plain python blocks and of executed blocks with `source=`. A hidden block's code (exec
    without `source=`) and every block's output are not checked."""
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    long = []
    for match in FENCE.finditer(text):
        if 'exec="1"' in match["options"] and "source=" not in match["options"]:
            continue
        first = text.count("\n", 0, match.start("code")) + 1
        for number, line in enumerate(match["code"].splitlines(), first):
            width = len(line.removeprefix(match["indent"]))
            if width > limit:
                long.append(f"{name}:{number}: {width} characters")
    return long


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_shown_code_lines_fit_the_column(page: Path) -> None:
    """Shown code is wrapped to the column (brackets, shorter names, split statements), so
    that no line hides its end past the edge; hidden code and printed output may be wider."""
    assert long_shown_lines(page) == []


NOTEBOOKS = sorted((ROOT / "docs" / "exercises").glob("*.py"))
NOTEBOOK_COLUMN = tomllib.loads((ROOT / "docs/exercises/ruff.toml").read_text())["line-length"]
"""The same column in a notebook, less the margins of a solution's box (what ruff formats
the notebooks to)."""


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_lines_fit_the_column(notebook: Path) -> None:
    """The exercises' code cells fit the column, solutions included (their ruff.toml formats
    them to it; a comment or a string it cannot wrap is caught here)."""
    jupytext = pytest.importorskip("jupytext")
    code = [c.source for c in jupytext.read(notebook).cells if c.cell_type == "code"]
    long = [line for src in code for line in src.splitlines() if len(line) > NOTEBOOK_COLUMN]
    assert long == []


def test_the_width_check_skips_hidden_code_and_counts_from_the_fence(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    wide = "x = " + "1 + " * 19 + "1.0"  # 83 characters, one more than the column
    page.write_text(
        f'Text {wide}\n\n```python exec="1" session="s"\n{wide}\n```\n\n'
        f'```python exec="1" source="block" result="text" session="s"\nx = 1\n{wide}\n```\n\n'
        f"!!! note\n    ```python\n    {wide[:82]}\n    {wide}\n    ```\n"
    )
    assert long_shown_lines(page) == ["page.md:9: 83 characters", "page.md:15: 83 characters"]


def test_no_control_characters_in_pages_or_docstrings() -> None:
    """A `\\t` or `\\b` written through a non-raw string turns `\\text` or `\\big` into a tab or a
    backspace: MathJax then shows an input error that the strict build does not catch."""
    sources = [*PAGES, *sorted((ROOT / "attention").glob("*.py"))]
    bad = {
        str(p.relative_to(ROOT)): n
        for p in sources
        for n, line in enumerate(p.read_text().splitlines(), start=1)
        if any(c in line for c in "\x07\x08\x0b\x0c\t")
    }
    assert bad == {}


def chapters() -> list[str]:
    """The chapter pages in the nav's order (the nav's chapter sections of mkdocs.yml)."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    sections = nav.split("  - performance.md", 1)[0]
    return re.findall(r"^      - ([\w-]+\.md)$", sections, re.M)


def test_chapters_are_numbered_in_the_navs_order_and_each_points_to_the_next() -> None:
    """Titles `# 1.` to `# 20.` in the nav's order (the book's 16, then those beyond it); a
    chapter's "Next:" link goes to the chapter after it (the last to the Performance page);
    its exercise carries its number."""
    pages = chapters()
    assert pages[0] == "why-attention.md" and len(pages) == 20
    assert pages[16:] == ["latent.md", "tiles.md", "ring.md", "beyond-softmax.md"]
    following = [*pages[1:], "performance.md"]
    for number, (page, after) in enumerate(zip(pages, following, strict=True), start=1):
        text = (ROOT / "docs" / page).read_text()
        assert text.startswith(f"# {number}. "), page
        if "Next:" in text:
            target = re.search(r"\]\(([\w-]+\.md)[#)]", text.split("Next:")[-1])
            assert target and target[1] == after, (page, target and target[1], after)
        for exercise in re.findall(r"\[Exercise (\d+)\]\(exercises/(\d+)_", text):
            assert exercise == (str(number), f"{number:02d}"), (page, exercise)
