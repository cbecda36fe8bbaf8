"""attention_site.stored: a training stored on disk under a key of everything that produces it."""

from __future__ import annotations

import pickle
import shutil
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest
import torch

from attention.lab.heads import train_induction
from attention_site import runs, stored
from attention_site.stored import digest, ingredients, location, sources

TINY = {"seed": 3, "steps": 4, "n": 4, "batch_size": 2, "emb_dim": 8, "n_heads": 2,
        "log_every": 2}  # fmt: skip
"""A training of a few milliseconds: what is stored, not what is learned."""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATTENTION_RUNS_CACHE", str(tmp_path / "runs"))
    return tmp_path / "runs"


@pytest.mark.slow(seconds=1)
def test_the_key_changes_with_the_code_the_training_imports(tmp_path: Path) -> None:
    shutil.copytree(stored.PACKAGE, tmp_path / "attention")
    before, outside = sources("attention.lab.heads", tmp_path)
    assert {"attention/lab/heads.py", "attention/model/gpt.py", "attention/layer/multihead.py",
            "attention/lab/__init__.py", "attention/data/sample.txt"} <= set(before)  # fmt: skip
    assert "attention/lab/english.py" not in before and "torch" in outside
    with (tmp_path / "attention/lab/english.py").open("a") as f:
        f.write("\n# a module the induction training does not import\n")
    assert sources("attention.lab.heads", tmp_path)[0] == before
    for changed in ("attention/model/gpt.py", "attention/data/sample.txt"):  # code, data
        with (tmp_path / changed).open("a") as f:
            f.write("\n# changed\n")
        after = sources("attention.lab.heads", tmp_path)[0]
        assert after != before and after[changed] != before[changed], changed
        before = after
    with pytest.raises(ValueError, match="module must be a module of attention"):
        sources("attention.lab.nothing", tmp_path)


