"""Trained runs computed once per process, and started early in another process by the site.

The site shows some trained models on more than one page (chapter 1's two copy-task models are
also compared with a transformer in chapter 14), so the pages ask for a run with
[`once`][attention_site.runs.once]: the first call with given arguments runs it, later ones return
the same object. The build also starts the longest runs in a second process while other pages
build ([`prefetch`][attention_site.runs.prefetch]); a page's `once` call then waits for that run
instead of doing it again, and gets what the same call would have computed in-process: the
runs seed everything they draw and train on one thread.

A run of one of the package's own trainings (a module-level function of `attention`, plain
arguments) is also kept on disk by [`stored`][attention_site.stored.stored], keyed by the code,
data and versions that produce it: a later build, or a test that asks for the same run, reads
it instead of training again, and a change to any of them trains again.

A run is looked up by its arguments' types and `repr`s as well as their values, so arguments
that merely compare equal are different runs: `x=True` is not `x=1`, `x=2.0` is not `x=2`,
`x=-0.0` is not `x=0.0` (nor `(1, True)` `(1, 1)`, inside a container). A run that raises is not
kept, wherever it ran: the error is raised to the `once` call that asked for it, and the next
`once` call with the same arguments runs the function again, in this process.

Examples:
    >>> calls = []
    >>> def square(x):
    ...     calls.append(x)
    ...     return x * x
    >>> once(square, x=3), once(square, x=3), once(square, x=4)
    (9, 9, 16)
    >>> calls  # the second call with x=3 ran nothing
    [3, 4]
"""

from __future__ import annotations

import atexit
import gc
import pickle
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

from attention_site.stored import is_stored, read_back, storable, stored

__all__ = [
    "answered_elsewhere",
    "collector",
    "from_disk",
    "in_turn",
    "once",
    "prefetch",
    "waiting",
]

R = TypeVar("R")
_runs: dict[tuple[Any, ...], Any] = {}  # _key(function, arguments) -> result, or its Future
_ON_DISK = object()  # in _runs: stored on disk already, read by the first `once` call
_disk: set[tuple[Any, ...]] = set()  # the keys whose result was read from disk
_shown: list[str] = []  # what `once` returned from disk since the last from_disk()
_TURNS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="in-turn")  # see in_turn


def _key(function: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """`(function, (name, type, repr, value), ...)`, by name: equal keys are the same call.

    The value alone would make `True` and `1`, `2.0` and `2`, `-0.0` and `0.0` one run, as they
    compare (and hash) equal; their types and `repr`s tell them apart (the `repr` also inside
    containers, `(1, True)` against `(1, 1)`), and the value is kept for a `repr` that hides
    a difference."""
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__} "
                        f"{function!r:.60}")  # fmt: skip
    for name, value in kwargs.items():
        try:
            hash(value)
        except TypeError:
            raise TypeError(f"{name} must be hashable (a run is looked up by its arguments), "
                            f"got {type(value).__name__} {value!r}") from None  # fmt: skip
    items = sorted(kwargs.items(), key=lambda item: item[0])
    return (function, *((name, type(value), repr(value), value) for name, value in items))


def once(function: Callable[..., R], /, **kwargs: Any) -> R:
    """`function(**kwargs)`, run once per process: a later call with the same function and
    arguments returns the first call's result (the same object). If the run was started with
    [`prefetch`][attention_site.runs.prefetch], waits for it and returns its result; an error it
    raised is raised here. A run that raised is not kept, here or in the other process: the
    next call with the same arguments runs `function` again, in this process. A run of the
    package's own function is read from disk where it was stored, and stored where it was not
    ([`stored`][attention_site.stored.stored]).

    Args:
        function: what to run, e.g. [`train_induction`][attention.lab.heads.train_induction].
        **kwargs: its arguments, by name (hashable values).
    """
    key = _key(function, kwargs)
    if key not in _runs or _runs[key] is _ON_DISK:
        read_back()
        _runs[key] = _run(function, kwargs)
        if read_back():
            _disk.add(key)
    if key in _disk:
        _shown.append(f"{function.__module__}.{function.__qualname__}")
    result = _runs[key]
    if isinstance(result, Future):
        try:
            result = pickle.loads(result.result())
        except BaseException:
            if _runs[key].done():  # it failed (not this wait, interrupted): as in this process,
                del _runs[key]  # not kept; the next call runs it again
            raise
        _runs[key] = result
    return result  # type: ignore[no-any-return]


