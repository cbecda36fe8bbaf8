"""attention_site.runs: a run done once per process, and one started early elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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


@pytest.mark.parametrize(
    ("first", "second"),
    [(1, True), (0, False), (0.0, -0.0), (2, 2.0), ((1, True), (1, 1)), (frozenset({0.0}),
     frozenset({-0.0})), ("1", 1)],
    ids=["1-True", "0-False", "0.0--0.0", "2-2.0", "nested", "frozenset", "str-int"],
)  # fmt: skip
def test_arguments_that_only_compare_equal_are_different_runs(first: object,
                                                              second: object) -> None:  # fmt: skip
    def kind(x: object) -> str:
        return repr(x)

    assert runs.once(kind, x=first) == repr(first)
    assert runs.once(kind, x=second) == repr(second)  # not the first call's result
    assert runs.once(kind, x=first) == repr(first)


def test_keyword_order_does_not_matter() -> None:
    counted: list[int] = []

    def add(a: int, b: int) -> int:
        counted.append(a)
        return a + b

    assert runs.once(add, a=1, b=2) == runs.once(add, b=2, a=1) == 3
    assert counted == [1]


def flaky() -> tuple[list[int], Callable[[], int]]:
    """A function that fails on its first call, then returns how many calls there were."""
    calls: list[int] = []

    def run() -> int:
        calls.append(len(calls))
        if len(calls) == 1:
            raise FloatingPointError("diverged")
        return len(calls)

    return calls, run


def test_a_failure_in_this_process_is_not_kept() -> None:
    calls, run = flaky()
    with pytest.raises(FloatingPointError, match="diverged"):
        runs.once(run)
    assert runs.once(run) == 2  # run again, and kept
    assert runs.once(run) == 2 and len(calls) == 2


def test_a_prefetched_failure_is_not_kept_either() -> None:
    """The other process's error is raised once; the next call runs the function again here,
    as after a failure in this process, instead of raising the old error for ever."""
    calls, run = flaky()
    with ThreadPoolExecutor(max_workers=1) as executor:
        runs.prefetch(executor, run)
        with pytest.raises(FloatingPointError, match="diverged"):
            runs.once(run)
    assert not any(".run()" in name for name in runs.waiting())
    assert runs.once(run) == 2 and len(calls) == 2  # run again, here
    assert runs.once(run) == 2 and len(calls) == 2  # and kept


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: runs.once(42, x=1), TypeError, r"function must be callable, got int 42"),
        (lambda: runs.prefetch(None, abs, x=1), TypeError,  # type: ignore[arg-type]
         r"executor must be a concurrent.futures Executor .*got NoneType"),
        (lambda: runs.prefetch(ThreadPoolExecutor(1), "abs", x=1), TypeError,
         r"function must be callable, got str 'abs'"),
    ],
    ids=["once", "executor", "prefetch"],
)  # fmt: skip
def test_bad_arguments_are_named(call: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_in_turn_starts_a_job_on_its_executor_only_after_the_jobs_before_it() -> None:
    import threading
    import time

    gate = threading.Event()
    first = runs.in_turn().submit(gate.wait, 5)  # the notebooks, say
    with ThreadPoolExecutor(max_workers=1) as executor:
        later = runs.in_turn(executor).submit(gate.is_set)  # a run queued after them
        time.sleep(0.05)
        assert not later.done()  # its executor is free, but its turn has not come
        gate.set()
        assert later.result(timeout=5) is True and first.result(timeout=5) is True
    failed = runs.in_turn().submit(lambda: 1 / 0)
    after = runs.in_turn().submit(lambda: "runs")  # a failure fails its own job only
    assert after.result(timeout=5) == "runs" and isinstance(failed.exception(), ZeroDivisionError)
    with pytest.raises(
        TypeError, match=r"executor must be a concurrent\.futures Executor or None, got int"
    ):
        runs.in_turn(3)  # type: ignore[arg-type]


def test_a_worker_collects_with_the_given_thresholds_and_freezes_at_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`collector`, a build worker's initializer: its thresholds, and no last collection."""
    import gc

    done: list[object] = []
    monkeypatch.setattr(runs.gc, "set_threshold", lambda *thresholds: done.append(thresholds))
    monkeypatch.setattr(runs.atexit, "register", done.append)
    runs.collector((50_000, 20, 100))
    assert done == [(50_000, 20, 100), gc.freeze]
