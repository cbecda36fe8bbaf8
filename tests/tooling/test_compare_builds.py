"""tests/browser/compare_builds.py on two small sites: what it finds and what it ignores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import compare_builds


def site(root: Path, outputs: dict[str, list[str]], extra: str = "") -> Path:
    for name, blocks in outputs.items():
        page = root / name / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        pre = "".join(f"<pre><code>{block}</code></pre>" for block in blocks)
        page.write_text(f"<nav><pre>menu</pre></nav><article>{extra}{pre}</article>")
    return root


@pytest.fixture
def sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare_builds, "SAMPLE", ("a",))


@pytest.mark.usefixtures("sample")
def test_the_same_pages_and_outputs_compare_equal(tmp_path: Path) -> None:
    pages = {"a": ["x = 1", "tensor([1.0,  2.0])"], "b": []}
    mkdocs = site(tmp_path / "m", pages)
    styled = "<style>pre { color: red }</style><script>'<pre>'</script>"  # not the page's text
    zensical = site(tmp_path / "z", {"a": ["x = 1", "tensor([1.0, 2.0])"], "b": []}, styled)
    assert compare_builds.compare(mkdocs, zensical) == []


@pytest.mark.usefixtures("sample")
def test_a_missing_page_and_a_changed_output_are_named(tmp_path: Path) -> None:
    mkdocs = site(tmp_path / "m", {"a": ["x = 1", "2"], "b": []})
    zensical = site(tmp_path / "z", {"a": ["x = 1", "3"]})
    problems = compare_builds.compare(mkdocs, zensical)
    assert problems[0] == "pages only under MkDocs: ['b']; only under Zensical: []"
    assert problems[1] == "a: 2 blocks under MkDocs, 2 under Zensical; first difference at block 1"
