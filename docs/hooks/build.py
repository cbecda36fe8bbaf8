"""MkDocs hooks for the attention site (listed under `hooks:` in mkdocs.yml).

What they add to a plain mkdocs-material build:

- a footer on every page stating what computed the outputs: `attention` and torch versions,
  the device the pages' tensors were on (torch's default device) and the build date;
- `<!-- pycon: README.md#quickstart -->` in a page: the README's quickstart, executed like an
  interactive session (every `>>>` line echoes its value, which markdown-exec's `pycon` does
  not do) and shown with today's outputs; the build fails if an example raises. Whether the
  README's typed outputs still hold is pytest's to decide (`nox -s tests`, as for every
  docstring example): one runner, so the build and the tests cannot disagree;
- MathJax served from the site itself (`assets/mathjax/`), copied from the installed
  `django-static-mathjax` wheel, so formulas render with the network off;
- every exercise notebook (`docs/exercises/*.py`, jupytext percent format) in the nav and in
  the table that replaces `<!-- exercises -->`, downloadable as `.ipynb` and as its `.py`
  source, with links at the top of its page;
- a check that every public module of `attention` has an API page;
- the exercise notebooks executed and rendered by mkdocs-jupyter in two worker processes from
  the start of the build, concurrently with the pages (each in its own fresh kernel, nothing
  cached between builds), instead of one after another at the end: on two cores this takes
  most of their time off the build. `ATTENTION_DOCS_SERIAL_NOTEBOOKS=1` turns this off (then
  mkdocs-jupyter runs each notebook when it renders its page, as it does on its own).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import doctest
import importlib
import importlib.util
import io
import logging
import multiprocessing
import os
import pkgutil
import re
import shutil
import sys
import tempfile
import types
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.attention")

ROOT = Path(__file__).resolve().parents[2]
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts", "ui", "a11y")
"""What the site serves of MathJax's es5 build (the 4 MB speech-rule maps are left out)."""

_DIRECTIVE = re.compile(r"^<!-- pycon: (?P<path>[^#\s]+)#(?P<name>[\w-]+) -->$", re.MULTILINE)
_kernel_dir: Path | None = None
_pool: ProcessPoolExecutor | None = None
_notebooks: dict[str, Future[str]] = {}


# ---------------------------------------------------------------------------- config
def _build_stamp() -> str:
    """One line for the footer: what computed every output on the page."""
    import torch

    import attention

    # The pages' tensors live on torch's default device: report that, not a setting, so the
    # stamp cannot claim a GPU that computed nothing.
    default = torch.get_default_device()
    device = str(default)
    if default.type == "cuda":
        device = f"{device} ({torch.cuda.get_device_name(default)})"
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch else dt.datetime.now(dt.UTC)
    return (
        f'<span class="build-stamp">Every output on this page was computed while the site was '
        f"built on {now:%Y-%m-%d}, by <code>attention</code> {attention.__version__} with "
        f"torch {torch.__version__} on <code>{device}</code> (Python "
        f"{sys.version_info.major}.{sys.version_info.minor}).</span>"
    )


def _check_api_pages(docs_dir: Path) -> None:
    """Warn (which fails the strict build) for a public module without its API page."""
    import attention

    for module in pkgutil.iter_modules(attention.__path__):
        page = docs_dir / "api" / f"{module.name}.md"
        if module.name.startswith("_"):
            continue
        if not page.is_file() or f"::: attention.{module.name}" not in page.read_text():
            log.warning("attention.%s has no API page: add %s", module.name, page)


def _exercise_notebooks(docs_dir: Path) -> list[str]:
    return sorted(p.relative_to(docs_dir).as_posix() for p in (docs_dir / "exercises").glob("*.py"))


def _add_exercises_to_nav(config: Any) -> None:
    """Append every `exercises/*.py` notebook missing from the nav's "Exercises" section."""
    for item in config["nav"] or []:
        if isinstance(item, dict) and isinstance(item.get("Exercises"), list):
            section = item["Exercises"]
            listed = {next(iter(e.values())) if isinstance(e, dict) else e for e in section}
            section.extend(
                nb for nb in _exercise_notebooks(Path(config["docs_dir"])) if nb not in listed
            )


