"""A product of test cases split between the fast and the slow group: every option fast.

A combination test runs every case with every kind of input. `nox -s tests` (the quick check)
runs each case once, with the kinds in turn, so every case and every kind runs there; the
rest of the product is marked `slow`, which `nox -s tests_heavy` and CI run.

Examples:
    >>> params = product([("a",), ("b",), ("c",)], ["x", "y"], seconds=1)
    >>> [(p.values, bool(p.marks)) for p in params][:4]
    [(('a', 'x'), False), (('a', 'y'), True), (('b', 'x'), True), (('b', 'y'), False)]
    >>> sum(not p.marks for p in params)  # fast: each case once, x and y in turn
    3
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest


def product(cases: Sequence[tuple[Any, ...]], kinds: Sequence[Any], seconds: float) -> list[Any]:
    """`pytest.param(*case, kind)` for every case and kind; case `i` runs fast with kind
    `i % len(kinds)` only, its other kinds are `slow(seconds=seconds)` (one core, each)."""
    slow = [pytest.mark.slow(seconds=seconds)]
    return [
        pytest.param(*case, kind, marks=[] if j == i % len(kinds) else slow)
        for i, case in enumerate(cases)
        for j, kind in enumerate(kinds)
    ]
