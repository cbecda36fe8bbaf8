"""MkDocs hooks: what no plugin does for this site (listed under `hooks:` in mkdocs.yml).

- whether a page computes anything (`page.meta["computed"]`, for docs/hooks/stamp.py's
  footer);
- `<!-- pycon: README.md#quickstart -->`: the README's quickstart run like a console session
  (every `>>>` line echoes its value, which markdown-exec's `pycon` does not do); an example
  that raises fails the build, while whether the typed outputs still hold is pytest's call;
- MathJax served from the site itself, copied from the installed `django-static-mathjax`;
- the exercises: the `<!-- exercises -->` table, and each notebook's `.ipynb` and `.py`
  downloads linked at the top of its page;
- figures and the API pages' source listings kept out of the search index: each is set aside
  before the search plugin reads the page and put back in the written HTML. A figure's tick
  labels and tooltips ("the -> cat: 0.12") are no words to search for, and a function's source
  would answer a search with its implementation rather than its documentation; parsing them
  took the search plugin about 5 s of the build (2026-11-29).

mkdocs-jupyter executes and renders the notebooks; mkdocs-gen-files writes the API pages
(docs/gen_api.py).
"""

from __future__ import annotations

import contextlib
import doctest
import importlib.util
import io
import logging
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.attention")

ROOT = Path(__file__).resolve().parents[2]
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts", "ui", "a11y")
"""What the site serves of MathJax's es5 build (the 4 MB speech-rule maps are left out)."""

_DIRECTIVE = re.compile(r"^<!-- pycon: (?P<path>[^#\s]+)#(?P<name>[\w-]+) -->$", re.MULTILINE)
_UNSEARCHED = re.compile(
    r"<svg\b[^>]*(?<!/)>.*?</svg>"  # a figure (not a self-closing <svg/>)
    r'|<details class="mkdocstrings-source">.*?</details>',  # "Source code in ..."
    re.DOTALL,
)
_SET_ASIDE = re.compile(r"<!-- set aside (\d+) -->")
_set_aside: dict[str, list[str]] = {}
"""What was set aside from each page (by its source path) until its HTML is written."""
_EXECUTED = re.compile(r"^ *```\w+ [^\n]*\bexec=\"(?:1|true|on)\"", re.MULTILINE)  # markdown-exec


def _mathjax_dir() -> Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or spec.origin is None:
        raise PluginError(
            "MathJax is not installed: `pip install -e .[docs]` installs it "
            "(package django-static-mathjax)"
        )
    es5 = Path(spec.origin).parent / "static" / "mathjax" / "es5"
    if not (es5 / "tex-chtml.js").is_file():
        raise PluginError(f"no MathJax es5 build in {es5}")
    return es5


def mathjax_files() -> tuple[Path, list[str]]:
    """MathJax's es5 folder, and the files the site serves from it (`assets/mathjax/...`)."""
    es5 = _mathjax_dir()
    rels = []
    for part in MATHJAX_PARTS:
        paths = [es5 / part] if (es5 / part).is_file() else sorted((es5 / part).rglob("*"))
        rels += [path.relative_to(es5).as_posix() for path in filter(Path.is_file, paths)]
    return es5, rels


def on_files(files: Files, config: MkDocsConfig) -> Files:
    es5, rels = mathjax_files()
    for rel in rels:
        files.append(
            File(
                rel,
                src_dir=str(es5),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
                dest_uri=f"assets/mathjax/{rel}",
            )
        )
    return files


class _AnyOutput(doctest.OutputChecker):
    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return True  # record, do not judge: pytest (NUMBER) decides whether outputs hold


class _Recorder(doctest.DocTestRunner):
    """A doctest runner that keeps what each example printed, and which ones raised."""

    def __init__(self) -> None:
        super().__init__(checker=_AnyOutput())
        self.got: list[str] = []
        self.problems: list[str] = []

    def report_success(self, out: Any, test: Any, example: Any, got: str) -> None:
        self.got.append(got)

    def report_unexpected_exception(self, out: Any, test: Any, example: Any, exc_info: Any) -> None:
        self.got.append("")
        self.problems.append(f"{example.source.strip()}\n  raised {exc_info[1]!r}")


def section(path: Path, name: str) -> str:
    """The text between `<!-- NAME:start -->` and `<!-- NAME:end -->` in `path`."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, re.DOTALL)
    if match is None:
        raise PluginError(f"no <!-- {name}:start --> ... <!-- {name}:end --> section in {path}")
    return match.group(1)


def run_pycon(source: str, name: str) -> str:
    """Run the `>>>` examples of `source` like a console; return a pycon block of today's output.

    An example that raises is logged as a warning, which fails the strict build.
    """
    import torch

    test = doctest.DocTestParser().get_doctest(source, {}, name, name, 0)
    runner = _Recorder()
    with torch.random.fork_rng(), contextlib.redirect_stdout(io.StringIO()):
        runner.run(test, clear_globs=True)
    if runner.problems:
        log.warning("%s: an example raised:\n%s", name, "\n".join(runner.problems))
    lines = []
    for example, got in zip(test.examples, runner.got, strict=True):
        code = re.sub(r"\s*# doctest:.*$", "", example.source.rstrip("\n"), flags=re.MULTILINE)
        first, *rest = code.split("\n")
        lines += [">>> " + first, *("... " + line for line in rest)]
        if got:
            lines.append(got.rstrip("\n"))
    return "```pycon\n" + "\n".join(lines) + "\n```"


def computes(markdown: str, notebook: bool = False) -> bool:
    """Does a page compute anything (an executed block, a console transcript, a notebook)?"""
    return notebook or bool(_EXECUTED.search(markdown) or _DIRECTIVE.search(markdown))


def expand_pycon(markdown: str) -> str:
    """Each `<!-- pycon: PATH#NAME -->` replaced by that section run as a console session."""

    def replace(match: re.Match[str]) -> str:
        where = f"{match['path']}#{match['name']}"
        return run_pycon(section(ROOT / match["path"], match["name"]), where)

    return _DIRECTIVE.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    notebook = page.file.src_uri.endswith((".py", ".ipynb"))  # executed by notebooks.py
    page.meta["computed"] = computes(markdown, notebook)
    return expand_pycon(markdown)


@event_priority(100)  # before the search plugin reads page.content
def on_page_context(context: Any, page: Page, config: MkDocsConfig, nav: Any) -> Any:
    """Set the page's figures and source listings aside: the search plugin indexes the rest."""
    kept = _set_aside[page.file.src_uri] = []

    def set_aside(match: re.Match[str]) -> str:
        kept.append(match[0])
        return f"<!-- set aside {len(kept) - 1} -->"

    page.content = _UNSEARCHED.sub(set_aside, page.content or "")
    return context


@event_priority(100)  # before any other hook reads the written HTML
def on_post_page(output: str, page: Page, config: MkDocsConfig) -> str:
    """Put back what on_page_context set aside, where it was."""
    kept = _set_aside.pop(page.file.src_uri, [])
    return _SET_ASIDE.sub(lambda match: kept[int(match[1])], output)
