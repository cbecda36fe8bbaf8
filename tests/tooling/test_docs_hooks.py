"""The docs build hooks (docs/hooks/*.py): console transcripts, build stamp, exercises, wheel."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("mkdocs")  # the `docs` extra

from docs.hooks import build, notebooks, stamp  # docs/ is a namespace package under the root

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return build


def test_run_pycon_echoes_values_like_a_console(hooks: ModuleType) -> None:
    source = ">>> x = 20 + 1\n>>> x * 2\n42\n>>> for i in range(2):\n...     print(i)\n0\n1\n"
    transcript = "```pycon\n" + source.rstrip("\n") + "\n```"
    assert hooks.run_pycon(source, "t") == transcript


def test_run_pycon_shows_todays_output_and_leaves_judging_to_pytest(
    hooks: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    """The build shows what runs today; only an example that raises fails it. Whether typed
    outputs still hold is pytest's call alone (NUMBER), so the two cannot disagree."""
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.attention"):
        out = hooks.run_pycon(">>> 6 * 7\n41\n>>> 0.1 + 0.2\n0.3\n", "stale.md#example")
    assert out == "```pycon\n>>> 6 * 7\n42\n>>> 0.1 + 0.2\n0.30000000000000004\n```"
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.attention"):
        hooks.run_pycon(">>> 1 / 0\n", "broken.md#example")
    assert "broken.md#example: an example raised" in caplog.text
    assert "ZeroDivisionError" in caplog.text


def test_run_pycon_drops_doctest_directives_and_keeps_the_global_rng(hooks: ModuleType) -> None:
    torch.manual_seed(0)
    expected_next = torch.rand(1)
    torch.manual_seed(0)
    out = hooks.run_pycon(">>> import torch\n>>> torch.manual_seed(1)  # doctest: +ELLIPSIS\n", "t")
    assert "doctest" not in out and ">>> torch.manual_seed(1)\n<torch._C.Generator" in out
    assert torch.equal(torch.rand(1), expected_next)  # the page's seed did not leak out


def test_readme_quickstart_section_is_found(hooks: ModuleType) -> None:
    section = hooks.section(ROOT / "README.md", "quickstart")
    assert section.startswith("```pycon\n>>> ") and section.rstrip().endswith("```")


def test_build_stamp_names_versions_and_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import attention

    monkeypatch.delenv("ATTENTION_DEVICE", raising=False)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    footer = stamp.build_stamp()
    assert f"<code>attention</code> {attention.__version__}" in footer
    assert f"torch {torch.__version__}" in footer
    assert "on <code>cpu</code> (Python" in footer and "1970-01-01" in footer
    # The pages' tensors are created on torch's default device; the Performance page's
    # measurements run on ATTENTION_DEVICE, and the stamp says so when the two differ.
    monkeypatch.setenv("ATTENTION_DEVICE", "meta")
    assert "on <code>cpu</code> (measurements on <code>meta</code>)" in stamp.build_stamp()
    torch.set_default_device("meta")
    try:
        assert "on <code>meta</code> (Python" in stamp.build_stamp()
    finally:
        torch.set_default_device(None)


def test_a_page_that_read_a_stored_training_says_so_in_its_footer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attention_site import runs

    config: dict[str, Any] = {}
    stamp.on_config(config)  # type: ignore[arg-type]
    page = SimpleNamespace(meta={})
    monkeypatch.setattr(runs, "_shown", ["attention.lab.heads.train_induction"])
    stamp.on_page_content("", page, config, None)  # type: ignore[arg-type]
    stamp.on_page_context({}, page, config, None)  # type: ignore[arg-type]
    assert "except the training <code>train_induction</code>, read from" in config["copyright"]
    other = SimpleNamespace(meta={"computed": False})  # the next page read and ran nothing
    stamp.on_page_content("", other, config, None)  # type: ignore[arg-type]
    stamp.on_page_context({}, other, config, None)  # type: ignore[arg-type]
    assert "except" not in config["copyright"] and "runs no code" in config["copyright"]


def test_exercise_table_lists_every_notebook_with_its_title() -> None:
    table = notebooks.exercise_table(ROOT / "docs")
    files = sorted((ROOT / "docs/exercises").glob("*.py"))
    assert len(table.splitlines()) == 2 + len(files)
    assert (
        "| `03_simplified` | [Exercise 3: simplified self-attention by hand](03_simplified.py) |"
        in table
    )


