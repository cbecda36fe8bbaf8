"""MkDocs hook: what runs where during the build, on a machine with few cores.

- The longest trainings run in two worker processes (and chapter 19's two-process run, which
  starts its processes from there once the notebooks are done: `IN_TURN`). Five pages train
  models while they build (chapter 1's copy-task models, reused by chapter 14, which also
  trains a transformer, chapter 15's character model of English, whose heads chapter 16
  explores, chapter 16's induction model, and chapter 20's softmax and linear models on the
  same task): most of the pages' own work. At the start of the build
  `attention_site.runs.prefetch` starts each in a worker; each page's
  `attention_site.runs.once(...)` call waits for its run instead of doing it again, and gets
  what the same call computes in-process (the runs are seeded and train on one thread). A run
  stored on disk already (`attention_site.stored`: by an earlier build, or by the heavy tests,
  which train chapter 16's) is read instead, not started. A run no page asked for is a build
  error: this list and the pages' calls must agree.
- The pages are built in an order that lets that work finish: the pages that wait for a run
  after the other chapters, then the notebooks' pages, then the pages whose blocks ran ahead
  in a worker (`AHEAD`, `attention_site.ahead`), and the Performance page, which times code,
  last.
- Two workers, not one: a run starts as soon as either is free, not behind every run before
  it, so the last page that waits has its runs sooner (a whole build, one after the other on
  2 cores, 2026-11-27: 55.6 s with one worker, 52.2 s with two).
- Torch threads: the workers and the notebooks' kernel (docs/hooks/notebooks.py, about 13 s)
  share one core, so until the Performance page the pages get one thread fewer than the
  machine has CPUs: a thread more would spin waiting for a core they hold (measured in
  docs/maintainers.md, Build time).
  The Performance page gets every CPU, as the benchmark run it compares with did.
- CPython's cycle collector, kept in step with a build that holds about a million objects
  (`GC_THRESHOLDS`, `on_shutdown`), in this process and in the workers
  (`attention_site.runs.collector`).
"""

from __future__ import annotations

import atexit
import gc
import logging
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack, suppress
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.schedule")
_workers: list[ProcessPoolExecutor] = []
_ahead: dict[str, Future[Any]] = {}  # page -> its blocks run ahead (attention_site.ahead)
_replays = ExitStack()  # the page being replayed, until its content is converted


GC_THRESHOLDS = (50_000, 20, 100)
"""The cycle collector's thresholds for the build (CPython's are 700, 10, 10). The build keeps
about a million objects alive (the pages' sessions, the API's object tree, the plugins), and
with the defaults a full collection walked them all 16 times, 7.3 s of an 80 s build on the
2-core Intel Xeon (2026-11-29, `gc.callbacks`); with these the collector took 2.0-2.6 s and
no full collection ran."""


def on_startup(command: str, dirty: bool) -> None:
    gc.set_threshold(*GC_THRESHOLDS)


def on_shutdown() -> None:
    """Leave the objects to the operating system: the collection CPython makes as it exits
    walked all of them again, 5 s after `Documentation built in` (py-spy); once frozen, it
    does not look at them, and the process ended 0.9 s after it."""
    gc.freeze()


def runs() -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    """Each page that asks for a prefetched run, and the runs (function, arguments) it asks for,
    in the order the worker does them: the first page built needs the first run."""
    from attention.lab.copy_task import run_experiment
    from attention.lab.english import train_english
    from attention.lab.heads import train_induction
    from attention.lab.recall import compare_recall
    from attention.lab.seq2seq import transformer_experiment
    from attention_site.ring import chapter_results

    return {
        "why-attention.md": [(run_experiment, {"seed": 0})],
        "cross-attention.md": [
            (run_experiment, {"seed": 0}),
            (transformer_experiment, {"seed": 0}),
        ],
        # run ahead where the model is stored (AHEAD); else its own blocks come first (GPT-2's
        # shape, about 8 s), then it waits for the model
        "generation.md": [(train_english, {"seed": 0})],
        "heads.md": [
            (train_induction, {"seed": 0, "context_length": 64}),
            (train_english, {"seed": 0}),
        ],
        # two gloo processes of its own, started from the worker after the notebooks (IN_TURN)
        "ring.md": [(chapter_results, {})],
        "beyond-softmax.md": [(compare_recall, {"seed": 0})],
    }


IN_TURN = {"chapter_results"}
"""The runs started, on a machine of two cores, only once the notebooks are done
(`attention_site.runs.in_turn`): chapter 19's two processes beside the notebooks' kernel and
the pages took a core from the pages for about 20 s (2026-11-29: each rank about 0.4 of a
core from 15 to 35 s into the build); after the notebooks, the second core has time for them
(and then for the pages that run ahead, `AHEAD`, and the explorer's check)."""