@pytest.mark.slow(seconds=1)
def test_the_key_changes_with_the_config_not_with_how_it_is_spelled() -> None:
    page = digest(ingredients(train_induction, {"seed": 0, "context_length": 64}))
    spelled = {"seed": 0, "steps": 700, "lr": 3e-3, "context_length": 64}  # the defaults
    assert digest(ingredients(train_induction, spelled)) == page
    for other in ({"seed": 1}, {"steps": 699}, {"lr": 3.1e-3}, {"context_length": None}):
        assert digest(ingredients(train_induction, {**spelled, **other})) != page, other
    as_bool, as_int = ({"seed": value} for value in (True, 1))  # equal, of other types
    assert digest(ingredients(train_induction, as_bool)) != digest(
        ingredients(train_induction, as_int)
    )
    found = ingredients(train_induction, {"seed": 0})
    assert found["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert found["versions"]["torch"] == torch.__version__ and found["threads"] is None
    unpinned = ingredients(train_induction, {"num_threads": None})  # runs on the process's
    assert unpinned["threads"] == torch.get_num_threads()


def test_a_stored_run_equals_a_fresh_one(folder: Path) -> None:
    assert not stored.is_stored(train_induction, TINY)
    first = stored.stored(train_induction, **TINY)  # trained, then written
    assert stored.is_stored(train_induction, TINY)
    assert not stored.is_stored(train_induction, {**TINY, "seed": 4})
    (path,) = folder.iterdir()
    assert path == location(train_induction, TINY) and path.name.startswith("train_induction-")
    again = stored.stored(train_induction, **TINY)  # read: the first run's own timing
    assert again is not first and again.seconds == first.seconds
    fresh = train_induction(**TINY)  # the same computation, on one thread: the same floats
    assert fresh.seconds != first.seconds
    for run in (first, again):
        assert run.loss_repeated == fresh.loss_repeated and run.induction == fresh.induction
        torch.testing.assert_close(run.model.state_dict(), fresh.model.state_dict(), rtol=0,
                                   atol=0)  # fmt: skip
    other = stored.stored(train_induction, **{**TINY, "seed": 4})  # another key, another file
    assert len(list(folder.iterdir())) == 2 and other.loss_repeated != first.loss_repeated


@pytest.mark.slow(seconds=1)
def test_a_file_that_is_not_this_runs_is_trained_again(folder: Path) -> None:
    first = stored.stored(train_induction, **TINY)
    path = location(train_induction, TINY)
    assert path is not None
    wanted, _ = pickle.loads(path.read_bytes())
    path.write_bytes(pickle.dumps(({**wanted, "function": "another"}, "a stale result")))
    run = stored.stored(train_induction, **TINY)
    assert run != "a stale result" and run.seconds != first.seconds  # trained again
    path.write_bytes(path.read_bytes()[:100])  # cut short
    assert stored.stored(train_induction, **TINY).loss_repeated == first.loss_repeated
    assert pickle.loads(path.read_bytes())[0] == wanted  # and written whole again
    assert [p.name for p in folder.iterdir()] == [path.name]  # no temporary file left


def test_off_stores_nothing_and_only_the_packages_functions_are_stored(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def square(x: int) -> int:
        return x * x

    assert not stored.storable(square, {"x": 2})  # not a module-level function of attention
    assert not stored.storable(train_induction, {"seed": [0]})  # not a plain value
    assert not stored.storable(train_induction, {"seeds": 0})  # not a parameter
    with pytest.raises(TypeError, match=r"cannot store 'test_off_stores.*square'"):
        stored.stored(square, x=2)
    assert runs.once(square, x=3) == 9 and not folder.exists()  # once keeps it in memory
    monkeypatch.setenv("ATTENTION_RUNS_CACHE", "off")
    assert location(train_induction, TINY) is None
    stored.stored(train_induction, **TINY)
    assert not folder.exists()


class Refuses(Executor):
    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a stored run was started again")


def test_a_stored_run_is_not_prefetched_but_must_still_be_asked_for(folder: Path) -> None:
    kwargs = {**TINY, "seed": 11}  # a key no other test of this process asks `once` for
    first = stored.stored(train_induction, **kwargs)
    runs.prefetch(Refuses(), train_induction, **kwargs)
    assert any("train_induction(" in name and "seed=11" in name for name in runs.waiting())
    run = runs.once(train_induction, **kwargs)
    assert run.seconds == first.seconds and runs.once(train_induction, **kwargs) is run
    assert not any("seed=11" in name for name in runs.waiting())


def test_what_once_read_from_disk_is_named_once_for_each_page(folder: Path) -> None:
    """The footer of a page that shows a stored run says so: `from_disk` names the runs `once`
    returned from disk since it was last asked, each time a page asks for one again (the
    first page read the file; the second gets it from memory, still not computed here), and
    nothing for a run this process computed."""
    name = "attention.lab.heads.train_induction"
    runs.from_disk()
    computed = {**TINY, "seed": 12}  # keys no other test of this process asks `once` for
    runs.once(train_induction, **computed)  # trained here: computed by this build
    assert runs.from_disk() == []
    kept = {**TINY, "seed": 13}
    stored.stored(train_induction, **kept)  # as an earlier build or test run left it
    stored.read_back()
    runs.once(train_induction, **kept)  # one page
    assert runs.from_disk() == [name]
    runs.once(train_induction, **kept)  # the next page, from memory
    runs.once(train_induction, **computed)
    assert runs.from_disk() == [name] and runs.from_disk() == []


def test_code_is_keyed_by_its_text_the_modules_it_imports_and_how_it_runs() -> None:
    """`code_ingredients`: a notebook's run is keyed by what decides its outputs."""
    code = "import math\nimport matplotlib.pyplot as plt\nfrom attention import causal_mask\n"
    found = stored.code_ingredients(code, threads="1")
    assert "attention/__init__.py" in found["sources"]  # what `import attention` runs
    assert "attention/layer/masks.py" in found["sources"]
    assert {"python", "torch", "matplotlib"} <= set(found["versions"])  # math: the stdlib
    assert found["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    key = digest(found)
    assert digest(stored.code_ingredients(code, threads="1")) == key  # the same run
    for other in (
        stored.code_ingredients(code + "print(1)\n", threads="1"),  # the text
        stored.code_ingredients(code, threads="2"),  # how it runs
        stored.code_ingredients(code),
    ):
        assert digest(other) != key
    layer_only = stored.code_ingredients("from attention.layer.masks import causal")
    assert "attention/layer/masks.py" in layer_only["sources"]
    assert "attention/lab/heads.py" not in layer_only["sources"]  # not imported on the way
    with pytest.raises(ValueError, match=r"attention_site\.plot, a module of the checkout"):
        stored.code_ingredients("from attention_site.plot import svg")


def test_kept_runs_once_per_ingredients_and_reads_back_only_its_own(folder: Path) -> None:
    calls: list[int] = []

    def make() -> list[int]:
        calls.append(1)
        return [len(calls)]

    wanted = stored.code_ingredients("import torch")
    assert stored.kept("run", wanted, make) == ([1], False)  # run and stored
    assert stored.kept("run", wanted, make) == ([1], True)  # read back
    assert stored.kept("run", {**wanted, "how": {"x": "1"}}, make) == ([2], False)  # another key
    (path,) = [p for p in folder.iterdir() if digest(wanted)[:32] in p.name]
    with path.open("wb") as f:  # under this key, another run's ingredients: not this run
        pickle.dump(({**wanted, "code": "import math"}, [99]), f)
    assert stored.kept("run", wanted, make) == ([3], False)
    for junk in (pickle.dumps(7), pickle.dumps((1, 2, 3)), b"not a pickle"):
        path.write_bytes(junk)  # not an (ingredients, result) pair: run again, not raised
        assert stored.kept("run", wanted, make)[1] is False
    assert stored.kept("run", wanted, make) == ([6], True)
    assert len(calls) == 6
