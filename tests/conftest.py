"""Shared fixtures: the device every equivalence test runs on, and small seeded inputs.

And how the suite runs on several cores: `nox -s tests` runs pytest with `--dist loadgroup`
and one pytest-xdist worker per core (at most 4). See `pytest_collection_modifyitems` for the
order and the groups the workers are handed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attention.lab.threads import torch_threads

CUDA = torch.cuda.is_available()

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
"""How many pytest-xdist workers run the suite: 0 in a process that runs no tests for xdist."""

GROUPS = "attention_groups"
"""The `workerinput` key of the folder where the workers write each test's group."""


def cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):  # Linux: what taskset or a container allows
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def pytest_configure(config: pytest.Config) -> None:
    """Under `ATTENTION_DEVICE=cuda` (the GPU sessions), a missing GPU is an error, not a skip.

    In an xdist worker, torch gets at most the worker's share of the cores as intra-op
    threads (fewer where `OMP_NUM_THREADS` says so): two workers of two threads each on two
    cores wait on each other's threads, and the suite runs slower than in one process.
    """
    if os.environ.get("ATTENTION_DEVICE", "cpu").startswith("cuda") and not CUDA:
        raise pytest.UsageError(
            f"ATTENTION_DEVICE=cuda but torch {torch.__version__} (CUDA build: "
            f"{torch.version.cuda}) sees no CUDA device: refusing to skip every CUDA test. "
            "Run on a GPU machine with a CUDA torch build, or unset ATTENTION_DEVICE."
        )
    if WORKERS:
        torch.set_num_threads(max(1, min(torch.get_num_threads(), cores() // WORKERS)))


PORTABLE = torch.backends.cpu.get_cpu_capability() == "DEFAULT"
"""This process runs torch's portable kernels (`ATEN_CPU_CAPABILITY=default`)."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip an `inductor` test on the CPU under the portable kernels.

    There inductor generates scalar C++, which torch 2.13 fails to build
    (`'at::vec' has not been declared`); `.ci/run` runs these tests natively (`-m inductor`).
    """
    if PORTABLE and item.get_closest_marker("inductor") is not None:
        callspec = getattr(item, "callspec", None)
        device = str(callspec.params.get("device", "cpu")) if callspec else "cpu"
        if not device.startswith("cuda"):
            pytest.skip("inductor on the CPU under ATEN_CPU_CAPABILITY=default: run natively")


@pytest.hookimpl(trylast=True)  # the final list: after -k and -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: the slow tests first, and the users of a shared fixture grouped.

    The workers are handed one test (or one group) at a time, in this order, to whichever is
    free: the longest tests (`slow(seconds=...)` or `heavy(seconds=...)`, longest first, then
    the other `slow` and `heavy` ones) start first, side by side, and the short tests fill
    the gaps. Handed out later, two long tests could queue behind each other on one worker: a
    worker holds up to three tests ahead, and the last to finish sets the wall time. A test that takes a module- or
    session-scoped fixture of ours is grouped with that fixture's other users, so the fixture
    (the RNN experiment's trained seeds, the 124M model) is built once, on one worker.
    """
    if not WORKERS:
        return

    def order(item: pytest.Item) -> tuple[bool, float]:
        marks = [m for name in ("slow", "heavy") for m in item.iter_markers(name)]
        return not marks, -max((float(m.kwargs.get("seconds", 0)) for m in marks), default=0)

    items.sort(key=order)  # stable: the collection order within each rank
    groups: dict[str, str] = {}
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}  # fmt: skip
        info = getattr(item, "_fixtureinfo", None)  # None for a doctest
        shared = sorted(
            name
            for name, defs in (info.name2fixturedefs.items() if info else ())
            if defs[-1].scope in ("module", "package", "session") and defs[-1].baseid
        )  # a baseid: defined in this tree, not by a plugin (pytest's tmp_path_factory)
        if shared:
            names.add(f"{item.path.name}:{','.join(shared)}")
        if names:
            groups[item.nodeid] = "+".join(sorted(names))
    workerinput = getattr(config, "workerinput", {})  # set by xdist in its workers
    if GROUPS in workerinput:
        path = os.path.join(workerinput[GROUPS], f"{workerinput['workerid']}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(groups, f)
        os.replace(path + ".tmp", path)


# --dist loadgroup, with the groups above. xdist 3.8's own loadgroup finds the groups in node
# ids that it rewrites, which pytest 9.2 no longer lets it do (pytest-xdist issue #1386): every
# test would be scheduled on its own. Here the workers write the groups to a file instead.


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """In the xdist controller: a folder for the groups the workers collect."""
    stash = node.config.stash
    if _GROUPS_FOLDER not in stash:
        stash[_GROUPS_FOLDER] = tempfile.mkdtemp(prefix="attention-groups-")
    node.workerinput[GROUPS] = stash[_GROUPS_FOLDER]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` that reads the groups from the workers' file."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Scheduling(LoadGroupScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def schedule(self) -> None:
            config.option.loadscopereorder = False  # the workers' order, not the largest group
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # every worker has collected by now: read one's file
                folder = config.stash[_GROUPS_FOLDER]
                files = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
                self.groups = {}  # none written: tests/ was not collected, nothing grouped
                if files:
                    with open(os.path.join(folder, files[0]), encoding="utf-8") as f:
                        self.groups = json.load(f)
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return Scheduling(config, log)


_GROUPS_FOLDER = pytest.StashKey[str]()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GROUPS_FOLDER in config.stash:
        shutil.rmtree(config.stash[_GROUPS_FOLDER], ignore_errors=True)


@pytest.fixture(
    params=[
        "cpu",
        pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="CUDA is not available")),
    ]
)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Each test that takes `device` runs on the CPU, and on CUDA where there is one."""
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny sequential steps: a second intra-op thread only waits (on a busy CPU, for long)."""
    with torch_threads(1):
        yield
