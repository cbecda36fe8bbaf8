"""MkDocs hooks for the exercise notebooks (`docs/exercises/*.py`, jupytext percent format).

Each notebook is executed from the start of the build, one after another in the background
while the chapters build, in one kernel (its own process, one thread) reset to a fresh
kernel's state before each; mkdocs-jupyter then renders the executed copy (`execute: false` in
mkdocs.yml: it finds the outputs there). A cell that raises fails the build. The executed
copies are stored like the trainings, keyed by everything that decides them (`execute`): a
later build with the same notebook, code and versions reads them back, and the page's footer
says so. A code cell that
starts with `# Solution` is a solution: on the page it is folded into a `<details>` under its
question. Above each notebook's page go its downloads, all made from the one `.py`: the
`.ipynb` (without outputs), the `.ipynb` with every solution replaced by `# your code here`,
and the `.py`. `<!-- exercises -->` in a page becomes the table of all of them. Links to
chapters (`[title](../page.md)`) point to the page on the site, and in the downloads to
`site_url` (mkdocs.yml) or, without one, become the bare title.

Every notebook, on its page and in its downloads, opens with the install cell
(`install_cell`): on a fresh Jupyter or Colab it installs torch (the CPU build, where there is
none) and the site's wheel (docs/hooks/package.py builds it: its URL when the build knows the
site's, else the file saved next to the notebook), and matplotlib for a notebook that draws.
Where `attention` already imports, as in this build's kernel, it does nothing: the outputs on
the site come from the checkout, never from a download.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import jinja2
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

from attention_site.runs import in_turn

log = logging.getLogger("mkdocs.hooks.notebooks")
_jobs: dict[str, Future[bool]] = {}  # a notebook: whether it was read back
_read_back: set[str] = set()  # the notebooks (src_uri) whose outputs were read back
_CHAPTER_LINK = re.compile(
    r"\[(?P<title>[^\]]+)\]\(\.\./(?P<path>[\w-]+\.md)(?P<anchor>#[\w-]+)?\)"
)
_SITE_LINK = re.compile(r'href="\.\./(?P<path>[\w-]+\.md)(?P<anchor>#[\w-]+)?"')
_SOLUTION_CELL = re.compile(r'<div [^>]*class="jp-Cell [^"]*\bcelltag_solution\b[^"]*"[^>]*>')
_DIV = re.compile(r"<(/?)div\b")
_STYLE = re.compile(r"<style[^>]*>(?P<css>.*?)</style>", re.DOTALL)
SHARED_CSS = 1000
"""A `<style>` block of at least this many characters on a notebook's page is JupyterLab's
stylesheet, the same on every page (590 KB a page): it becomes one file the pages link."""


def is_solution(cell: Any) -> bool:
    """A solution: a code cell whose first line is `# Solution`."""
    return bool(cell.cell_type == "code" and cell.source.startswith("# Solution"))


# Run before each notebook in the shared kernel: what a fresh kernel would have. No names, a
# fresh random seed (a new process draws one), torch's defaults. What survives the reset (the
# modules) is then frozen out of the collector's sight: the next reset's collection walked
# torch's objects too, 0.19 s of the kernel's CPU a notebook (2026-11-29), 0.02 s without them.
FRESH_KERNEL = """\
%reset -f
import gc as _gc
import torch as _torch
_gc.freeze()
_torch.seed()
_torch.set_default_dtype(_torch.float32)
_torch.set_grad_enabled(True)
del _gc, _torch
"""
_kernel: list[tuple[Any, Any]] = []  # the notebooks' kernel and its client, once started


RUNNER = ("ipykernel", "ipython", "jupyter_client", "jupytext", "matplotlib-inline", "nbclient",
          "nbformat")  # fmt: skip
"""The distributions that run a notebook and shape its outputs: part of a stored run's key."""