def test_solution_cells_are_folded_with_their_output() -> None:
    question = '<div class="jp-Cell jp-MarkdownCell"><div>6.1</div></div>'
    solution = (  # mkdocs-jupyter's template nests the cell's div in one more
        '<div class="jp-Cell jp-CodeCell celltag_solution">'
        '<div id="cell-id=1" class="jp-Cell jp-CodeCell celltag_solution">'
        '<div class="in"><div>code</div></div><div class="out">3</div></div></div>'
    )
    folded = notebooks.fold_solutions(question + solution + "<p>next</p>")
    summary = '<details class="solution"><summary>Solution</summary>'
    assert folded == question + summary + solution + "</details><p>next</p>"
    assert notebooks.fold_solutions(question) == question


WHEEL = "literate_attention-0.1.0-py3-none-any.whl"


def test_downloads_without_solutions_and_with_links_that_work_offline(tmp_path: Path) -> None:
    import jupytext

    source = ROOT / "docs/exercises/06_causal.py"
    install = notebooks.install_cell({"wheel": WHEEL, "wheel_url": None}, draws=True)
    notebooks.write_downloads(source, tmp_path, site_url=None, install=install)
    full = jupytext.read(tmp_path / "06_causal.ipynb")
    blank = jupytext.read(tmp_path / "06_causal_no_solutions.ipynb")
    solutions = [i for i, cell in enumerate(full.cells) if notebooks.is_solution(cell)]
    assert len(solutions) == 3 and len(blank.cells) == len(full.cells)
    for i, (cell, stub) in enumerate(zip(full.cells, blank.cells, strict=True)):
        assert stub.source == ("# your code here" if i in solutions else cell.source)
    code = [cell.source for cell in full.cells if cell.cell_type == "code"]
    assert code[0] == install and full.cells[0].cell_type == "markdown"  # after the title
    text = (tmp_path / "06_causal.py").read_text(encoding="utf-8")
    assert "](../" not in text and "# Chapter 6: *Causal attention*." in text
    assert jupytext.reads(text, fmt="py:percent").cells[1].source == install
    notebooks.write_downloads(source, tmp_path, "https://example.org/attention/", install)
    text = (tmp_path / "06_causal.py").read_text(encoding="utf-8")
    assert "[Causal attention](https://example.org/attention/causal/)" in text


def run_install_cell(
    cell: str, monkeypatch: pytest.MonkeyPatch, absent: set[str]
) -> list[list[str]]:
    """Execute an install cell with the modules `absent` missing; the commands it ran."""
    import importlib.util
    import subprocess

    monkeypatch.undo()  # the real find_spec, not a previous call's
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n in absent else real(n))
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda command, check: ran.append(command))
    exec(cell, {})
    return ran