def prefetch(executor: Executor, function: Callable[..., Any], /, **kwargs: Any) -> None:
    """Start `function(**kwargs)` on `executor`, for a later [`once`][attention_site.runs.once] call
    with the same arguments to wait for; one started or done already, or stored on disk, is not
    started again.

    With a process pool the run happens beside this process's own work; `function` must be
    importable by name there. The result comes back pickled, a plain copy: no memory is shared
    with the other process.

    Args:
        executor: where to run it, e.g. a `ProcessPoolExecutor`.
        function: a module-level function.
        **kwargs: its arguments, by name.
    """
    if not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures Executor (a ProcessPoolExecutor, "
                        f"say), got {type(executor).__name__}")  # fmt: skip
    key = _key(function, kwargs)
    if key in _runs:
        return
    if is_stored(function, kwargs):  # nothing to compute: `once` reads it
        _runs[key] = _ON_DISK
    else:
        _runs[key] = executor.submit(_pickled, function, kwargs)


def from_disk() -> list[str]:
    """The functions (`module.name`) whose results [`once`][attention_site.runs.once] returned
    from runs stored on disk by an earlier process, since the last call, each once: what the
    page that called `once` shows but this build did not compute (its footer says so)."""
    names = list(dict.fromkeys(_shown))
    _shown.clear()
    return names


def answered_elsewhere(needed: list[tuple[Callable[..., Any], dict[str, Any]]],
                       shown: list[str]) -> None:  # fmt: skip
    """A page's runs were read in another process, where its blocks ran
    ([`attention_site.ahead`][attention_site.ahead]): those stored on disk are no longer
    [`waiting`][attention_site.runs.waiting] here (a later `once` call reads them from disk
    again), and `shown`, what that process's [`from_disk`][attention_site.runs.from_disk]
    returned, is what this one's returns next, for the page's footer.

    Args:
        needed: the page's runs, `(function, arguments)` each.
        shown: the functions (`module.name`) the other process read from disk for the page.
    """
    for function, kwargs in needed:
        key = _key(function, kwargs)
        if _runs.get(key) is _ON_DISK:
            del _runs[key]
    _shown.extend(shown)


def waiting() -> list[str]:
    """The prefetched runs no [`once`][attention_site.runs.once] call has asked for yet, as
    `module.function(arguments)`: started for nothing, unless a call is still to come."""
    return [f"{key[0].__module__}.{key[0].__qualname__}("
            + ", ".join(f"{name}={shown}" for name, _, shown, _ in key[1:]) + ")"
            for key, run in _runs.items()
            if isinstance(run, Future) or run is _ON_DISK]  # fmt: skip


def _run(function: Callable[..., R], kwargs: dict[str, Any]) -> R:
    """`function(**kwargs)`, through the disk where it can be stored."""
    return stored(function, **kwargs) if storable(function, kwargs) else function(**kwargs)


def collector(thresholds: tuple[int, int, int]) -> None:
    """A worker process's start (`ProcessPoolExecutor(initializer=collector, ...)`): the cycle
    collector's `thresholds`, and its objects frozen at exit, so that CPython's last collection
    does not walk them. A worker that runs chapter 15's and chapter 13's blocks holds about half a
    million objects: with CPython's thresholds it collected them all 8 times (1.3 s of CPU),
    with the build's (50,000, 20, 100) none (0.25 s in all), and its exit took 0.6 s, 0.2 s
    frozen (2026-11-29, 2-core Intel Xeon)."""
    gc.set_threshold(*thresholds)
    atexit.register(gc.freeze)


def _pickled(function: Callable[..., Any], kwargs: dict[str, Any]) -> bytes:
    return pickle.dumps(_run(function, kwargs))


class _InTurn(Executor):
    def __init__(self, executor: Executor | None) -> None:
        self._executor = executor

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        executor = self._executor
        if executor is None:
            return _TURNS.submit(fn, *args, **kwargs)
        return _TURNS.submit(lambda: executor.submit(fn, *args, **kwargs).result())


def in_turn(executor: Executor | None = None) -> Executor:
    """An executor whose jobs wait their turn: each starts once every job submitted before it
    through `in_turn` (with any `executor`) is done, on `executor`, or on the turns' own thread
    where None.

    The build's background work on a machine with few cores: the exercise notebooks, then
    chapter 19's two-process run, the pages that run ahead and the explorer's check in
    Chromium, take the second core one after the other instead of competing with the pages
    for both. A failed job fails its own future, not the ones after.

    Examples:
        >>> order = []
        >>> first = in_turn().submit(order.append, 1)
        >>> second = in_turn().submit(order.append, 2)
        >>> second.result(), order
        (None, [1, 2])
    """
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures Executor or None, got "
                        f"{type(executor).__name__}")  # fmt: skip
    return _InTurn(executor)