def execute(source: str, target: str, install: str) -> bool:
    """Run the notebook `source`, opened by the code cell `install`, and save it, outputs
    included, to `target`; return whether the outputs were read from a stored run instead.

    The outputs are stored like the site's trainings
    ([`attention_site.stored`][attention_site.stored]), keyed by the notebook's text, the
    sources of the modules of `attention` it imports, the versions of what it imports and of
    what runs it (`RUNNER`), and the CPU: a change to any of them runs it again. Runs in a
    worker thread: the kernel does the work.
    """
    from importlib.metadata import version

    from attention_site.stored import code_ingredients, kept

    start = time.perf_counter()
    code = with_install_cell(Path(source).read_text("utf-8"), install)
    runner = ", ".join(f"{name} {version(name)}" for name in RUNNER)
    wanted = code_ingredients(code, kernel=FRESH_KERNEL, threads="1", runner=runner)
    text, read = kept(f"notebook-{Path(source).stem}", wanted, lambda: _run(code, source, target))
    Path(target).write_text(text, encoding="utf-8")
    how = "read back (stored)" if read else "executed"
    log.info("Notebook %s %s in %.1f s", Path(source).name, how, time.perf_counter() - start)
    return read


def _run(code: str, source: str, target: str) -> str:
    """The notebook `code` (jupytext percent), executed in the notebooks' kernel (over local
    IPC sockets), reset to a fresh kernel's state first, as `.ipynb` text."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    notebook = jupytext.reads(code, fmt="py:percent")
    for cell in notebook.cells:  # rendered with the class celltag_solution: see fold_solutions
        if is_solution(cell):
            cell.metadata["tags"] = [*cell.metadata.get("tags", []), "solution"]
    notebook.cells.insert(0, nbformat.v4.new_code_cell(FRESH_KERNEL))
    kernel, client = _shared_kernel(
        cwd=str(Path(source).parent), ip=str(Path(target).with_name("kernel"))
    )
    # One output box per printout: the kernel may send one printout in several messages.
    runner = NotebookClient(
        notebook, km=kernel, timeout=600, allow_errors=False, coalesce_streams=True
    )
    runner.kc = client  # not a constructor argument: set, it is used instead of a new one
    runner.execute()
    del notebook.cells[0]
    _check_outputs(notebook, Path(source).name)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    for number, cell in enumerate(code_cells, start=1):  # the kernel's count runs across notebooks
        cell.execution_count = number
        for output in cell.outputs:
            if "execution_count" in output:
                output.execution_count = number
    return str(nbformat.writes(notebook))


_ADDRESS = re.compile(r"<[\w.]+ (object )?at 0x[0-9a-f]+>")  # a default repr: an address


def _check_outputs(notebook: Any, name: str) -> None:
    """Fail on an output that shows an object's address (`<torch._C.Generator at 0x...>`, the
    value of a cell ending in `torch.manual_seed(0)`): noise to a reader, new at every build."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            text = output.get("text", "") + output.get("data", {}).get("text/plain", "")
            shown = _ADDRESS.search(text)
            if shown:
                raise PluginError(
                    f"{name}: a cell shows {shown[0]}; end it with an assignment "
                    "(`_ = ...`) or print what it means"
                )


def _shared_kernel(cwd: str, ip: str) -> tuple[Any, Any]:
    """The notebooks' kernel, started on first use in `cwd` (one process, one thread), and one
    client for it, connected and ready.

    One kernel for all, reset before each: a kernel's start and `import torch` cost about 2 s
    of CPU, which twenty fresh kernels paid twenty times. One client for all: a client of
    its own per notebook waited 0.24 s for the kernel to answer (nbclient's handshake), 5 s
    for twenty notebooks on the second core's path (2026-11-29).
    """
    from jupyter_client.manager import KernelManager

    if not _kernel:
        kernel = KernelManager(transport="ipc", ip=ip)  # local sockets, not TCP: no warning
        kernel.start_kernel(cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})
        client = kernel.client()
        client.start_channels()
        client.wait_for_ready(timeout=120)
        _kernel.append((kernel, client))
    return _kernel[0]


@atexit.register
def _stop_kernel() -> None:
    """Shut the notebooks' kernel down: at exit, and before a rebuild (`mkdocs serve`), whose
    notebooks must import the package as it is now."""
    while _kernel:
        kernel, client = _kernel.pop()
        client.stop_channels()
        kernel.shutdown_kernel(now=True)


