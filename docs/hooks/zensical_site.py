"""The whole site under Zensical, which runs no MkDocs hooks: what they add, staged first.

`nox -s docs_zensical` runs `python docs/hooks/zensical_site.py [SITE_DIR]`. Zensical reads
`mkdocs.yml` and runs markdown-exec, mkdocstrings, literate-nav and autorefs itself, but not
mkdocs-gen-files, mkdocs-jupyter or hooks. So this script calls the hooks' own functions (one
source for each job) to write, into `build/zensical/docs/` (a copy of `docs/`):

- the API pages and their nav (`gen_api.api_pages`);
- the README's quickstart, the wheel's install text and contents, the exercises' table (the
  `<!-- ... -->` directives of `build.py`, `package.py` and `notebooks.py`);
- MathJax, the wheel and the sdist (`dist/`), each notebook executed (`notebooks.execute`)
  and rendered by mkdocs-jupyter's own converter into a Markdown page with its downloads;

then a `mkdocs.yml` without hooks, gen-files and mkdocs-jupyter, and builds it with Zensical in
this process, strictly: Zensical's own issues, and any warning Python code logs (a failing
markdown-exec block), fail the build, as `mkdocs build --strict` does. There the pages'
blocks publish the explorer's weights, written and checked in Chromium after the build
(`explorer.py`'s check). Each page's footer is worded as the MkDocs hook words it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

# The hooks' modules, by name: run as a script, this file's folder is first on sys.path.
build, explorer, gen_api, notebooks, package_hook, schedule, stamp = (
    importlib.import_module(name)
    for name in ("build", "explorer", "gen_api", "notebooks", "package", "schedule", "stamp")
)

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / "build" / "zensical"
LEFT_OUT = ("gen-files", "mkdocs-jupyter")  # plugins Zensical does not run: staged instead


def stage_docs(docs: Path) -> None:
    """`docs/` copied (without the hooks), the API pages written, MathJax beside them."""
    shutil.rmtree(docs.parent, ignore_errors=True)
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("hooks", "__pycache__"))
    for path, text in gen_api.api_pages().items():
        (docs / path).parent.mkdir(parents=True, exist_ok=True)
        (docs / path).write_text(text, encoding="utf-8")
    es5, rels = build.mathjax_files()
    for rel in rels:
        (docs / "assets" / "mathjax" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(es5 / rel, docs / "assets" / "mathjax" / rel)


def stage_package(docs: Path, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The wheel and sdist built into `docs/dist/`; the package hook's `Package` and facts."""
    wheel, sdist = package_hook.distribution_names(ROOT / "pyproject.toml")
    repository = package_hook.repository(os.environ)  # as the MkDocs hook resolves it
    package = package_hook.Package(wheel, sdist, config.get("site_url"), repository)
    out = docs / package_hook.DIST
    out.mkdir(parents=True)
    work = STAGE / "src"
    package_hook.copy_sources(work)
    subprocess.run(
        [sys.executable, "-c", package_hook.BUILD, str(out)],
        cwd=work,
        check=True,
        capture_output=True,
    )
    facts = {
        "contents": package_hook.check_wheel(out / wheel),
        "sizes": {p.name: p.stat().st_size for p in out.iterdir()},
    }
    return package, facts


def expand_directives(docs: Path, package: Any, facts: dict[str, Any]) -> None:
    """Every page's `<!-- pycon -->`, `<!-- package -->` and `<!-- exercises -->`, as the
    hooks expand them."""
    for page in docs.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        pycon, where = build.expand_pycon(text), str(page.relative_to(docs))
        new = package_hook.expand(pycon, package, facts["sizes"], facts["contents"], where)
        new = new.replace("<!-- exercises -->", notebooks.exercise_table(docs))
        if new != text:
            page.write_text(new, encoding="utf-8")


