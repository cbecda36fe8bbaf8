"""The API reference, generated: one page per public module, an index, and the nav.

Run by mkdocs-gen-files at every build (mkdocs.yml), as in mkdocstrings' own recipe; the nav
is `api/SUMMARY.md`, read by mkdocs-literate-nav. Zensical's build writes the same pages
(`api_pages`, docs/hooks/zensical_site.py). A new module gets its page with no docs
edit: the packages' module lists are the only source.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

import mkdocs_gen_files
from mkdocs_gen_files.nav import Nav

PACKAGES = {
    "attention": "The library, in four floors read bottom-up like the site; each imports only "
    "the floors below it.",
    "attention_site": "The site's tooling, in the repository only (not installed with the "
    "library): figures, diagrams, listings, runs, the explorer, what pages and tests share.",
    "attention_bench": "The benchmark harness behind the Performance page.",
}


def modules(package: ModuleType) -> list[str]:
    """Public submodules and subpackages, in the order the package's docstring names them."""
    names = [m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")]
    doc = package.__doc__ or ""
    position = {name: doc.find(f"{package.__name__}.{name}]") for name in names}
    return sorted(names, key=lambda n: (position[n] < 0, position[n], n))


def document(
    full: str, nav: Nav, nav_key: tuple[str, ...], index: list[str], pages: dict[str, str]
) -> None:
    """A page for module `full` (a floor's page lists its modules, then each gets its own)."""
    module = importlib.import_module(full)
    index.append(f"| [`{full}`]({full}.md) | {summary(module)} |")
    nav[nav_key] = f"{full}.md"
    page = f"::: {full}\n    options:\n      heading_level: 1\n"
    if hasattr(module, "__path__") or gathers_only(module):  # its docstring lists the modules
        page += "      members: false\n"
    path = full.replace(".", "/") + ("/__init__.py" if hasattr(module, "__path__") else ".py")
    pages[f"api/{full}.md"] = f"{page}\n<!-- package: source-of {path} -->\n"  # package.py
    for name in modules(module) if hasattr(module, "__path__") else []:
        document(f"{full}.{name}", nav, (*nav_key, f"{full}.{name}"), index, pages)


def gathers_only(module: ModuleType) -> bool:
    """Whether a module only re-exports functions and classes of other modules (as
    `attention.model.checkpoints` does): its page is its docstring, their docs stay on theirs."""
    exported = [getattr(module, name) for name in getattr(module, "__all__", ())]
    defined = [obj for obj in exported if callable(obj) and hasattr(obj, "__module__")]
    return bool(defined) and all(obj.__module__ != module.__name__ for obj in defined)


def summary(module: ModuleType) -> str:
    """The first sentence of a module's docstring, on one line, for the index table."""
    first = (module.__doc__ or "").strip().split("\n\n")[0]
    return re.sub(r"\s+", " ", first).replace("|", "\\|")


INTRO = [
    "# API reference",
    "",
    "Every public name, rendered from its docstring. The package reads bottom-up like the "
    "derivation, and so does this reference.",
    "",
    '!!! info "Every example on these pages is a test"',
    "    Each `>>>` example below is run as a doctest by `nox -s tests`, which fails if any",
    "    printed output differs from what is shown here (a printed float to the precision it",
    "    is written with). CI runs it on every change, so what you read is what the code prints.",
]


def api_pages() -> dict[str, str]:
    """Every API page by its path under docs/: the modules', `api/index.md`, `api/SUMMARY.md`."""
    nav, index, pages = Nav(), list(INTRO), dict[str, str]()
    nav["Overview"] = "index.md"
    for package_name, about in PACKAGES.items():
        package = importlib.import_module(package_name)
        index += [
            "",
            f"## `{package_name}`",
            "",
            about,
            "",
            "| Module | What it holds |",
            "| --- | --- |",
        ]
        for name in modules(package):
            full = f"{package_name}.{name}"
            document(full, nav, (full,), index, pages)
    index += ["", "## The top-level packages"]
    for package_name in PACKAGES:
        index += ["", f"::: {package_name}", "    options:", "      members: false"]
    pages["api/index.md"] = "\n".join(index) + "\n"
    pages["api/SUMMARY.md"] = "".join(nav.build_literate_nav())
    return pages


if __name__ == "<run_path>":  # run by mkdocs-gen-files (mkdocs.yml); Zensical: zensical_site.py
    for path, text in api_pages().items():
        with mkdocs_gen_files.open(path, "w") as page:
            page.write(text)
