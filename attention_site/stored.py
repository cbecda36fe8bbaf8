"""Trained runs kept on disk, keyed by what produces them: each training runs once per content.

The site's pages and the tests train the same small models (chapter 1's copy task, chapter
14's transformer, chapter 15's model of English, chapter 16's induction model).
[`stored`][attention_site.stored.stored] runs `function(**kwargs)` once per *content*: the
result is pickled into a folder that git ignores (`.cache/attention-runs/` in the checkout,
or the folder `ATTENTION_RUNS_CACHE` names), under a hash of everything that decides it
([`ingredients`][attention_site.stored.ingredients]):

- the function's name and every argument, defaults included (type and `repr`);
- the text of every module of `attention` that the function's module imports, directly or
  through others, with the packages' `__init__.py` on the way, and every file of
  `attention/data/`;
- the versions of Python, torch and every other distribution those modules import;
- the CPU: torch's kernel set (`ATEN_CPU_CAPABILITY=default` changes the last bits of a
  training) and the CPU's model (a run records how long it took);
- torch's thread count, where the run does not fix its own (`num_threads=None`).

A change to any of them is another key, so the run trains again: nothing stale is read. The
modules' text is read once per process, which is what the process imported as long as nobody
edits the files while it runs (`mkdocs serve` keeps what it imported: restart it).

The same store keeps what running a piece of code shows (the exercise notebooks' executed
copies, docs/hooks/notebooks.py): [`code_ingredients`][attention_site.stored.code_ingredients]
keys it by its text, the sources of the modules of `attention` it imports, the versions and the
CPU, and [`kept`][attention_site.stored.kept] stores any result under such a key.

Two processes that miss the same key (two pytest-xdist workers) both train it, and each
writes a temporary file that it renames into place (`os.replace`, atomic): a reader finds a
whole file or none. `ATTENTION_RUNS_CACHE=off` stores nothing and trains every time; deleting
the folder is always safe.

Examples:
    >>> from attention.lab.heads import train_induction
    >>> a = ingredients(train_induction, {"seed": 0})
    >>> b = ingredients(train_induction, {"seed": 0, "steps": 700})  # the default, spelled out
    >>> digest(a) == digest(b), digest(a) == digest(ingredients(train_induction, {"seed": 1}))
    (True, False)
    >>> a["function"], "attention/model/gpt.py" in a["sources"]
    ('attention.lab.heads.train_induction', True)
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import inspect
import json
import os
import pickle
import platform
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

import attention

__all__ = [
    "code_ingredients", "digest", "folder", "imports", "ingredients", "is_stored", "kept",
    "location", "read_back", "sources", "storable", "stored",
]  # fmt: skip

_read: list[str] = []  # the functions whose stored runs this process read, since read_back()

R = TypeVar("R")
PACKAGE = Path(attention.__file__).resolve().parent
"""The package `attention` whose modules produce the runs."""
CHECKOUT = Path(__file__).resolve().parents[1]
"""The repository: `attention_site` is never installed, always imported from a checkout."""
_UNREADABLE = (
    FileNotFoundError,
    EOFError,
    pickle.UnpicklingError,
    ValueError,
    TypeError,
    AttributeError,
    ImportError,
)
"""What reading a stored file may raise where it is not a whole, current run: it runs again."""
PLAIN = (bool, int, float, str, type(None))
"""The argument types whose `repr` says everything about the value."""


def folder() -> Path | None:
    """Where runs are stored: `ATTENTION_RUNS_CACHE`, else `.cache/attention-runs/` in the
    checkout; None where `ATTENTION_RUNS_CACHE=off` (store nothing, train every time)."""
    setting = os.environ.get("ATTENTION_RUNS_CACHE", "")
    if setting.lower() == "off":
        return None
    return Path(setting) if setting else CHECKOUT / ".cache" / "attention-runs"


def _plain(value: object) -> bool:
    if isinstance(value, tuple):
        return all(_plain(item) for item in value)
    return isinstance(value, PLAIN)


def storable(function: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
    """Whether `function(**kwargs)` can be stored: a module-level function of `attention`
    whose arguments are plain values (bool, int, float, str, None, tuples of them), all of
    them parameters it has."""
    module = getattr(function, "__module__", None) or ""
    name = getattr(function, "__qualname__", "")
    if not module.startswith("attention.") or "<" in name or "." in name:
        return False
    if getattr(sys.modules.get(module), name, None) is not function:
        return False
    try:
        inspect.signature(function).bind(**kwargs)
    except TypeError:
        return False
    return all(_plain(value) for value in kwargs.values())


def _file(module: str, root: Path) -> Path | None:
    """The file of `module` (a name in `attention`) under `root`, the package's parent."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported(path: Path, module: str) -> set[str]:
    """Every module name `path` (the file of `module`) imports, anywhere in it, with each
    `from a import b` read as both `a` and `a.b` (b may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports(path.read_text(encoding="utf-8"), package)


def imports(code: str, package: str = "") -> set[str]:
    """Every module name the Python `code` imports, anywhere in it, with each `from a import b`
    read as both `a` and `a.b` (b may be a module); relative imports from `package`.

    >>> sorted(imports("import torch\\nfrom attention import MultiHeadAttention"))
    ['attention', 'attention.MultiHeadAttention', 'torch']
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def sources(module: str, root: Path = PACKAGE.parent) -> tuple[dict[str, str], set[str]]:
    """The files that `module` runs, with their SHA-256, and the other top-level modules they
    import.

    The files: `module`'s, and that of every module of `attention` it imports, directly or
    through another, each with its packages' `__init__.py` (Python runs them first), and every
    file under `attention/data/`; as paths relative to `root`, the folder that holds
    `attention/`. The other modules: the top-level names outside `attention` and the
    standard library (`torch`, `tiktoken`, ...), whose versions the key also holds.

    Raises:
        ValueError: `module` is not a module of `attention` under `root`.
    """
    if _file(module, root) is None or not module.startswith("attention"):
        raise ValueError(f"module must be a module of attention under {root}, got {module!r}")
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):  # the packages on the way, then the module
            prefix = ".".join(parts[:depth])
            path = _file(prefix, root)
            if prefix in seen or path is None:
                continue
            seen.add(prefix)
            for imported in _imported(path, prefix):
                top = imported.split(".")[0]
                if top == "attention":
                    todo.append(imported)
                elif top and top not in sys.stdlib_module_names and top != "__future__":
                    outside.add(top)
    files = {_file(name, root) for name in seen}
    files.update(p for p in (root / "attention" / "data").rglob("*") if p.is_file())
    hashes = {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
              for path in sorted(f for f in files if f is not None)}  # fmt: skip
    return hashes, outside