def stage_notebooks(docs: Path, package: Any) -> set[str]:
    """Each exercise executed and rendered as `exercises/NN.md`, its downloads in
    `exercises/NN/`; the `.py` source leaves the pages (Zensical would copy it as a file).
    Returns the notebooks (`exercises/NN.py`) whose outputs were read back (stored)."""
    from mkdocs_jupyter.nbconvert2 import nb2html

    executed = STAGE / "executed"
    executed.mkdir(parents=True)
    read_back: set[str] = set()
    for source in sorted((docs / "exercises").glob("*.py")):
        original = ROOT / "docs" / "exercises" / source.name
        install = notebooks.install_cell(package.as_extra(), draws=notebooks._draws(original))
        target = executed / f"{source.stem}.ipynb"
        if notebooks.execute(str(original), str(target), install):
            read_back.add(f"exercises/{source.name}")
        html = nb2html(str(target), custom_mathjax_url="")
        # after the notebook, the template prints a list of pygments' CSS as a Python repr
        # (harmless in a page's HTML, an indented code block to Markdown): the theme's is used
        html = html[: html.index("<!-- jupyter-wrapper -->") + len("<!-- jupyter-wrapper -->")]
        # the headings' pilcrow links: ids with an apostrophe, which Zensical's link check
        # cannot find (the page's table of contents links the headings anyway)
        html = re.sub(r'<a class="anchor-link" href="#[^"]*">¶</a>', "", html)
        html = re.sub(
            r'href="\.\./(?P<path>[\w-]+)\.md(?P<anchor>#[\w-]+)?"',
            lambda m: f'href="../../{m["path"]}/{m["anchor"] or ""}"',
            html,
        )
        downloads = docs / "exercises" / source.stem
        downloads.mkdir()
        notebooks.write_downloads(original, downloads, package.site_url, install)
        title = re.search(r"^# # (.+)$", original.read_text(encoding="utf-8"), re.MULTILINE)
        page = [
            "---",
            f"title: {json.dumps(title[1] if title else source.stem)}",
            "---",
            "",
            notebooks.download_links(source.stem, f"{source.stem}/"),
            "",
            notebooks.fold_solutions(html),
        ]
        (docs / "exercises" / f"{source.stem}.md").write_text("\n".join(page), encoding="utf-8")
        source.unlink()
    notebooks._stop_kernel()
    return read_back


def stage_config(config: dict[str, Any], site: Path) -> tuple[Path, str]:
    """`mkdocs.yml` for Zensical: the staged docs, no hooks, gen-files or mkdocs-jupyter; the
    exercises' pages as Markdown; the footer's stamp made here."""
    config = dict(config)
    config.pop("hooks", None)
    config["plugins"] = [p for p in config["plugins"] if _kept(p)]
    config["docs_dir"], config["site_dir"] = "docs", str(site)
    config["nav"] = _nav(config["nav"])
    config["copyright"] = stamp.build_stamp()  # each page's: stamp_pages
    path = STAGE / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path, config["copyright"]


def _kept(plugin: Any) -> bool:
    """Whether Zensical runs `plugin`, an entry of `plugins` (a name, or {name: options}): it is
    not one of LEFT_OUT."""
    if isinstance(plugin, dict):
        return not set(plugin) & set(LEFT_OUT)
    return plugin not in LEFT_OUT


def _nav(nav: Any) -> Any:
    """The nav with each exercise notebook `exercises/NN.py` as its page `exercises/NN.md`."""
    if isinstance(nav, list):
        return [_nav(item) for item in nav]
    if isinstance(nav, dict):
        return {key: _nav(value) for key, value in nav.items()}
    if isinstance(nav, str) and nav.startswith("exercises/") and nav.endswith(".py"):
        return nav.removesuffix(".py") + ".md"
    return nav


def stored_runs() -> dict[str, list[str]]:
    """Each page that asks for trainings (docs/hooks/schedule.py's list), with those of them
    stored on disk already (`module.name`): what it will read back instead of computing.
    Called before the build, which stores the others."""
    from attention_site.stored import is_stored

    stored: dict[str, list[str]] = {}
    for page, needed in schedule.runs().items():
        names = [f"{f.__module__}.{f.__qualname__}" for f, kwargs in needed if is_stored(f, kwargs)]
        if names:
            stored[page] = list(dict.fromkeys(names))
    return stored