def test_the_install_cell_installs_what_is_missing_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where everything imports (this build's kernel) it runs nothing; on a fresh machine it
    installs torch from the CPU index first, then the wheel (and matplotlib where asked)."""
    import sys

    url = f"https://someone.github.io/attention/dist/{WHEEL}"
    cell = notebooks.install_cell({"wheel": WHEEL, "wheel_url": url}, draws=True)
    assert max(len(line) for line in cell.splitlines()) <= 79  # the notebooks' column
    assert f'WHEEL = SITE + "dist/{WHEEL}"' in cell
    assert run_install_cell(cell, monkeypatch, absent=set()) == []
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    fresh = run_install_cell(cell, monkeypatch, absent={"attention", "matplotlib", "torch"})
    cpu = "https://download.pytorch.org/whl/cpu"
    assert fresh == [[*pip, "torch", "--index-url", cpu], [*pip, url, "matplotlib"]]
    plain = notebooks.install_cell({"wheel": WHEEL, "wheel_url": None})
    assert f'WHEEL = "{WHEEL}"' in plain  # no site URL: the file saved next to the notebook
    assert run_install_cell(plain, monkeypatch, absent={"attention"}) == [[*pip, WHEEL]]


def test_the_exercises_import_only_what_their_install_cell_installs() -> None:
    """A reader's notebook has torch, the wheel (`attention`), matplotlib and the standard
    library: not `attention_site` (the site's tooling, not in the wheel), not IPython."""
    import ast
    import sys

    allowed = {"torch", "attention", "matplotlib", *sys.stdlib_module_names}
    wrong = []
    for path in sorted((ROOT / "docs/exercises").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            wrong += [f"{path.name}: {n}" for n in names if n.split(".")[0] not in allowed]
    assert wrong == []


def test_the_package_hook_names_the_wheel_and_knows_only_what_it_is_told() -> None:
    import doctest

    from docs.hooks import package

    assert doctest.testmod(package).failed == 0
    assert doctest.testmod(notebooks).failed == 0
    assert package.distribution_names(ROOT / "pyproject.toml")[0] == WHEEL
    unknown = package.Package(WHEEL, "x.tar.gz")
    sizes = {WHEEL: 577_874, "x.tar.gz": 555_855}
    text = package.install_text(unknown, sizes)
    assert f"pip install ./{WHEEL}" in text and f"(dist/{WHEEL}) (578 kB)" in text
    assert "http" not in text + package.source_text(unknown)  # no address it was not given
    repo = package.Repository("https://github.com/a/b")
    known = package.Package(WHEEL, "x.tar.gz", "https://a.github.io/b/", repo)
    assert f"pip install \\\n  https://a.github.io/b/dist/{WHEEL}\n" in package.install_text(
        known, sizes
    )
    assert "[github.com/a/b](https://github.com/a/b)" in package.source_text(known)
    given = package.repository({"ATTENTION_REPO_URL": "https://example.org/r/"}, Path("/"))
    assert given is not None and given.url == "https://example.org/r"


def _checkout(path: Path, origin: str | None, *, commit: bool = False,
              pushed: bool = False) -> Path:  # fmt: skip
    """A git checkout at `path` with remote `origin`: a commit, and a remote branch holding it."""
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    path.mkdir()
    git("init", "-q")
    if origin:
        git("remote", "add", "origin", origin)
    if commit:
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "c")
    if pushed:
        git("update-ref", "refs/remotes/origin/main", "HEAD")
    return path


GITHUB = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "ci/attention",
          "GITHUB_SHA": "abc123"}  # fmt: skip


def test_the_repository_comes_from_the_setting_then_github_then_origin(tmp_path: Path) -> None:
    from docs.hooks.package import Repository, repository

    clone = _checkout(tmp_path / "clone", "git@github.com:someone/attention.git")
    setting = {"ATTENTION_REPO_URL": " https://example.org/r/ "}
    assert repository({**setting, **GITHUB}, clone) == Repository("https://example.org/r", "abc123")
    assert repository(GITHUB, clone) == Repository("https://github.com/ci/attention", "abc123")
    assert repository({}, clone) == Repository("https://github.com/someone/attention", "HEAD")
    assert repository(setting, tmp_path) == Repository("https://example.org/r", "HEAD")  # no git


def test_the_repository_links_a_pushed_commit_and_never_a_local_one(tmp_path: Path) -> None:
    import subprocess

    from docs.hooks.package import repository

    origin = "https://github.com/someone/attention.git"
    local = repository({}, _checkout(tmp_path / "local", origin, commit=True))
    pushed_at = _checkout(tmp_path / "pushed", origin, commit=True, pushed=True)
    commit = subprocess.run(["git", "-C", str(pushed_at), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    pushed = repository({}, pushed_at)
    assert local is not None and local.ref == "HEAD"  # a local commit would be a dead link
    assert pushed is not None and pushed.ref == commit and len(commit) == 40
    assert pushed.blob("docs/index.md") == (
        f"https://github.com/someone/attention/blob/{commit}/docs/index.md"
    )


@pytest.mark.parametrize("origin", [None, "/srv/git/attention.git", "../attention"])
def test_without_a_web_origin_the_build_knows_no_repository_and_says_how_to_give_it(
    tmp_path: Path, origin: str | None
) -> None:
    from docs.hooks import package

    assert package.repository({}, _checkout(tmp_path / "c", origin)) is None
    assert package.repository({}, tmp_path) is None  # not a checkout at all
    assert package.repository({"ATTENTION_REPO_URL": "  "}, tmp_path) is None  # blank: unset
    unknown = package.Package(WHEEL, "x.tar.gz")
    for text in (package.source_text(unknown), package.repository_text(unknown),
                 package.module_source_text(unknown, "attention/layer/fused.py"),
                 package.needs_repository(unknown)):  # fmt: skip
        assert "ATTENTION_REPO_URL" in text and "http" not in text
    assert package.page_source(unknown, "index.md") == ""


def test_shown_blocks_that_need_attention_site_say_so_and_link_the_repository() -> None:
    from docs.hooks import package

    fence = '```python exec="1" source="block" session="s"\n{}\n```\n\n'
    markdown = "".join(fence.format(code) for code in (
        "from attention_site.plot import svg\nx = 1", "y = 2", "print(svg(x + y))", "x = 3",
        "print(x)"))  # fmt: skip
    repo = package.Repository("https://github.com/a/b")
    out = package.mark_repository_blocks(markdown, package.Package(WHEEL, "x.tar.gz", None, repo))
    notes = [line for line in out.splitlines() if "needs-repository" in line]
    assert len(notes) == 2 and all('href="https://github.com/a/b"' in note for note in notes)
    assert "This block imports <code>attention_site</code> (the site's tooling)" in notes[0]
    assert "uses <code>svg</code>, <code>x</code>, defined by an earlier block" in notes[1]
    assert out.index(notes[1]) < out.index("x = 3")  # under the third block; x = 3 is its own


def test_shown_blocks_that_need_transformers_say_what_to_install() -> None:
    from docs.hooks import package

    fence = '```python exec="1" source="block" session="s"\n{}\n```\n\n'
    markdown = "".join(fence.format(code) for code in (
        "import transformers\nc = transformers.GPT2Config()", "import attention", "print(c)",
        "from attention_site.plot import svg\nprint(svg(c))"))  # fmt: skip
    repo = package.Repository("https://github.com/a/b")
    out = package.mark_repository_blocks(markdown, package.Package(WHEEL, "x.tar.gz", None, repo))
    notes = [line for line in out.splitlines() if "needs-repository" in line]
    assert len(notes) == 3  # `import attention` needs only the wheel
    assert (
        "imports <code>transformers</code>, which the wheel does not install: it runs "
        "after <code>pip install transformers</code>"
        in notes[0]
        and "href" not in notes[0]
    )
    assert (
        "uses <code>c</code>, defined by an earlier block that needs <code>transformers" in notes[1]
    )
    assert (
        "imports <code>attention_site</code> (the site's tooling) and uses <code>c</code>, "
        "defined by an earlier block that needs <code>transformers</code>:" in notes[2]
    )
    assert 'href="https://github.com/a/b"' in notes[2] and "pip install transformers" in notes[2]


def _site(path: Path, pages: dict[str, str]) -> Path:
    for name, html in pages.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(f"<html><body>{html}</body></html>", encoding="utf-8")
    return path


def test_a_built_page_without_its_source_link_is_found(tmp_path: Path) -> None:
    from docs.hooks import package

    repo = package.Repository("https://github.com/a/b", "HEAD")
    known = package.Package(WHEEL, "x.tar.gz", None, repo)
    footer = package.page_source(known, "grouped-query.md")
    assert 'href="https://github.com/a/b/blob/HEAD/docs/grouped-query.md"' in footer
    api = package.page_source(known, "api/attention.layer.fused.md")
    assert 'href="https://github.com/a/b/blob/HEAD/attention/layer/fused.py"' in api
    index = package.page_source(known, "api/index.md")
    results = package.page_source(known, "api/attention_bench.results.md")  # beside results/
    assert 'href="https://github.com/a/b/blob/HEAD/attention_bench/results.py"' in results
    assert 'href="https://github.com/a/b"' in package.page_source(known, "api/SUMMARY.md")
    site = _site(tmp_path / "site", {"index.html": footer, "api/attention.layer.fused/index.html":
                                     api, "api/index.html": index, "404.html": "",
                                     "api/attention_bench.results/index.html": results})  # fmt: skip
    assert package.unlinked_pages(site, repo) == []
    _site(site, {"tokens/index.html": "no footer link",
                 "gone/index.html": package.page_source(known, "gone.md")})  # fmt: skip
    assert package.unlinked_pages(site, repo) == [
        "gone/index.html: its source link https://github.com/a/b/blob/HEAD/docs/gone.md names "
        "no file of the checkout",
        "tokens/index.html: 0 links to its source, not 1",
    ]
    told = package.repository_text(package.Package(WHEEL, "x.tar.gz"))
    bare = _site(tmp_path / "bare", {"index.html": told, "start/index.html": told,
                                     "run/index.html": "nothing"})  # fmt: skip
    assert package.unlinked_pages(bare, None) == [
        "run/index.html: does not say how to give the repository's address"
    ]


def test_a_wheel_with_anything_but_the_library_fails_the_build(tmp_path: Path) -> None:
    import zipfile

    from mkdocs.exceptions import PluginError

    from docs.hooks import package

    wheel = tmp_path / WHEEL
    names = ["attention/__init__.py", "attention_bench/__init__.py", "x-0.1.0.dist-info/RECORD"]
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in names:
            archive.writestr(name, "x = 1\n")
    assert package.check_wheel(wheel) == {top.split("/")[0]: (1, 6) for top in names}
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("attention_site/plot.py", "")
    with pytest.raises(PluginError, match=r"it holds \['attention', 'attention_bench', "
                                          r"'attention_site'"):  # fmt: skip
        package.check_wheel(wheel)


@pytest.mark.parametrize(
    ("src_uri", "markdown", "computed"),
    [
        ("maintainers.md", "# Maintainers\n\n| job |\n```bash\nnox -s docs\n```\n", False),
        ("causal.md", '# Causal\n\n```python exec="1" source="block"\nprint(1)\n```\n', True),
        ("production.md", '!!! note\n    ```python exec="1"\n    print(1)\n    ```\n', True),
        ("index.md", "# attention\n\n<!-- pycon: README.md#quickstart -->\n", True),
        ("exercises/06_causal.py", "", True),  # a notebook, executed by notebooks.py
    ],
)
def test_footer_says_every_output_was_computed_only_where_a_page_computes(
    hooks: ModuleType, monkeypatch: pytest.MonkeyPatch, src_uri: str, markdown: str, computed: bool
) -> None:
    monkeypatch.setattr(hooks, "run_pycon", lambda source, name: "```pycon\n```")
    config: dict[str, str] = {}
    stamp.on_config(config)
    page = SimpleNamespace(meta={}, file=SimpleNamespace(src_uri=src_uri))
    hooks.on_page_markdown(markdown, page, config, None)
    stamp.on_page_context({}, page, config, None)
    footer = config["copyright"]
    assert footer.startswith('<span class="build-stamp">') and "torch" in footer
    assert ("Every output on this page was computed" in footer) is computed
    assert ("This page runs no code" in footer) is not computed


def test_the_explorer_check_fails_on_a_browser_that_computes_otherwise() -> None:
    from mkdocs.exceptions import PluginError

    from attention_site.explorer import Published
    from docs.hooks import explorer

    torch.manual_seed(0)
    from attention.model.gpt import GPTModel

    cfg = {"vocab_size": 5, "context_length": 4, "emb_dim": 8, "n_heads": 2, "n_layers": 1,
           "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
    entry = Published("explorer/m.bin", b"", {}, GPTModel(cfg), [])
    from attention_site.explorer import EXACT, TOLERANCE

    within = [TOLERANCE / 5, TOLERANCE / 100, EXACT / 10, EXACT / 100]
    explorer._judge(entry, [within])  # within both limits: passes
    for k, bad in enumerate([2 * TOLERANCE, 2 * TOLERANCE, 10 * EXACT, 10 * EXACT]):
        errors = [list(within), list(within)]
        errors[1][k] = bad
        with pytest.raises(PluginError, match=r"differs from PyTorch's on cases \[1\]"):
            explorer._judge(entry, errors)
    with pytest.raises(PluginError, match="on cases"):
        explorer._judge(entry, [[float("inf")] * 4])


def test_a_notebook_output_showing_an_address_fails_the_build() -> None:
    import nbformat
    from mkdocs.exceptions import PluginError

    cell = nbformat.v4.new_code_cell("torch.manual_seed(0)")
    cell.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": "tensor([1.])"})]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    notebooks._check_outputs(notebook, "ok.py")  # a value: fine
    shown = "<torch._C.Generator at 0x7f21480a0270>"
    cell.outputs.append(nbformat.v4.new_output("execute_result", {"text/plain": shown}))
    with pytest.raises(PluginError, match=r"bad\.py: a cell shows <torch\._C\.Generator at 0x"):
        notebooks._check_outputs(notebook, "bad.py")


def test_footer_names_what_a_page_shows_but_did_not_compute(
    hooks: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Performance page reads stored benchmark runs: its footer says so, and only its."""
    config: dict[str, str] = {}
    stamp.on_config(config)
    stored = "the stored runs' tables, read from committed files"
    page = SimpleNamespace(meta={}, file=SimpleNamespace(src_uri="performance.md"))
    hooks.on_page_markdown('---\n```python exec="1"\nprint(1)\n```\n', page, config, None)
    page.meta["stored"] = stored
    stamp.on_page_context({}, page, config, None)
    assert "Every output on this page was computed" in config["copyright"]
    assert config["copyright"].endswith(f", except {stored}.</span>")
    other = SimpleNamespace(meta={"computed": True}, file=SimpleNamespace(src_uri="causal.md"))
    stamp.on_page_context({}, other, config, None)
    assert "except" not in config["copyright"]


def test_figures_and_sources_are_set_aside_for_the_search_index_and_put_back_unchanged() -> None:
    figure = '<svg class="attention-figure" role="img"><g><title>the -> cat: 0.12</title></g></svg>'
    icon = '<svg viewBox="0 0 24 24"><path d="M1 1"/></svg>'
    source = '<details class="mkdocstrings-source"><summary>Source</summary><pre>x</pre></details>'
    content = f"<p>a</p>{figure}<p>b <svg/> c</p>{icon}<p>d</p>{source}<details>e</details>"
    page: Any = SimpleNamespace(file=SimpleNamespace(src_uri="causal.md"), content=content)
    build.on_page_context({}, page, None, None)  # type: ignore[arg-type]
    assert "<svg" not in page.content.replace("<svg/>", "")  # what the search plugin reads
    assert "cat: 0.12" not in page.content and "<p>b <svg/> c</p>" in page.content
    assert "Source" not in page.content and "<details>e</details>" in page.content
    written = f"<html>{page.content}</html>"  # the theme's page around the content
    assert build.on_post_page(written, page, None) == f"<html>{content}</html>"  # type: ignore[arg-type]
    assert build.on_post_page("<html></html>", page, None) == "<html></html>"  # type: ignore[arg-type]


@pytest.mark.slow(seconds=4)
def test_each_notebook_finds_a_fresh_kernel_in_the_shared_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notebooks share one kernel and one client (docs/hooks/notebooks.py): a notebook
    finds none of the names, defaults or grad mode the one before it left, and a notebook
    whose cell raises fails the build."""
    monkeypatch.setenv("ATTENTION_RUNS_CACHE", "off")  # run each, read nothing back
    first, second, failing = (tmp_path / f"{name}.py" for name in ("first", "second", "failing"))
    first.write_text("# %%\nimport torch\nleftover = 1\ntorch.set_default_dtype(torch.float64)\n"
                     "torch.set_grad_enabled(False)\n")  # fmt: skip
    second.write_text("# %%\nimport torch\nprint('leftover' in dir(), torch.get_default_dtype(), "
                      "torch.is_grad_enabled())\n")  # fmt: skip
    failing.write_text("# %%\nraise ValueError('in the notebook')\n")
    import nbformat

    try:
        for source in (first, second):
            notebooks.execute(str(source), str(source.with_suffix(".ipynb")), "pass")
        with pytest.raises(Exception, match="in the notebook"):
            notebooks.execute(str(failing), str(failing.with_suffix(".ipynb")), "pass")
    finally:
        notebooks._stop_kernel()
    cell = nbformat.read(second.with_suffix(".ipynb"), as_version=4).cells[-1]
    assert cell.outputs[0]["text"] == "False torch.float32 True\n"


def test_notebook_templates_are_compiled_once_and_again_when_edited(tmp_path: Path) -> None:
    """nbconvert makes a jinja environment per notebook; `KeptTemplates` keeps what one
    compiled for the next, by name and source checksum: an edited template compiles again."""
    import jinja2

    kept = notebooks.KeptTemplates()
    template = tmp_path / "cell.j2"
    compiled: list[str] = []

    class Counting(jinja2.Environment):
        def _compile(self, source: str, filename: str) -> Any:
            compiled.append(filename)
            return super()._compile(source, filename)

    def render() -> str:  # a fresh environment each time, as nbconvert's exporters make
        loader = jinja2.FileSystemLoader(tmp_path)
        return Counting(loader=loader, bytecode_cache=kept).get_template("cell.j2").render(x=2)

    template.write_text("{{ x * 3 }}")
    assert (render(), render(), len(compiled)) == ("6", "6", 1)
    template.write_text("{{ x * 5 }}")
    assert (render(), len(compiled)) == ("10", 2)


def test_every_nbconvert_exporter_keeps_the_compiled_templates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nbconvert = pytest.importorskip("nbconvert")  # the docs extra's
    exporters = nbconvert.exporters.templateexporter.TemplateExporter
    create = exporters._create_environment  # nbconvert's own, restored after the test
    monkeypatch.setattr(exporters, "_create_environment", getattr(create, "original", create))
    kept = notebooks.KeptTemplates()
    kept.install()
    kept.install()  # once per process, not wrapped twice
    create = exporters._create_environment
    assert create.kept is kept and not hasattr(create.original, "kept")
    exporter = nbconvert.HTMLExporter()
    assert exporter.environment.bytecode_cache is kept


def test_notebook_pages_link_one_shared_stylesheet(tmp_path: Path) -> None:
    """JupyterLab's 590 KB of CSS, inline on every notebook's page, becomes one file linked
    where each block stood (the cascade's order kept); small blocks stay inline."""
    big = "p { color: red; }" + " " * notebooks.SHARED_CSS
    html = f"<p>a</p><style>{big}</style><style>b {{}}</style><style>{big}</style>"
    out = [notebooks.shared_styles(html, f"exercises/{n}/", tmp_path) for n in ("01", "02")]
    written = list((tmp_path / "assets/notebooks").iterdir())
    assert len(written) == 1 and written[0].read_text() == big
    link = f'<link rel="stylesheet" href="../../assets/notebooks/{written[0].name}">'
    assert out == [f"<p>a</p>{link}<style>b {{}}</style>{link}"] * 2
    assert notebooks.shared_styles("<style>b {}</style>", "x/", tmp_path) == "<style>b {}</style>"


def test_a_notebook_runs_once_per_content_and_its_page_says_when_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`notebooks.execute` stores the executed copy under its key (attention_site.stored): the
    same notebook, install cell and code are read back without a kernel; another text runs."""
    monkeypatch.setenv("ATTENTION_RUNS_CACHE", str(tmp_path / "runs"))
    runs: list[str] = []

    def run(code: str, source: str, target: str) -> str:
        runs.append(code)
        return f"executed {len(runs)}"

    monkeypatch.setattr(notebooks, "_run", run)
    source, target = tmp_path / "01_x.py", tmp_path / "out" / "01_x.ipynb"
    source.write_text("# %%\nfrom attention import causal_mask\nprint(causal_mask(2))\n")
    target.parent.mkdir()
    assert notebooks.execute(str(source), str(target), "pass") is False  # run: not stored yet
    assert target.read_text() == "executed 1" and "pass" in runs[0]  # the install cell ran
    assert notebooks.execute(str(source), str(target), "pass") is True  # read back
    assert target.read_text() == "executed 1" and len(runs) == 1
    assert notebooks.execute(str(source), str(target), "import os") is False  # another install
    source.write_text(source.read_text() + "print(1)\n")
    assert notebooks.execute(str(source), str(target), "pass") is False  # another notebook
    assert len(runs) == 3
    page = SimpleNamespace(file=SimpleNamespace(src_uri="exercises/01_x.py"), meta={})
    done: Future[bool] = Future()
    done.set_result(True)
    notebooks._jobs["exercises/01_x.py"] = done
    notebooks.on_pre_page(page, None, None)  # type: ignore[arg-type]
    page.meta = {}  # mkdocs reads the page's meta after on_pre_page
    notebooks.note_stored(page)  # type: ignore[arg-type]
    assert page.meta == {"notebook_stored": True}
    footer = stamp.build_stamp(notebook_stored=True)  # what the footer then says
    opening = f'<span class="build-stamp">{stamp.NOTEBOOK_READ_BACK}; the site was built'
    assert footer.startswith(opening) and ", except" not in footer
