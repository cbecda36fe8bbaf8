"""The repository's shape: floors that import downwards, short functions, one job per module.

`attention` is four floors read bottom-up, derivation, layer, model, lab, over the checks
they share; each floor imports only the floors below it. The site's tooling (`attention_site`)
and the benchmark (`attention_bench`) sit beside it and import it, never the other way round,
and the wheel carries no plotting or docs code. Modules are split by job, not by line count; a
function that grows past a screen is split.
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
    sources = tracked(
        "attention/*.py", "attention_site/*.py", "attention_bench/*.py", "docs/hooks/*.py"
    )
    long = {
        name: n for p in sources for name, n in function_lengths(p).items()
        if n > MAX_FUNCTION_LINES
    }  # fmt: skip
    assert long == {}


def test_every_module_states_its_one_job() -> None:
    """Each module of the package opens with the job it does (its docstring's first line)."""
    for path in tracked("attention/*.py", "attention_site/*.py", "attention_bench/*.py"):
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


FLOORS = {"checks": 0, "derivation": 1, "layer": 2, "parallel": 2, "model": 3, "lab": 4}
"""`attention`'s floors, bottom-up: a module imports from its own floor and those below."""


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (relative imports resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def floor(module: str) -> int | None:
    """The floor of an `attention...` module name; None for anything else."""
    parts = module.split(".")
    if parts[0] != "attention" or len(parts) < 2:
        return None
    return FLOORS.get(parts[1])


def test_each_floor_imports_only_the_floors_below() -> None:
    upward = []
    for path in tracked("attention/*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts in {("attention", "__init__"), ("attention", "checks")}:
            continue  # the package's re-exports; the checks import no floor
        own = FLOORS[parts[1]]
        for name in imported(path):
            above = floor(name)
            if name.split(".")[0] in {"attention_site", "attention_bench"} or (
                above is not None and above > own
            ):
                upward.append(f"{path.relative_to(ROOT)} imports {name}")
    assert upward == []


def test_the_package_is_its_floors() -> None:
    """No module outside a floor: a new one says which floor it belongs to."""
    top = {p.name for p in (ROOT / "attention").glob("*.py")}
    assert top == {"__init__.py", "checks.py"}
    floors = {p.name for p in (ROOT / "attention").iterdir() if (p / "__init__.py").exists()}
    assert floors == set(FLOORS) - {"checks"}


def test_the_site_tooling_and_the_benchmark_stay_beside_the_library() -> None:
    """`attention_site` is not installed with the library; the benchmark measures without it."""
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in tracked("attention_bench/*.py", "attention/*.py")
        for name in imported(path)
        if name.split(".")[0] == "attention_site"
    ]
    assert wrong == []


def test_pip_install_without_extras_installs_no_plotting_or_docs_code() -> None:
    import tomllib

    from setuptools import find_packages

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = set(find_packages(str(ROOT), include=include))
    assert "attention" in packages and "attention.layer" in packages
    assert not {p for p in packages if p.startswith(("attention_site", "tests", "docs"))}
    assert set(pyproject["project"]["dependencies"]) == {"torch>=2.5", "tiktoken>=0.5"}
    drawing = {"matplotlib", "mkdocs", "mkdocs_gen_files", "markdown_exec", "playwright"}
    found = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in tracked("attention/*.py", "attention_bench/*.py")
        for name in imported(path)
        if name.split(".")[0] in drawing
    ]
    assert found == []