def stamp_pages(
    site: Path,
    docs: Path,
    default: str,
    package: Any,
    runs: dict[str, list[str]],
    read_back: set[str],
) -> None:
    """Each page's footer as docs/hooks/stamp.py words it: a page that runs no code says so,
    a page with stored results (front matter `stored:`, else the trainings it read back:
    `runs`, from `stored_runs`) names them, and a notebook whose outputs were `read_back`
    (`exercises/NN.py`, from `stage_notebooks`) says so; and as docs/hooks/package.py links
    it, to the page's source."""
    for page in docs.rglob("*.md"):
        rel = page.relative_to(docs)
        original = ROOT / "docs" / rel
        source = (original if original.exists() else page).read_text(encoding="utf-8")
        notebook = (ROOT / "docs" / rel.with_suffix(".py")).exists()
        computed = build.computes(source, notebook)
        meta = re.match(r"---\n(.*?)\n---\n", source, re.DOTALL)
        stored = yaml.safe_load(meta[1]).get("stored") if meta else None
        if not stored and rel.as_posix() in runs:
            stored = stamp.read_back(runs[rel.as_posix()])
        folder = rel.parent if rel.stem == "index" else rel.with_suffix("")
        html = site / folder / "index.html"
        if not html.exists():
            continue
        text = html.read_text(encoding="utf-8")
        src_uri = (rel.with_suffix(".py") if notebook else rel).as_posix()  # as MkDocs names it
        footer = stamp.build_stamp(computed, str(stored) if stored else None, src_uri in read_back)
        footer += package_hook.page_source(package, src_uri)
        html.write_text(text.replace(default, footer), encoding="utf-8")


def main(site: Path) -> None:
    import zensical

    start = time.perf_counter()
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)
    docs = STAGE / "docs"
    stage_docs(docs)
    package, facts = stage_package(docs, config)
    expand_directives(docs, package, facts)
    read_back = stage_notebooks(docs, package)
    path, default = stage_config(config, STAGE / "site")  # inside the project's folder
    runs = stored_runs()  # before the build stores the others
    staged = time.perf_counter()
    print(f"staged in {staged - start:.1f} s; building with Zensical", flush=True)
    warnings = _Warnings()  # Zensical's strict mode misses what Python code logs
    logging.getLogger().addHandler(warnings)
    try:
        zensical.build(str(path), {"clean": True, "strict": True})
    finally:
        logging.getLogger().removeHandler(warnings)
    if warnings.records:  # a failing block (markdown-exec), a bad docstring (mkdocstrings)
        raise SystemExit(
            "the build logged warnings (strict, as `mkdocs build --strict`):\n"
            + "\n".join(warnings.records)
        )
    shutil.rmtree(site, ignore_errors=True)
    shutil.move(STAGE / "site", site)
    stamp_pages(site, docs, default, package, runs, read_back)
    from attention_site.explorer import published

    count = len(published())
    check = explorer.publish(site.resolve(), ROOT / "docs" / "javascripts" / "model.js")
    if check is not None:
        check.result()  # the explorers' weights, checked in Chromium
    print(f"explorer: {count} models written and checked in Chromium", flush=True)
    pages = len(list(site.rglob("index.html")))
    print(
        f"Zensical: {pages} pages in {time.perf_counter() - start:.1f} s "
        f"({time.perf_counter() - staged:.1f} s of it Zensical's)",
        flush=True,
    )


class _Warnings(logging.Handler):
    """Every warning Python code logs during the build (MkDocs' `--strict` fails on them)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()[:2000]}")


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # yaml: no stubs
    """mkdocs.yml's `!ENV` and `!!python/name:` tags, kept as written."""


_Loader.add_constructor(  # !ENV [NAME, default]
    "!ENV", lambda loader, node: os.environ.get(*loader.construct_sequence(node))
)
_Loader.add_multi_constructor(
    "tag:yaml.org,2002:python/", lambda loader, suffix, node: f"!!python/{suffix}"
)

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # attention_site, as under MkDocs (paths: [.])
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "site-zensical")
