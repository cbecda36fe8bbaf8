"""attention_site.ahead: a page's blocks run in another process, then replayed by the build."""

from __future__ import annotations

import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import markdown
import pytest
from markdown_exec import formatter, validator

from attention_site import ahead, runs

PAGE = """\
# A page

```python exec="1" session="ahead-test"
import os
pid = os.getpid()
```

!!! note
    ```python exec="1" source="block" result="text" session="ahead-test"
    print(6 * 7)
    ```

```python exec="1" html="1" session="ahead-test"
print(f"<p data-pid='{pid}'>ran</p>")
```
"""


def convert(text: str) -> str:
    """`text` converted as the site converts a page: its extensions, markdown-exec's fences."""
    fences = [{"name": "python", "class": "python", "validator": validator, "format": formatter}]
    md = markdown.Markdown(
        extensions=["admonition", "pymdownx.superfences"],
        extension_configs={"pymdownx.superfences": {"custom_fences": fences}},
    )
    return md.convert(text)


def uuids(html: str) -> str:
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "U", html)


def test_replayed_page_is_the_page_run_here_and_runs_nothing(tmp_path: Path) -> None:
    config = tmp_path / "mkdocs.yml"  # the site's extensions, as its mkdocs.yml gives them
    (tmp_path / "docs").mkdir()
    config.write_text("site_name: t\nplugins: [markdown-exec]\n"
                      "markdown_extensions: [admonition, pymdownx.superfences]\n")  # fmt: skip
    ran = ahead.execute_markdown(PAGE, str(config))
    assert ran is not None
    assert [session for session, _, _ in ran.blocks] == ["ahead-test"] * 3
    assert ran.blocks[1][2] == "42\n"  # the block nested in the admonition ran too
    with ahead.replaying("page.md", ran):
        replayed = convert(PAGE)
    here = convert(PAGE)  # run in this process
    assert uuids(replayed) == uuids(here)  # the pid is this process's in both: same HTML


def test_a_page_run_in_another_process_prints_that_process() -> None:
    with ProcessPoolExecutor(1) as pool:  # another process, as the build's worker
        ran = pool.submit(ahead.execute_markdown, PAGE).result()
    assert ran is not None
    pid = re.search(r"data-pid='(\d+)'", ran.blocks[2][2])
    assert pid is not None and int(pid[1]) != __import__("os").getpid()
    with ahead.replaying("page.md", ran):
        html = convert(PAGE)
    assert f"data-pid='{pid[1]}'" in html and "42" in html  # its outputs, not this process's


def test_a_changed_block_is_an_error_naming_the_page() -> None:
    ran = ahead.execute_markdown(PAGE)
    assert ran is not None
    with pytest.raises(
        ahead.ReplayError, match=r"page\.md: the build asks for the block 'print\(7"
    ):
        with ahead.replaying("page.md", ran):
            convert(PAGE.replace("6 * 7", "7 * 6"))


def test_blocks_left_unasked_or_missing_are_errors() -> None:
    ran = ahead.execute_markdown(PAGE)
    assert ran is not None
    with pytest.raises(ahead.ReplayError, match=r"page\.md: 1 blocks ran ahead that the build did"):
        with ahead.replaying("page.md", ran):
            convert(PAGE.rsplit("```python", 1)[0])  # the last block removed
    with pytest.raises(ahead.ReplayError, match=r"page\.md: the block 'print\(1\)' .* did not run"):
        with ahead.replaying("page.md", ran):
            convert(PAGE + '\n```python exec="1"\nprint(1)\n```\n')


def test_a_failing_block_gives_none_so_the_build_runs_the_page_itself() -> None:
    assert ahead.execute_markdown('```python exec="1"\nraise ValueError("no")\n```\n') is None


def test_replaying_leaves_markdown_exec_as_it_was() -> None:
    ran = ahead.execute_markdown(PAGE)
    assert ran is not None
    with pytest.raises(ahead.ReplayError):
        with ahead.replaying("page.md", ran):
            convert("")  # nothing asked for: an error on leaving
    assert "ran</p>" in convert(PAGE)  # markdown-exec runs blocks itself again


def test_runs_answered_elsewhere_are_not_waited_for_and_name_the_footer() -> None:
    def double(x: int) -> int:
        return 2 * x

    runs.from_disk()
    runs._runs[runs._key(double, {"x": 4})] = runs._ON_DISK  # what prefetch does when stored
    assert any("double(x=4)" in name for name in runs.waiting())
    runs.answered_elsewhere([(double, {"x": 4})], ["attention.lab.english.train_english"])
    assert not any("double(x=4)" in name for name in runs.waiting())
    assert runs.from_disk() == ["attention.lab.english.train_english"]


def test_a_page_that_publishes_an_explorer_runs_in_the_build() -> None:
    """The explorer's weights are written and checked by the build's own process: a page that
    publishes one there must not run ahead (its entry would stay in the worker)."""
    page = '```python exec="1"\nfrom attention_site.explorer import published\n'
    page += 'published().append("weights")\n```\n'
    from attention_site.explorer import published

    assert ahead.execute_markdown(page) is None
    assert published() == []  # what the page published is not left behind in the worker


def test_a_page_with_blocks_of_another_language_runs_in_the_build() -> None:
    """markdown-exec runs a `pycon` (or `bash`) fence without `_run_python`: it could not be
    replayed, so such a page is built in-process."""
    assert ahead.execute_markdown('```pycon exec="1"\n>>> 1 + 1\n```\n' + PAGE) is None
    assert ahead.execute_markdown("```pycon\n>>> 1 + 1\n2\n```\n" + PAGE) is not None


def test_what_ran_ahead_keeps_its_source_and_a_failed_page_leaves_no_session() -> None:
    from markdown_exec._internal.formatters import python

    ran = ahead.execute_markdown(PAGE)
    assert ran is not None and ran.source == PAGE  # the build replays it only for this text
    failing = '```python exec="1" session="ahead-failed"\nx = 1\nraise ValueError\n```\n'
    assert ahead.execute_markdown(failing) is None
    assert "ahead-failed" not in python._sessions_globals


def test_the_build_replays_a_page_only_as_it_ran_ahead(caplog: pytest.LogCaptureFixture) -> None:
    """docs/hooks/schedule.py: a page is replayed only where it ran ahead from the text the
    build reads now; a page edited since, or whose worker failed, runs in the build."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from markdown_exec._internal.formatters import python

    from docs.hooks import schedule

    original = python._run_python
    ran = ahead.execute_markdown(PAGE)

    def page(text: str) -> SimpleNamespace:
        return SimpleNamespace(file=SimpleNamespace(src_uri="p.md", content_string=text))

    def prepared(result: object) -> Future[object]:
        future: Future[object] = Future()
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
        schedule._ahead["p.md"] = future
        return future

    prepared(ran)
    schedule._replay(page(PAGE + "\nedited\n"))
    assert python._run_python is original and "p.md" not in schedule._ahead
    prepared(RuntimeError("the worker died"))
    with caplog.at_level("INFO", logger="mkdocs.hooks.schedule"):
        schedule._replay(page(PAGE))
    assert python._run_python is original and "the worker died" in caplog.text
    prepared(ran)
    schedule._replay(page(PAGE))
    assert python._run_python is not original  # replaying until the page is converted
    html = convert(PAGE)
    schedule.on_page_content(html, page(PAGE), None, None)
    assert python._run_python is original and "42" in html