AHEAD = ("generation.md", "transformer.md")
"""The pages whose code blocks run ahead in a worker (`attention_site.ahead`) and are replayed
when the build reaches them: chapter 15's 124M-parameter GPT and chapter 13's comparisons with
transformers' modules, 13.7 and 4-5 s of the pages' one core (2026-11-29, 2-core Intel Xeon).
On two cores they wait their turn behind the notebooks and chapter 19's run (`IN_TURN`), when
the second core is otherwise idle, and the build does them after the notebooks' pages, before
the Performance page. Run from the start beside the notebooks, chapter 15 only competed with
the kernel for the second core and saved nothing (70.8 and 63.9 s against 70.6 and 65.5 s).
A page runs ahead only where every training it reads is stored on disk already; otherwise it
waits for them in the build."""

NOTEBOOKS = "exercises/"
"""The exercise notebooks' pages, built after the pages that wait for a run and before those
that ran ahead: their kernel is done by then, and the second core has time to finish what
runs ahead (2026-11-29: the build waited 9 s for chapter 15 with the notebooks after the
Performance page)."""

MEASURES = "performance.md"
"""The page that times code: built last, when the notebooks and the runs are done."""


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Start the runs and the pages that run ahead; order the pages (`NOTEBOOKS`)."""
    import torch

    from attention_site.ahead import ReplayError, execute
    from attention_site.runs import collector, in_turn, prefetch
    from attention_site.stored import is_stored

    _ahead.clear()  # what a failed build started (mkdocs serve builds again in this process)
    with suppress(ReplayError):  # a page a failed build left replaying: markdown-exec restored
        _replays.close()
    threads = max(1, (os.cpu_count() or 1) - 1)
    torch.set_num_threads(threads)
    pages = runs()
    spawn = multiprocessing.get_context("spawn")
    worker = ProcessPoolExecutor(  # each trains on one thread; collects as this process does
        max_workers=2, mp_context=spawn, initializer=collector, initargs=(GC_THRESHOLDS,)
    )
    atexit.register(worker.shutdown, cancel_futures=True)  # a failed build does not wait
    _workers.append(worker)
    # on two cores, after the notebooks; with cores to spare, beside them
    later = in_turn(worker) if (os.cpu_count() or 1) <= 2 else worker
    for needed in pages.values():
        for function, kwargs in needed:
            prefetch(later if function.__name__ in IN_TURN else worker, function, **kwargs)
    for page in AHEAD:
        if all(is_stored(function, kwargs) for function, kwargs in pages.get(page, [])):
            _ahead[page] = later.submit(execute, page, config.config_file_path, threads)
    order = [*(page for page in pages if page not in _ahead), NOTEBOOKS, *_ahead, MEASURES]

    def rank(file: Any) -> int:  # other chapters, then these in order
        if file.src_uri.startswith(NOTEBOOKS):
            return 1 + order.index(NOTEBOOKS)
        return 1 + order.index(file.src_uri) if file.src_uri in order else 0

    return Files(sorted(files, key=rank))


def on_pre_page(page: Page, config: MkDocsConfig, files: Files) -> Page:
    """Every CPU for the page that measures: the work on the last core is done by then. A page
    whose blocks ran ahead replays them."""
    import torch

    from attention_site.runs import in_turn

    if page.file.src_uri in _ahead:
        _replay(page)
    if page.file.src_uri == MEASURES:
        in_turn().submit(int).result()  # every job in turn is done: the second core is free
        torch.set_num_threads(os.cpu_count() or 1)
    return page


def _replay(page: Page) -> None:
    """Replay what the page's blocks printed ahead, where they ran from the page as it is now.
    Otherwise the page runs here, as usual: a block failed there (its error is reported here),
    the page changed since, or the worker itself failed."""
    from attention_site.ahead import replaying
    from attention_site.runs import answered_elsewhere

    name = page.file.src_uri
    try:
        ahead = _ahead.pop(name).result()
    except Exception as error:  # the worker died (BrokenProcessPool), or its set-up failed
        log.info(
            "%s: running ahead failed (%s: %s); it runs here", name, type(error).__name__, error
        )
        return
    if ahead is None or ahead.source != page.file.content_string:
        return
    answered_elsewhere(runs().get(name, []), ahead.from_disk)
    _replays.enter_context(replaying(name, ahead))
    log.info("%s: %d blocks ran ahead in a worker; replayed", name, len(ahead.blocks))


def on_page_content(html: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    _replays.close()  # every block that ran ahead was asked for, or an error
    return html


def on_post_build(config: MkDocsConfig) -> None:
    from attention_site.runs import waiting

    _ahead.clear()
    while _workers:
        _workers.pop().shutdown()
    unused = waiting()
    if unused:
        raise PluginError(
            f"started for pages that never asked for them: {', '.join(unused)}; "
            "docs/hooks/schedule.py lists runs the pages no longer use"
        )
