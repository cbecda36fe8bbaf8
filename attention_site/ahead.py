"""A page's code blocks run ahead, in another process, and replayed when the page is built.

MkDocs builds the pages one after another, in one process; on two cores the second one waits
for the notebooks and the trainings to finish and then sits idle. The chapter with the most
code to run (chapter 15's, about 14 s: the 124M-parameter GPT built and run) can run there
instead: [`execute`][attention_site.ahead.execute], in a worker process, converts the page's
Markdown with the site's own extensions, and markdown-exec runs its blocks as it would in the
build, session by session; what each block printed comes back. When the build reaches the
page, [`replaying`][attention_site.ahead.replaying] hands markdown-exec those outputs, block by
block, instead of running the code again.

Nothing is taken on trust: each block the build asks for must be the next one that ran ahead,
the same session and the same code, and the page must ask for all of them; otherwise the build
stops with an error that names the page and the block. A page whose blocks failed ahead is run
in the build as usual, so its error is reported where it always is; so is a page that
publishes an attention explorer's weights, which the build writes and checks from its own
process ([`published`][attention_site.explorer.published]).

markdown-exec has no public hook for this: both sides replace its private `_run_python`
(the function its python fences call), only while a page converts. `tests/tooling/test_ahead.py`
fails when an upgrade of markdown-exec moves it.

Examples:
    >>> text = '```python exec="1" session="s"\\nx = 6 * 7\\n```\\n'
    >>> text += '```python exec="1" session="s"\\nprint(x)\\n```\\n'
    >>> ahead = execute_markdown(text)
    >>> [(session, output) for session, code, output in ahead.blocks]
    [('s', ''), ('s', '42\\n')]
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymdownx.superfences import SuperFencesException

__all__ = ["Ahead", "ReplayError", "execute", "execute_markdown", "replaying"]


_OTHER_EXEC = re.compile(
    r"^[ \t]*```(?!python\b)[\w-]+[^\n]*\bexec=\"(?:1|true|on)\"", re.MULTILINE
)
"""A fence markdown-exec runs in another language (`pycon`, `bash`, ...): not replayed."""


class ReplayError(SuperFencesException):  # type: ignore[misc]
    """A page's blocks and the blocks that ran ahead for it differ. A `SuperFencesException`:
    superfences renders a fence whose formatter raises anything else as plain code, silently."""


@dataclass
class Ahead:
    """What a page's blocks printed when they ran ahead.

    Attributes:
        blocks: `(session, code, output)` per block, in the order they ran.
        from_disk: the trainings the blocks read from disk instead of running
            ([`from_disk`][attention_site.runs.from_disk]), for the page's footer.
        source: the page's Markdown they ran from: a page changed since runs in the build.
    """

    blocks: list[tuple[str | None, str, str]]
    from_disk: list[str] = field(default_factory=list)
    source: str = ""


def _formatter() -> Any:
    """markdown-exec's python formatter module, whose `_run_python` runs a block."""
    from markdown_exec._internal.formatters import python

    if not callable(getattr(python, "_run_python", None)):
        raise RuntimeError(
            "markdown_exec._internal.formatters.python._run_python is gone: this markdown-exec "
            "runs python blocks another way; attention_site.ahead needs updating"
        )
    return python


@contextlib.contextmanager
def _running(run: Callable[..., str]) -> Iterator[None]:
    """markdown-exec's python blocks call `run` instead of running their code."""
    python = _formatter()
    original = python._run_python
    python._run_python = run
    try:
        yield
    finally:
        python._run_python = original