class KeptTemplates(jinja2.BytecodeCache):
    """Jinja's compiled templates, kept for every notebook's exporter.

    mkdocs-jupyter makes an `HTMLExporter` per notebook, and each makes a jinja environment
    that compiled nbconvert's templates again: a notebook took 0.13 s to convert, 0.05 s with
    them kept (measured alone, 2026-11-29; about 1.6 s a build). Jinja keys what it keeps by
    the template's name and checks its source's checksum, so an edited template is compiled
    again.
    """

    def __init__(self) -> None:
        self.code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if bucket.key in self.code:
            bucket.bytecode_from_string(self.code[bucket.key])

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self.code[bucket.key] = bucket.bytecode_to_string()

    def install(self) -> None:
        """Give every nbconvert exporter's environment these templates (once per process)."""
        from nbconvert.exporters.templateexporter import TemplateExporter

        create = TemplateExporter._create_environment
        if getattr(create, "kept", None) is not None:
            return

        def with_kept(exporter: TemplateExporter) -> jinja2.Environment:
            environment: jinja2.Environment = create(exporter)  # type: ignore[no-untyped-call]
            environment.bytecode_cache = self
            return environment

        with_kept.kept, with_kept.original = self, create  # type: ignore[attr-defined]
        TemplateExporter._create_environment = with_kept  # type: ignore[method-assign]


_templates = KeptTemplates()


def _is_notebook(src_uri: str) -> bool:
    return src_uri.startswith("exercises/") and src_uri.endswith(".py")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Start every notebook; its page will be rendered from the executed copy.

    One kernel at a time: on two cores, a second one beside the chapters' own code only adds
    contention (measured: the build took longer with two).
    """
    _stop_kernel()
    _templates.install()
    out = Path(tempfile.mkdtemp(prefix="attention-notebooks-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    pool = in_turn()  # one after another, before the runs queued after them (schedule.py)
    _jobs.clear()
    _read_back.clear()
    notebooks = [f for f in files if _is_notebook(f.src_uri) and f.abs_src_path]
    for file in notebooks:
        target = out / Path(file.src_uri).with_suffix(".ipynb")  # exercises/NN.ipynb
        target.parent.mkdir(exist_ok=True)
        install = install_cell(_package(config), draws=_draws(Path(str(file.abs_src_path))))
        _jobs[file.src_uri] = pool.submit(execute, str(file.abs_src_path), str(target), install)
        file.abs_src_path = str(target)  # mkdocs-jupyter renders this one
    # Pages are read in this order: the chapters first, while the notebooks run.
    return Files([f for f in files if f not in notebooks] + notebooks)


def on_pre_page(page: Page, config: MkDocsConfig, files: Files) -> Page:
    """Wait for the page's notebook before mkdocs-jupyter renders it."""
    job = _jobs.pop(page.file.src_uri, None)
    if job is not None:
        try:
            read = job.result()
        except Exception as error:  # a cell raised (allow_errors=False), or the kernel died
            raise PluginError(f"notebook {page.file.src_uri} failed:\n{error}") from error
        if read:
            _read_back.add(page.file.src_uri)
    return page


def note_stored(page: Page) -> None:
    """Have the page's footer (docs/hooks/stamp.py) say that the notebook's outputs were read
    back, if they were: after mkdocs has read the page's meta, which it does after
    `on_pre_page`."""
    if page.file.src_uri in _read_back:
        page.meta["notebook_stored"] = True