@functools.cache
def _owners() -> Mapping[str, list[str]]:
    """Each importable top-level name's distributions: a scan of every installed distribution's
    files (about 0.5 s), so once per process."""
    return importlib.metadata.packages_distributions()


@functools.cache
def _sources(module: str) -> tuple[dict[str, str], dict[str, str]]:
    """`sources(module)` once per process, with the versions of the distributions of the
    outside modules."""
    hashes, outside = sources(module)
    versions = {dist: version for top in sorted(outside) for dist, version in _versions(top)}
    return hashes, versions


def _versions(top: str) -> list[tuple[str, str]]:
    """The distributions that provide the top-level module `top`, with their versions."""
    return [(dist, importlib.metadata.version(dist)) for dist in _owners().get(top, [])]


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ingredients(function: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Everything that decides what `function(**kwargs)` returns, as JSON-able values.

    Raises:
        TypeError: `function(**kwargs)` is not [`storable`][attention_site.stored.storable].
    """
    if not storable(function, kwargs):
        name = getattr(function, "__qualname__", function)
        raise TypeError(f"cannot store {name!r} with {kwargs!r}: a module-level function of "
                        "attention with its own parameters, of plain values (bool, int, "
                        "float, str, None, tuples)")  # fmt: skip
    bound = inspect.signature(function).bind(**kwargs)
    bound.apply_defaults()  # `steps=700` spelled out or left to the default: one run
    arguments = [[name, type(value).__name__, repr(value)]
                 for name, value in sorted(bound.arguments.items())]  # fmt: skip
    hashes, versions = _sources(function.__module__)
    versions = {"python": platform.python_version(), "torch": torch.__version__, **versions}
    threads = bound.arguments.get("num_threads")
    return {
        "function": f"{function.__module__}.{function.__qualname__}",
        "arguments": arguments,
        "sources": hashes,
        "versions": versions,
        "cpu": {"capability": torch.backends.cpu.get_cpu_capability(), "model": _cpu_model()},
        # a run that sets no thread count of its own runs on the process's
        "threads": torch.get_num_threads() if threads is None else None,
    }


def code_ingredients(code: str, **how: str) -> dict[str, Any]:
    """Everything that decides what running the Python `code` (a script's or a notebook's
    text) shows, as JSON-able values: the text itself; the sources of every module of
    `attention` it imports, directly or through others
    ([`sources`][attention_site.stored.sources]); the versions of Python, torch and every
    distribution it and those modules import; the CPU; and `how`, what else decides it (how
    the caller runs the code), as text.

    Raises:
        ValueError: `code` imports another module of the checkout (`attention_site`): what
            that runs is not followed, so it cannot be keyed.

    Examples:
        >>> a = code_ingredients("from attention import causal_mask", threads="1")
        >>> "attention/layer/masks.py" in a["sources"], "torch" in a["versions"], a["how"]
        (True, True, {'threads': '1'})
        >>> digest(a) == digest(code_ingredients("from attention import causal_mask"))
        False
    """
    hashes: dict[str, str] = {}
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in sorted(imports(code)):
        top = name.split(".")[0]
        if top == "attention":
            if _file(name, PACKAGE.parent) is not None:  # not `attention.SomeClass`
                found, used = _sources(name)
                hashes.update(found)
                versions.update(used)
        elif (CHECKOUT / top).is_dir() and (CHECKOUT / top / "__init__.py").is_file():
            raise ValueError(
                f"code imports {name}, a module of the checkout outside attention: what it "
                "runs is not followed, so the run cannot be stored"
            )
        elif top and top not in sys.stdlib_module_names and top != "__future__":
            versions.update(_versions(top))
    return {
        "code": code,
        "how": dict(sorted(how.items())),
        "sources": dict(sorted(hashes.items())),
        "versions": versions,
        "cpu": {"capability": torch.backends.cpu.get_cpu_capability(), "model": _cpu_model()},
    }


def digest(ingredients: dict[str, Any]) -> str:
    """The SHA-256 of `ingredients` (as sorted JSON): the run's key."""
    text = json.dumps(ingredients, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def location(function: Callable[..., Any], kwargs: dict[str, Any]) -> Path | None:
    """The file that holds `function(**kwargs)`, stored or not; None where nothing is stored
    (`ATTENTION_RUNS_CACHE=off`)."""
    return _path(function.__qualname__, ingredients(function, kwargs))


def _path(name: str, wanted: dict[str, Any]) -> Path | None:
    where = folder()
    return None if where is None else where / f"{name}-{digest(wanted)[:32]}.pkl"


def is_stored(function: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
    """Whether `function(**kwargs)` can be stored and is stored on disk: what `stored` would
    read back instead of running."""
    path = location(function, kwargs) if storable(function, kwargs) else None
    return path is not None and path.exists()


def stored(function: Callable[..., R], /, **kwargs: Any) -> R:
    """`function(**kwargs)`, read from disk where the same run was stored; else run and stored.

    What it reads is what it stored: the file holds the run's
    [`ingredients`][attention_site.stored.ingredients] beside the result, and a file whose
    ingredients differ, or that cannot be read whole, is run again and overwritten.

    Args:
        function: a module-level function of `attention`, e.g.
            [`train_induction`][attention.lab.heads.train_induction].
        **kwargs: its arguments, by name: plain values.

    Raises:
        TypeError: `function(**kwargs)` is not [`storable`][attention_site.stored.storable].
    """
    wanted = ingredients(function, kwargs)
    result, read = kept(function.__qualname__, wanted, lambda: function(**kwargs))
    if read:
        _read.append(wanted["function"])
    return result


def kept(name: str, wanted: dict[str, Any], make: Callable[[], R]) -> tuple[R, bool]:
    """`make()`, read from the file stored under `name` and the ingredients `wanted` where
    there is one, else run and stored; and whether it was read.

    The file holds the ingredients beside the result: one whose ingredients differ from
    `wanted`, or that cannot be read whole, is run again and overwritten. Nothing is stored
    where [`folder`][attention_site.stored.folder] is None.

    Args:
        name: the start of the file's name (the run's function, or what the caller runs).
        wanted: everything that decides what `make` returns
            ([`ingredients`][attention_site.stored.ingredients],
            [`code_ingredients`][attention_site.stored.code_ingredients]).
        make: computes the result, to be pickled.
    """
    path = _path(name, wanted)
    if path is None:
        return make(), False
    try:
        with path.open("rb") as f:
            found, result = pickle.load(f)
        if found == wanted:
            return result, True
    except _UNREADABLE:
        pass  # not stored yet, not whole, not a pair, or of a class gone since: run it
    result = make()
    _write(path, (wanted, result))
    return result, False


def read_back() -> list[str]:
    """The functions (`module.name`) whose runs [`stored`][attention_site.stored.stored] read
    from disk in this process since the last call, in order, instead of running them: the
    site's footer names them on the page that showed them.

    Examples:
        >>> _ = read_back()  # start afresh
        >>> read_back()
        []
    """
    names = list(dict.fromkeys(_read))
    _read.clear()
    return names


def _write(path: Path, value: object) -> None:
    """Pickle `value` into `path` atomically: a temporary file renamed into place. A folder
    that cannot be written stores nothing (the run is returned all the same)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.chmod(temporary, 0o644)  # mkstemp's 0o600 would hide it from the other users
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
