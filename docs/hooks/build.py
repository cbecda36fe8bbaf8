"""MkDocs hooks: what no plugin does for this site (listed under `hooks:` in mkdocs.yml).

- a footer on every page stating what computed its outputs (`attention` and torch versions,
  the devices, the date), or, on a page that runs no code, what built it; a page that also
  shows stored results (front matter `stored:`, what they are) has them named as the exception;
- `<!-- pycon: README.md#quickstart -->`: the README's quickstart run like a console session
  (every `>>>` line echoes its value, which markdown-exec's `pycon` does not do); an example
  that raises fails the build, while whether the typed outputs still hold is pytest's call;
- MathJax served from the site itself, copied from the installed `django-static-mathjax`;
- the exercises: the `<!-- exercises -->` table, and each notebook's `.ipynb` and `.py`
  downloads linked at the top of its page.

mkdocs-jupyter executes and renders the notebooks; mkdocs-gen-files writes the API pages
(docs/gen_api.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import doctest
import importlib.util
import io
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.attention")

ROOT = Path(__file__).resolve().parents[2]
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts", "ui", "a11y")
"""What the site serves of MathJax's es5 build (the 4 MB speech-rule maps are left out)."""

_DIRECTIVE = re.compile(r"^<!-- pycon: (?P<path>[^#\s]+)#(?P<name>[\w-]+) -->$", re.MULTILINE)
_EXECUTED = re.compile(r"^ *```\w+ [^\n]*\bexec=\"(?:1|true|on)\"", re.MULTILINE)  # markdown-exec
_STAMPS: dict[bool, str] = {}  # does the page compute anything? -> its footer


def build_stamp(computed: bool = True, stored: str | None = None) -> str:
    """One line for the footer: what computed every output on the page (or built a page that
    `computed` nothing: no executed block, no console transcript, no notebook), except what
    `stored` names: outputs the page reads from files made before the build."""
    import torch

    import attention

    def describe(device: torch.device) -> str:
        if device.type == "cuda":
            return f"{device} ({torch.cuda.get_device_name(device)})"
        return str(device)

    # The pages' tensors live on torch's default device: report that, not a setting, so the
    # stamp cannot claim a GPU that computed nothing. Only the measurements follow the setting.
    pages = describe(torch.get_default_device())
    measured = describe(torch.device(os.environ.get("ATTENTION_DEVICE", "cpu")))
    devices = f"<code>{pages}</code>"
    if measured != pages:
        devices += f" (measurements on <code>{measured}</code>)"
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch else dt.datetime.now(dt.UTC)
    what = (
        "Every output on this page was computed while the site was built"
        if computed
        else ("This page runs no code; the site was built")
    )
    but = f", except {stored}" if stored and computed else ""
    return (
        f'<span class="build-stamp">{what} on {now:%Y-%m-%d}, by <code>attention</code> '
        f"{attention.__version__} with torch {torch.__version__} on {devices} (Python "
        f"{sys.version_info.major}.{sys.version_info.minor}){but}.</span>"
    )


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    _STAMPS.update({True: build_stamp(), False: build_stamp(computed=False)})
    config["copyright"] = _STAMPS[True]
    return config


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Note on the page the trainings its blocks read from disk (`attention_site.stored`)
    instead of computing them in this build: its footer names them."""
    from attention_site.runs import from_disk

    read = from_disk()
    if read and "stored" not in page.meta:
        names = ", ".join(f"<code>{name.rsplit('.', 1)[-1]}</code>" for name in read)
        trainings = "the training" if len(read) == 1 else "the trainings"
        page.meta["stored"] = (
            f"{trainings} {names}, read from the runs stored by an earlier build or test run "
            "of the same code, data and versions (<code>attention_site.stored</code>)"
        )
    return html


def on_page_context(context: Any, page: Page, config: MkDocsConfig, nav: Any) -> Any:
    stored = page.meta.get("stored")
    if stored:  # the page names what it did not compute: a stamp of its own
        config["copyright"] = build_stamp(page.meta.get("computed", True), str(stored))
    else:
        config["copyright"] = _STAMPS[page.meta.get("computed", True)]  # the footer reads it
    return context


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
        files.append(File(rel, src_dir=str(es5), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"],
                          dest_uri=f"assets/mathjax/{rel}"))  # fmt: skip
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