def execute_markdown(text: str, config_file: str | None = None) -> Ahead | None:
    """Run the python blocks of a page's Markdown `text`, as the build would, and keep what
    each printed; None where a block failed, the page published an attention explorer, or it
    has a fence of another language that markdown-exec runs (the build then runs the page
    itself).

    Args:
        text: the page's Markdown.
        config_file: the `mkdocs.yml` whose Markdown extensions convert it; None converts with
            superfences and markdown-exec's fences only.
    """
    if _OTHER_EXEC.search(text):  # markdown-exec runs them without `_run_python`
        return None
    import markdown
    from markdown_exec import formatter, validator

    from attention_site.explorer import published
    from attention_site.runs import from_disk

    if config_file is None:
        fences = [{"name": "python", "class": "python", "validator": validator,
                   "format": formatter}]  # fmt: skip
        md = markdown.Markdown(extensions=["pymdownx.superfences"],
                               extension_configs={"pymdownx.superfences":
                                                  {"custom_fences": fences}})  # fmt: skip
    else:
        from mkdocs.config import load_config

        config = load_config(config_file)
        config = config.plugins["markdown-exec"].on_config(config) or config  # its fences
        md = markdown.Markdown(extensions=config.markdown_extensions,
                               extension_configs=config.mdx_configs)  # fmt: skip
    python = _formatter()
    run, blocks, failed = python._run_python, [], []
    sessions: set[str | None] = set()

    def record(code: str, returncode: int | None = None, session: str | None = None,
               id: str | None = None, **extra: str) -> str:  # fmt: skip
        sessions.add(session)
        try:
            output: str = run(code, returncode=returncode, session=session, id=id, **extra)
        except BaseException:
            failed.append(code)
            raise
        blocks.append((session, code, output))
        return output

    from_disk()  # forget what earlier work in this process read
    with _running(record):
        md.convert(text)
    for session in sessions - {None}:
        python._sessions_globals.pop(session, None)  # the page's names: not kept here
    explorers = bool(published())
    published().clear()  # an explorer must be published in the build's process: run it there
    return None if failed or explorers else Ahead(blocks, from_disk(), text)


def execute(page: str, config_file: str, threads: int) -> Ahead | None:
    """[`execute_markdown`][attention_site.ahead.execute_markdown] for the page `page` (its path
    under the config's `docs_dir`), with torch on `threads` threads, as the build's pages: in a
    worker process, while the build does other pages."""
    import torch
    from mkdocs.config import load_config

    torch.set_num_threads(threads)
    docs = Path(load_config(config_file).docs_dir)
    os.environ.setdefault("MKDOCS_CONFIG_DIR", str(Path(config_file).parent))
    return execute_markdown((docs / page).read_text(encoding="utf-8"), config_file)


@contextlib.contextmanager
def replaying(page: str, ahead: Ahead) -> Iterator[None]:
    """While the build converts `page`: each python block markdown-exec runs returns what
    the same block printed ahead, without running. A block that did not run ahead, or a block
    that ran ahead and is not asked for, is an error naming the page and the block.

    Args:
        page: the page's path, for the errors.
        ahead: what [`execute`][attention_site.ahead.execute] returned for it.
    """
    left = list(ahead.blocks)

    def replay(code: str, returncode: int | None = None, session: str | None = None,
               id: str | None = None, **extra: str) -> str:  # fmt: skip
        first = code.strip().splitlines()[0] if code.strip() else ""
        if not left:
            raise ReplayError(f"{page}: the block {first!r} (session {session!r}) did not run "
                               "ahead: the page changed while it built?")  # fmt: skip
        ran_session, ran_code, output = left.pop(0)
        if (ran_session, ran_code) != (session, code):
            raise ReplayError(f"{page}: the build asks for the block {first!r} (session "
                               f"{session!r}) where the next that ran ahead is "
                               f"{ran_code.strip()[:60]!r} (session {ran_session!r}): a hook "
                               "changed the page's code?")  # fmt: skip
        return output

    with _running(replay):
        yield
    if left:
        raise ReplayError(f"{page}: {len(left)} blocks ran ahead that the build did not ask "
                           f"for, the first {left[0][1].strip()[:60]!r}")  # fmt: skip
