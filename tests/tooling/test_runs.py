"""attention_site.runs: a run done once per process, and one started early elsewhere."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from attention_site import runs


def test_once_runs_each_set_of_arguments_once() -> None:
    counted: list[int] = []

    def square(x: int) -> list[int]:
        counted.append(x)
        return [x * x]

    a, b, c = runs.once(square, x=2), runs.once(square, x=2), runs.once(square, x=3)
    assert a is b and a == [4] and c == [9]  # the same object, not a recomputed equal one
    assert counted == [2, 3]


def test_prefetch_is_waited_for_and_not_run_again() -> None:
    counted: list[int] = []

    def cube(x: int) -> list[int]:
        counted.append(x)
        return [x**3]

    with ThreadPoolExecutor(max_workers=1) as executor:
        runs.prefetch(executor, cube, x=7)
        runs.prefetch(executor, cube, x=7)  # already started: not again
        assert any("cube(x=7)" in name for name in runs.waiting())
        result = runs.once(cube, x=7)
    assert result == [343] and counted == [7]
    assert runs.once(cube, x=7) is result  # unpickled once, then kept
    assert not any("cube(x=7)" in name for name in runs.waiting())


def test_a_prefetched_error_is_raised_by_once() -> None:
    def fails(x: int) -> int:
        raise FloatingPointError(f"diverged at {x}")

    with ThreadPoolExecutor(max_workers=1) as executor:
        runs.prefetch(executor, fails, x=1)
        with pytest.raises(FloatingPointError, match="diverged at 1"):
            runs.once(fails, x=1)


def test_an_unhashable_argument_is_named() -> None:
    with pytest.raises(TypeError, match=r"sizes must be hashable .* got list \[1, 2\]"):
        runs.once(sum, sizes=[1, 2])