def _kernels_over_ipc() -> None:
    """Run the notebooks' kernels over local IPC sockets instead of TCP on loopback.

    ipykernel warns about every unencrypted TCP kernel; mkdocs-jupyter reads nbconvert's
    config from JUPYTER_CONFIG_PATH, so a config written to a private temporary directory
    moves this build's kernels (and their socket files) there, one prefix per process (the
    notebook workers pick socket numbers independently).
    """
    global _kernel_dir
    tmp = _kernel_dir = Path(tempfile.mkdtemp(prefix="attention-kernels-"))
    (tmp / "jupyter_nbconvert_config.py").write_text(
        "import os\n"
        'c.KernelManager.transport = "ipc"\n'
        f"c.KernelManager.ip = {str(tmp)!r} + f'/kernel-{{os.getpid()}}'\n"
    )
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # also after Ctrl-C in `serve`
    paths = [str(tmp), *filter(None, os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep))]
    os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(paths)


def on_config(config: Any) -> Any:
    config["copyright"] = _build_stamp()
    _check_api_pages(Path(config["docs_dir"]))
    _add_exercises_to_nav(config)
    _kernels_over_ipc()
    return config


def _cleanup() -> None:
    global _kernel_dir, _pool
    if _pool is not None:
        _pool.shutdown(cancel_futures=True)
        _pool = None
    _notebooks.clear()
    if _kernel_dir is not None:
        shutil.rmtree(_kernel_dir, ignore_errors=True)
        _kernel_dir = None


def on_build_error(error: Exception) -> None:
    _cleanup()


def on_post_build(config: Any) -> None:
    _cleanup()


# ---------------------------------------------------------------------------- MathJax
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


def _start_notebooks(files: Files, config: Any) -> None:
    """Submit every notebook page to mkdocs-jupyter's own `nb2html`, in 2 worker processes.

    The arguments are the ones mkdocs-jupyter's `on_pre_page` passes for that page; the
    workers are fresh interpreters (spawn), so each conversion has its own module state.
    """
    global _pool
    plugin = config["plugins"].get("mkdocs-jupyter")
    if plugin is None or os.environ.get("ATTENTION_DOCS_SERIAL_NOTEBOOKS"):
        return
    from mkdocs_jupyter import convert

    pc = plugin.config
    pages = [f for f in files if f.is_documentation_page() and plugin.should_include(f)]
    if not pages:
        return
    _pool = ProcessPoolExecutor(
        max_workers=2,
        mp_context=multiprocessing.get_context("spawn"),
        # mkdocs_jupyter.convert patches nbconvert's heading ids on import, as in this process
        initializer=importlib.import_module,
        initargs=("mkdocs_jupyter.convert",),
    )
    for file in pages:
        execute = pc["execute"] and not any(
            Path(file.abs_src_path).match(pattern) for pattern in pc["execute_ignore"]
        )
        _notebooks[file.src_uri] = _pool.submit(
            convert.nb2html,
            file.abs_src_path,
            execute=execute,
            kernel_name=pc["kernel_name"],
            theme=pc["theme"],
            allow_errors=pc["allow_errors"],
            show_input=pc["show_input"],
            no_input=pc["no_input"],
            no_prompt=pc["no_prompt"],
            remove_tag_config=pc["remove_tag_config"],
            highlight_extra_classes=pc["highlight_extra_classes"],
            include_requirejs=pc["include_requirejs"],
            custom_mathjax_url=pc["custom_mathjax_url"],
        )


def on_pre_page(page: Any, config: Any, files: Files) -> Any:
    """Render a notebook page from its worker's result (mkdocs-jupyter has set `page.render`)."""
    future = _notebooks.pop(page.file.src_uri, None)
    if future is None:
        return page
    from mkdocs.structure.toc import get_toc
    from mkdocs_jupyter.plugin import _get_nb_toc_tokens
    from nbclient.exceptions import CellExecutionError

    pc = config["plugins"]["mkdocs-jupyter"].config
    inline_render = page.render

    def render(self: Any, config: Any, files: Files) -> None:
        try:
            body = future.result()
        except CellExecutionError as error:  # allow_errors: false, and a cell raised
            raise PluginError(f"notebook {self.file.src_uri} failed:\n{error}") from error
        except Exception as error:  # the worker itself: render in-line, as without this hook
            log.info("%s: worker failed (%r); rendering in-line", self.file.src_uri, error)
            inline_render(config, files)
            return
        log.info("Rendered notebook (executed in a worker): %s", self.file.src_uri)
        self.content = body
        toc_tokens, title = _get_nb_toc_tokens(self.file.abs_src_path, pc["toc_depth"])
        self.toc = get_toc(toc_tokens)
        if title is not None and not pc["ignore_h1_titles"]:
            self.title = title

    page.render = types.MethodType(render, page)
    return page


