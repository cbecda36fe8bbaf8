"""The repository's shape: short functions, one job per module, nothing imported by file path.

Modules are split by job, not by line count; a function that grows past a screen is split.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked(*patterns: str) -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / line for line in out.splitlines()]


MAX_FUNCTION_LINES = 50
"""The longest function or method body in the package and the docs hooks, docstring aside."""


def function_lengths(path: Path) -> dict[str, int]:
    """Lines of each function's body (without its docstring), by `path:line name`."""
    lengths = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            if body:
                name = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                lengths[name] = (body[-1].end_lineno or 0) - body[0].lineno + 1
    return lengths


def test_functions_are_short() -> None:
    """Split by job, not by size: a function does one thing and reads in one screen."""
    sources = [p for p in tracked("attention/*.py", "docs/hooks/*.py")]
    long = {
        name: n for p in sources for name, n in function_lengths(p).items()
        if n > MAX_FUNCTION_LINES
    }  # fmt: skip
    assert long == {}


def test_every_module_states_its_one_job() -> None:
    """Each module of the package opens with the job it does (its docstring's first line)."""
    for path in tracked("attention/*.py", "attention_bench/*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, path


def test_the_docs_hooks_stay_small() -> None:
    assert len((ROOT / "docs/hooks/build.py").read_text().splitlines()) <= 200


def test_nothing_is_loaded_by_file_path() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in tracked("*.py", "*.md")
        if p.name != "test_layout.py" and "spec_from_file_location" in p.read_text()
    ]
    assert offenders == []


def test_the_distribution_has_a_name_of_its_own() -> None:
    """`attention` on PyPI is an unrelated Keras package that installs a module `attention`
    too: this one is distributed as `literate-attention` and imported as `attention`, and the
    README says so where it tells how to install it."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "literate-attention"
    readme = (ROOT / "README.md").read_text()
    assert "`literate-attention`" in readme and "the import is `import attention`" in readme
