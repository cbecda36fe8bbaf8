"""MkDocs hooks for the exercise notebooks (`docs/exercises/*.py`, jupytext percent format).

Each notebook is executed from the start of the build in a fresh kernel (its own process, one
thread), one after another in the background while the chapters build; mkdocs-jupyter then
renders the executed copy (`execute: false` in mkdocs.yml: it finds the outputs there). A cell
that raises fails the build. Above each notebook's page go its downloads, the `.ipynb` (without
outputs) and the `.py`; `<!-- exercises -->` in a page becomes the table of all of them.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.notebooks")
_jobs: dict[str, Future[None]] = {}


def execute(source: str, target: str) -> None:
    """Run the notebook `source` in a fresh kernel (over local IPC sockets); save it, outputs
    included, to `target`. Runs in a worker thread: the kernel does the work."""
    import jupytext
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    start = time.perf_counter()
    notebook = jupytext.read(source)
    kernel = KernelManager(transport="ipc", ip=f"{target}.kernel")  # not TCP: no warning
    client = NotebookClient(notebook, km=kernel, timeout=600, allow_errors=False,
                            resources={"metadata": {"path": str(Path(source).parent)}})  # fmt: skip
    try:
        client.execute(env={**os.environ, "OMP_NUM_THREADS": "1"})  # one core, no spinning
    finally:
        if kernel.has_kernel:
            kernel.shutdown_kernel(now=True)  # the client leaves a kernel it was given running
    nbformat.write(notebook, target)
    log.info("Executed notebook %s in %.1f s", Path(source).name, time.perf_counter() - start)


def _is_notebook(src_uri: str) -> bool:
    return src_uri.startswith("exercises/") and src_uri.endswith(".py")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Start every notebook; its page will be rendered from the executed copy.

    One kernel at a time: on two cores, a second one beside the chapters' own code only adds
    contention (measured: the build took longer with two).
    """
    out = Path(tempfile.mkdtemp(prefix="attention-notebooks-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notebook")
    atexit.register(pool.shutdown, cancel_futures=True)
    _jobs.clear()
    notebooks = [f for f in files if _is_notebook(f.src_uri) and f.abs_src_path]
    for file in notebooks:
        target = out / Path(file.src_uri).with_suffix(".ipynb")  # exercises/NN.ipynb
        target.parent.mkdir(exist_ok=True)
        _jobs[file.src_uri] = pool.submit(execute, str(file.abs_src_path), str(target))
        file.abs_src_path = str(target)  # mkdocs-jupyter renders this one
    # Pages are read in this order: the chapters first, while the notebooks run.
    return Files([f for f in files if f not in notebooks] + notebooks)


def on_pre_page(page: Page, config: MkDocsConfig, files: Files) -> Page:
    """Wait for the page's notebook before mkdocs-jupyter renders it."""
    job = _jobs.pop(page.file.src_uri, None)
    if job is not None:
        try:
            job.result()
        except Exception as error:  # a cell raised (allow_errors=False), or the kernel died
            raise PluginError(f"notebook {page.file.src_uri} failed:\n{error}") from error
    return page


def exercise_table(docs_dir: Path) -> str:
    """A table of the exercise notebooks: file and title (the notebook's first heading)."""
    rows = ["| Notebook | Exercise |", "| --- | --- |"]
    for path in sorted((docs_dir / "exercises").glob("*.py")):
        title = re.search(r"^# # (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
        rows.append(f"| `{path.stem}` | [{title[1] if title else path.stem}]({path.name}) |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return markdown.replace("<!-- exercises -->", exercise_table(Path(config["docs_dir"])))


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Above each exercise notebook: its downloads, written next to the page."""
    if not _is_notebook(page.file.src_uri):
        return html
    import jupytext

    source = Path(config["docs_dir"]) / page.file.src_uri
    target = Path(page.file.abs_dest_path).parent
    target.mkdir(parents=True, exist_ok=True)
    jupytext.write(jupytext.read(source), target / f"{source.stem}.ipynb")  # no outputs
    shutil.copyfile(source, target / source.name)
    links = (
        f'<p class="notebook-downloads">Download this exercise: '
        f'<a href="{source.stem}.ipynb" download>{source.stem}.ipynb</a> (Jupyter) or '
        f'<a href="{source.name}" download>{source.name}</a> (jupytext percent format). '
        f"The outputs below were computed while the site was built.</p>"
    )
    return links + html