def exercise_table(docs_dir: Path) -> str:
    """A table of the exercise notebooks: file and title (the notebook's first heading)."""
    rows = ["| Notebook | Exercise |", "| --- | --- |"]
    for path in sorted((docs_dir / "exercises").glob("*.py")):
        title = re.search(r"^# # (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
        rows.append(f"| `{path.stem}` | [{title[1] if title else path.stem}]({path.name}) |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return markdown.replace("<!-- exercises -->", exercise_table(Path(config["docs_dir"])))


INSTALL = """\
# Installs what this notebook needs where it is missing (a fresh Jupyter,
# Colab): torch first (its CPU build, where there is no torch), then what
# `wanted` names. Where all of it imports, as while the site was built, it
# does nothing.
import subprocess
import sys
from importlib import invalidate_caches
from importlib.util import find_spec

{wheel}
wanted = {wanted}
missing = [pkg for name, pkg in wanted.items() if not find_spec(name)]
if missing:
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    if not find_spec("torch"):
        cpu = "https://download.pytorch.org/whl/cpu"
        subprocess.run([*pip, "torch", "--index-url", cpu], check=True)
    subprocess.run([*pip, *missing], check=True)
    invalidate_caches()"""


def install_cell(package: dict[str, str | None], draws: bool = False) -> str:
    """The notebooks' first code cell: installs torch, the wheel `package` names (from
    `package["wheel_url"]`, else the file next to the notebook) and, for a notebook that
    `draws`, matplotlib; each only where it does not import.

    >>> package = {"wheel": "p-1-py3-none-any.whl", "wheel_url": "https://x.org/dist/p.whl"}
    >>> print(install_cell(package, draws=True).split("\\n\\n")[1])
    WHEEL = "https://x.org/dist/p.whl"
    wanted = {"attention": WHEEL, "matplotlib": "matplotlib"}
    missing = [pkg for name, pkg in wanted.items() if not find_spec(name)]
    if missing:
        pip = [sys.executable, "-m", "pip", "install", "--quiet"]
        if not find_spec("torch"):
            cpu = "https://download.pytorch.org/whl/cpu"
            subprocess.run([*pip, "torch", "--index-url", cpu], check=True)
        subprocess.run([*pip, *missing], check=True)
        invalidate_caches()
    """
    url, name = package.get("wheel_url"), package["wheel"]
    if url:
        site, _, file = url.rpartition("/dist/")
        wheel = f'SITE = "{site}/"\nWHEEL = SITE + "dist/{file}"'
        if len(url) + len("WHEEL = ") + 2 <= 79:  # fits the notebook's column on one line
            wheel = f'WHEEL = "{url}"'
    else:
        wheel = (
            '# the wheel from this site\'s "Run it yourself" page, saved next to this\n'
            f'# notebook (on Colab: uploaded to its Files)\nWHEEL = "{name}"'
        )
    wanted = '{"attention": WHEEL, "matplotlib": "matplotlib"}' if draws else '{"attention": WHEEL}'
    return INSTALL.format(wheel=wheel, wanted=wanted)


def _draws(source: Path) -> bool:
    """Does the notebook draw (import matplotlib)? Its install cell installs matplotlib too."""
    return bool(re.search(r"^(import|from) matplotlib", source.read_text("utf-8"), re.MULTILINE))


def _package(config: MkDocsConfig) -> dict[str, str | None]:
    """What docs/hooks/package.py says about the wheel (`config.extra["package"]`)."""
    package = config.extra.get("package")
    if not isinstance(package, dict):
        raise PluginError(
            "no config.extra['package']: list docs/hooks/package.py in mkdocs.yml's "
            "hooks, before docs/hooks/notebooks.py"
        )
    return package


def with_install_cell(text: str, install: str) -> str:
    """A jupytext percent notebook `text` with the code cell `install` before its first code
    cell (after its title).

    >>> print(with_install_cell("# %% [markdown]\\n# # Title\\n\\n# %%\\nx = 1\\n", "import x"))
    # %% [markdown]
    # # Title
    <BLANKLINE>
    # %%
    import x
    <BLANKLINE>
    # %%
    x = 1
    <BLANKLINE>
    """
    first = re.search(r"^# %%$", text, re.MULTILINE)
    if first is None:
        raise PluginError("a notebook without a code cell: nothing to install for")
    return f"{text[: first.start()]}# %%\n{install}\n\n{text[first.start() :]}"


def offline_links(text: str, site_url: str | None) -> str:
    """Chapter links `[title](../page.md)` for a downloaded notebook, where a relative link leads
    nowhere: to the page under `site_url` if there is one, else the title alone, in italics."""

    def replace(link: re.Match[str]) -> str:
        if not site_url:
            return f"*{link['title']}*"
        url = f"{site_url.rstrip('/')}/{link['path'].removesuffix('.md')}/{link['anchor'] or ''}"
        return f"[{link['title']}]({url})"

    return _CHAPTER_LINK.sub(replace, text)


def write_downloads(source: Path, target: Path, site_url: str | None, install: str) -> None:
    """`source`'s downloads in `target`: the `.py`, its `.ipynb`, and `NAME_no_solutions.ipynb`
    (each solution cell's code replaced by `# your code here`), each opened by the code cell
    `install`; no outputs."""
    import jupytext

    text = with_install_cell(offline_links(source.read_text(encoding="utf-8"), site_url), install)
    (target / source.name).write_text(text, encoding="utf-8")
    notebook = jupytext.reads(text, fmt="py:percent")
    jupytext.write(notebook, target / f"{source.stem}.ipynb")
    for cell in notebook.cells:
        if is_solution(cell):
            cell.source = "# your code here"
    jupytext.write(notebook, target / f"{source.stem}_no_solutions.ipynb")


def fold_solutions(html: str) -> str:
    """Wrap each solution cell (`celltag_solution`: its code and output) in a closed `<details>`."""
    parts, end = [], 0
    for cell in _SOLUTION_CELL.finditer(html):
        if cell.start() < end:  # the template nests a cell's div in another: folded already
            continue
        depth = 0
        for tag in _DIV.finditer(html, cell.start()):  # the cell's own closing </div>
            depth += -1 if tag[1] else 1
            if depth == 0:
                break
        else:
            raise PluginError(f"unbalanced <div> after the solution cell at offset {cell.start()}")
        close = html.index(">", tag.end()) + 1
        summary = '<details class="solution"><summary>Solution</summary>'
        parts += [html[end : cell.start()], summary, html[cell.start() : close], "</details>"]
        end = close
    return "".join(parts) + html[end:]


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Exercise notebooks: solutions folded, chapter links resolved, downloads above the page."""
    if not _is_notebook(page.file.src_uri):
        return html
    note_stored(page)

    def site_link(link: re.Match[str]) -> str:
        file = files.get_file_from_path(link["path"])
        if file is None:  # a warning fails the strict build
            log.warning("%s links to %s, which is not a page", page.file.src_uri, link["path"])
            return link[0]
        return f'href="{file.url_relative_to(page.file)}{link["anchor"] or ""}"'

    source = Path(config["docs_dir"]) / page.file.src_uri
    target = Path(page.file.abs_dest_path).parent
    target.mkdir(parents=True, exist_ok=True)
    install = install_cell(_package(config), draws=_draws(source))
    write_downloads(source, target, config.get("site_url"), install)
    html = shared_styles(html, page.url, Path(config["site_dir"]))
    return download_links(source.stem) + fold_solutions(_SITE_LINK.sub(site_link, html))


def shared_styles(html: str, url: str, site_dir: Path) -> str:
    """Each large `<style>` block (`SHARED_CSS`) written once, as `assets/notebooks/<hash>.css`,
    and linked where it stood: the cascade's order is kept, and a reader's browser loads it
    once for all the notebooks' pages.
    """
    from hashlib import sha256

    from mkdocs.utils import get_relative_url

    def link(style: re.Match[str]) -> str:
        css = style["css"]
        if len(css) < SHARED_CSS:
            return style[0]
        name = f"assets/notebooks/{sha256(css.encode()).hexdigest()[:12]}.css"
        path = site_dir / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(css, encoding="utf-8")
        return f'<link rel="stylesheet" href="{get_relative_url(name, url)}">'

    return _STYLE.sub(link, html)


def download_links(stem: str, folder: str = "") -> str:
    """The paragraph above an exercise's page: its three downloads, in `folder` (`"NN/"`)."""
    blank = f"{stem}_no_solutions.ipynb"
    return (
        f'<p class="notebook-downloads">Download this exercise: <a href="{folder}{blank}" '
        f'download>{blank}</a> (Jupyter, the questions only), <a href="{folder}{stem}.ipynb" '
        f'download>{stem}.ipynb</a> (with the solutions) or <a href="{folder}{stem}.py" '
        f"download>{stem}.py</a> (jupytext percent format). The outputs below are the site's code "
        "running this notebook (the footer says when); each solution is folded under its "
        "question.</p>"
    )
