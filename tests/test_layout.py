"""The repository's shape: small modules, a small docs hook, nothing imported by file path.

Each module should be readable in one sitting; longer ones are split by job.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked(*patterns: str) -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / line for line in out.splitlines()]


def test_no_source_file_outside_the_tests_is_over_500_lines() -> None:
    sources = [p for p in tracked("*.py", "*.md", "*.yml", "*.toml") if "tests" not in p.parts]
    long = {
        str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


def test_the_docs_hooks_stay_small() -> None:
    assert len((ROOT / "docs/hooks/build.py").read_text().splitlines()) <= 200


def test_nothing_is_loaded_by_file_path() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in tracked("*.py", "*.md")
        if p.name != "test_layout.py" and "spec_from_file_location" in p.read_text()
    ]
    assert offenders == []
