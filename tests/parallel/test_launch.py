"""attention.parallel.launch: processes joined by torch.distributed, started each way."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
import torch.distributed as dist

from attention.parallel import launch
from attention.parallel.launch import spawn

FORK = "fork" in multiprocessing.get_all_start_methods()


def _sum_of_ranks(rank: int, world: int, scale: int) -> tuple[int, float]:
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    return rank, scale * float(total)


def _fails_on_rank_1(rank: int, world: int) -> int:
    if rank == 1:
        raise KeyError("only rank 1")
    return rank


@pytest.mark.skipif(not FORK, reason="this platform has no fork")
def test_forked_processes_form_one_group_and_return_by_rank() -> None:
    assert spawn(_sum_of_ranks, 3, 10, start_method="fork", timeout=30) == [
        (0, 60.0),
        (1, 60.0),
        (2, 60.0),
    ]  # 10 * (1 + 2 + 3) on every rank


@pytest.mark.skipif(not FORK, reason="this platform has no fork")
def test_a_forked_process_that_raises_is_named_with_its_traceback() -> None:
    with pytest.raises(
        RuntimeError, match=r"(?s)1 of 2 processes failed\nrank 1:\n.*KeyError: .only rank 1."
    ):
        spawn(_fails_on_rank_1, 2, start_method="fork", timeout=30)


@pytest.mark.parametrize("method", ["thread", "Fork", "", None])
def test_an_unknown_start_method_is_refused_before_any_process_starts(method: object) -> None:
    with pytest.raises(ValueError, match=r"start_method must be one of \[.*'spawn'.*\] here, got"):
        spawn(_sum_of_ranks, 2, 1, start_method=method)  # type: ignore[arg-type]


def test_fork_after_cuda_was_initialised_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    if not FORK:
        pytest.skip("this platform has no fork")
    monkeypatch.setattr(launch.torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(ValueError, match=r'start_method="fork" cannot be used: CUDA'):
        spawn(_sum_of_ranks, 2, 1, start_method="fork")