def on_files(files: Files, config: Any) -> Files:
    _start_notebooks(files, config)
    es5 = _mathjax_dir()
    for part in MATHJAX_PARTS:
        paths = [es5 / part] if (es5 / part).is_file() else sorted((es5 / part).rglob("*"))
        for path in paths:
            if path.is_file():
                rel = path.relative_to(es5).as_posix()
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


# ---------------------------------------------------------------------------- pycon
class _AnyOutput(doctest.OutputChecker):
    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return True


class _Recorder(doctest.DocTestRunner):
    """A doctest runner that keeps what each example really printed.

    It shows, it does not judge: any output is accepted here. pytest (with the `NUMBER`
    option) alone decides whether the README's typed outputs still hold.
    """

    def __init__(self) -> None:
        super().__init__(checker=_AnyOutput())
        self.got: list[str] = []
        self.problems: list[str] = []

    def report_success(self, out: Any, test: Any, example: Any, got: str) -> None:
        self.got.append(got)

    def report_unexpected_exception(self, out: Any, test: Any, example: Any, exc_info: Any) -> None:
        self.got.append("")
        self.problems.append(f"{example.source.strip()}\n  raised {exc_info[1]!r}")


def _section(path: Path, name: str) -> str:
    """The text between `<!-- NAME:start -->` and `<!-- NAME:end -->` in `path`."""
    text = path.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, re.DOTALL)
    if match is None:
        raise PluginError(f"no <!-- {name}:start --> ... <!-- {name}:end --> section in {path}")
    return match.group(1)


def run_pycon(source: str, name: str) -> str:
    """Run the `>>>` examples of `source` like a console; return a pycon block of today's output.

    An example that raises is logged as a warning, which fails the strict build. What the
    examples print is shown as it is today, whatever `source` typed (pytest checks that).
    """
    import torch

    test = doctest.DocTestParser().get_doctest(source, {}, name, name, 0)
    runner = _Recorder()
    with torch.random.fork_rng(), contextlib.redirect_stdout(io.StringIO()):
        runner.run(test, clear_globs=True)
    if runner.problems:
        problems = "\n".join(runner.problems)
        log.warning("%s: an example raised:\n%s", name, problems)
    lines = []
    for example, got in zip(test.examples, runner.got, strict=True):
        source = re.sub(r"\s*# doctest:.*$", "", example.source.rstrip("\n"), flags=re.MULTILINE)
        source_lines = source.split("\n")
        lines.append(">>> " + source_lines[0])
        lines.extend("... " + line for line in source_lines[1:])
        if got:
            lines.append(got.rstrip("\n"))
    return "```pycon\n" + "\n".join(lines) + "\n```"


def _exercise_table(docs_dir: Path) -> str:
    """A table of the exercise notebooks: file and title (the notebook's first heading)."""
    rows = ["| Notebook | Exercise |", "| --- | --- |"]
    for nb in _exercise_notebooks(docs_dir):
        text = (docs_dir / nb).read_text(encoding="utf-8")
        title = re.search(r"^# # (.+)$", text, re.MULTILINE)
        name = Path(nb).stem
        rows.append(f"| `{name}` | [{title[1] if title else name}]({Path(nb).name}) |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def replace(match: re.Match[str]) -> str:
        path = ROOT / match["path"]
        return run_pycon(_section(path, match["name"]), f"{match['path']}#{match['name']}")

    markdown = _DIRECTIVE.sub(replace, markdown)
    if "<!-- exercises -->" in markdown:
        markdown = markdown.replace("<!-- exercises -->", _exercise_table(Path(config["docs_dir"])))
    return markdown


# ---------------------------------------------------------------------------- notebooks
def _is_notebook(page: Any) -> bool:
    src = page.file.src_uri
    return src.startswith("exercises/") and src.endswith(".py")


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    if not _is_notebook(page):
        return html
    import jupytext

    source = Path(page.file.abs_src_path)
    target = Path(page.file.abs_dest_path).parent
    target.mkdir(parents=True, exist_ok=True)
    jupytext.write(jupytext.read(source), target / f"{source.stem}.ipynb")
    links = (
        f'<p class="notebook-downloads">Download this exercise: '
        f'<a href="{source.stem}.ipynb" download>{source.stem}.ipynb</a> (Jupyter) or '
        f'<a href="{source.name}" download>{source.name}</a> (jupytext percent format). '
        f"The outputs below were computed while the site was built.</p>"
    )
    return links + html
