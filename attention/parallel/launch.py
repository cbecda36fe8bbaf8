"""Starting a few processes on one machine that form a process group, with bounded waits.

[`spawn`][attention.parallel.launch.spawn] runs `fn(rank, world, *args)` in `world` new
processes joined by `torch.distributed` (gloo by default: CPUs; `nccl` for one GPU each), and
returns what each returned. Every wait is bounded: the group's collectives time out after
`timeout` seconds, and a process that has not finished by then is ended, so a failure raises
here instead of hanging a test or a page's build.
"""

from __future__ import annotations

import io
import os
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["START_METHODS", "free_port", "spawn"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _worker(
    rank: int,
    world: int,
    port: int,
    backend: str,
    timeout: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    """One process: join the group, run `fn`, send back its result (or its error's text)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # several processes share the cores
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout)
        )
        out = fn(rank, world, *args)
        buffer = io.BytesIO()
        torch.save(out, buffer)  # tensors as bytes: no shared memory outlives the process
        results.put((rank, True, buffer.getvalue()))
    except BaseException:  # every error goes back to the parent, by rank
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


START_METHODS = ("spawn", "forkserver", "fork")
"""How [`spawn`][attention.parallel.launch.spawn] can start its processes (multiprocessing's)."""


def spawn(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    backend: str = "gloo",
    timeout: float = 60.0,
    start_method: str = "spawn",
) -> list[Any]:
    """`fn(rank, world, *args)` in `world` processes of one group; their results by rank.

    Args:
        fn: a module-level function (it is pickled into each process).
        world: the processes.
        args: more arguments for `fn` (picklable).
        backend: `"gloo"` (CPU) or `"nccl"` (a GPU per process).
        timeout: seconds any collective may wait, and the whole run (plus start-up) may take.
        start_method: `"spawn"` (a fresh interpreter each: safe anywhere, and each imports
            torch again, about 2 s of CPU); `"forkserver"` (each a copy of one server
            process, a fresh interpreter started once: it imports what `fn` needs once for
            all); `"fork"` (each a copy of this process, which imports nothing again: on
            Linux, from a process with no other thread at work and no CUDA initialised).

    Returns:
        What each rank's `fn` returned, rank 0 first.

    Raises:
        ValueError: an unknown `start_method`, one this platform lacks, or `"fork"` after
            CUDA was initialised here (a forked process cannot use it).
        RuntimeError: a process raised (its traceback quoted, by rank), or the run took too long.
    """
    here = [method for method in START_METHODS if method in mp.get_all_start_methods()]
    if start_method not in here:
        raise ValueError(f"start_method must be one of {here} here, got {start_method!r}")
    if start_method == "fork" and torch.cuda.is_initialized():
        cuda = 'CUDA is initialised in this process, which a fork cannot use: use "spawn"'
        raise ValueError(f'start_method="fork" cannot be used: {cuda}')
    context: Any = mp.get_context(start_method)  # each kind has .Process and .Queue
    results = context.Queue()
    port = free_port()
    procs = [
        context.Process(
            target=_worker,
            args=(rank, world, port, backend, timeout, fn, args, results),
            daemon=True,
        )
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    got: dict[int, tuple[bool, Any]] = {}
    try:
        for _ in range(world):
            rank, ok, value = results.get(timeout=timeout + 60)  # start-up: imports
            got[rank] = (ok, value)
    except Exception as error:  # the queue's Empty: a process hung or died
        raise RuntimeError(
            f"spawn: only ranks {sorted(got)} of {world} answered within {timeout + 60:.0f} s"
        ) from error
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    failed = {rank: value for rank, (ok, value) in got.items() if not ok}
    if failed:
        told = "\n".join(f"rank {rank}:\n{text}" for rank, text in sorted(failed.items()))
        raise RuntimeError(f"spawn: {len(failed)} of {world} processes failed\n{told}")
    return [torch.load(io.BytesIO(got[rank][1]), weights_only=False) for rank in range(world)]
