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
  after the other chapters, and the Performance page, which times code, after those.
- Two workers, not one: a run starts as soon as either is free, not behind every run before
  it, so the last page that waits has its runs sooner (a whole build, one after the other on
  2 cores, 2026-11-27: 55.6 s with one worker, 52.2 s with two).
- Torch threads: the workers and the notebooks' kernel (docs/hooks/notebooks.py, about 20 s)
  share one core, so until the Performance page the pages get one thread fewer than the
  machine has CPUs: a thread more would spin waiting for a core they hold (measured in
  docs/maintainers.md, Build time).
  The Performance page gets every CPU, as the benchmark run it compares with did.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

_workers: list[ProcessPoolExecutor] = []


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
        # its own blocks come first (GPT-2's shape, about 8 s), then it waits for the model
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
core from 15 to 35 s into the build); after the notebooks, the second core is idle."""

MEASURES = "performance.md"
"""The page that times code: built last, when the notebooks and the runs are done."""


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Start the runs; the pages that wait for them go after the other chapters, and the page
    that measures after those."""
    import torch

    from attention_site.runs import in_turn, prefetch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) - 1))
    pages = runs()
    spawn = multiprocessing.get_context("spawn")
    worker = ProcessPoolExecutor(max_workers=2, mp_context=spawn)  # each trains on one thread
    atexit.register(worker.shutdown, cancel_futures=True)  # a failed build does not wait
    _workers.append(worker)
    # on two cores, after the notebooks; with cores to spare, beside them
    later = in_turn(worker) if (os.cpu_count() or 1) <= 2 else worker
    for needed in pages.values():
        for function, kwargs in needed:
            prefetch(later if function.__name__ in IN_TURN else worker, function, **kwargs)
    order = [*pages, MEASURES]

    def rank(file: Any) -> int:  # other chapters, these in order, then the notebooks
        if file.src_uri in order:
            return 1 + order.index(file.src_uri)
        return len(order) + 1 if file.src_uri.startswith("exercises/") else 0

    return Files(sorted(files, key=rank))


def on_pre_page(page: Page, config: MkDocsConfig, files: Files) -> Page:
    """Every CPU for the page that measures: the work on the last core is done by then."""
    import torch

    if page.file.src_uri == MEASURES:
        torch.set_num_threads(os.cpu_count() or 1)
    return page


def on_post_build(config: MkDocsConfig) -> None:
    from attention_site.runs import waiting

    while _workers:
        _workers.pop().shutdown()
    unused = waiting()
    if unused:
        raise PluginError(
            f"started for pages that never asked for them: {', '.join(unused)}; "
            "docs/hooks/schedule.py lists runs the pages no longer use"
        )
