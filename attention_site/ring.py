"""The ring chapter's runs: one spawn of two CPU processes computes everything the page shows.

[`chapter_results`][attention_site.ring.chapter_results] starts two gloo processes once; each
checks ring attention against one process over the whole sequence, times one block's compute
against one block's transfer, trains the book's GPT with DDP, FSDP2 and the ring, and tries
torch's own `context_parallel` on the CPU. The page prints what comes back.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from attention import GPTModel
from attention.layer.masks import causal, everything
from attention.parallel import ring_attention, spawn, zigzag_shard
from attention.parallel.blocks import block_attention
from attention.parallel.training import train_steps

__all__ = ["GPT_TINY", "chapter_results"]

GPT_TINY = {"vocab_size": 50, "context_length": 16, "emb_dim": 16, "n_heads": 4, "n_layers": 2,
            "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
"""The GPT trained on the page: the book's model, tiny, with 16 positions."""

SIZES = (32, 128, 512)
"""Tokens per block timed: compute against transfer."""


def _ring_error(rank: int, world: int) -> float:
    """The largest difference between this process's ring output and one process's (float64)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 16, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(16)[None]
    whole, _ = block_attention(q, k, v, pos, pos, causal())  # one block: the whole sequence
    mine = [zigzag_shard(t, pos, rank, world, dim=2)[0] for t in (q, k, v, whole)]
    own = zigzag_shard(pos, pos, rank, world)[1]
    out = ring_attention(*mine[:3], own)
    return float((out - mine[3]).abs().max())


def _median_ms(fn: Any, repeat: int = 3) -> float:
    fn()  # once to warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[repeat // 2]


def _timing(rank: int, n: int) -> tuple[int, float, float]:
    """One block of `n` tokens (8 heads of 64, float32): compute ms, one-way transfer ms."""
    q, k, v = (torch.randn(1, 8, n, 64) for _ in range(3))
    pos = torch.arange(n)[None]
    compute = _median_ms(lambda: block_attention(q, k, v, pos, pos, everything()))

    def ping() -> None:  # k and v there and back: one step's transfer, twice
        for sender in (0, 1):
            for t in (k, v):
                (dist.send if rank == sender else dist.recv)(t, 1 - rank)

    dist.barrier()
    return n, compute, _median_ms(ping) / 2


def _context_parallel(world: int) -> str:
    """What torch's `context_parallel` does with gloo processes on the CPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (world,))
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except NotImplementedError as error:
        return f"NotImplementedError: {str(error).splitlines()[0]}"
    return "it ran"


def _chapter(rank: int, world: int, ids: Tensor, targets: Tensor) -> dict[str, Any]:
    make = functools.partial(GPTModel, GPT_TINY)
    return {
        "ring_error": _ring_error(rank, world),
        "timings": [_timing(rank, n) for n in SIZES],
        "training": {
            how: train_steps(rank, world, make, ids, targets, how)
            for how in ("ddp", "fsdp", "ring")
        },
        "context_parallel": _context_parallel(world),
        "tokens": zigzag_shard(ids, None, rank, world)[0].shape[1],
    }


def chapter_results() -> dict[str, Any]:
    """Everything the page shows: one process's training, then rank 0's and rank 1's runs.

    Returns:
        `single` (one process's `train_steps`), `ranks` (each process's dict: `ring_error`,
        `timings`, `training` by way, `context_parallel`, `tokens` it held), `ids`.
    """
    seq = torch.randint(0, 50, (4, 17), generator=torch.Generator().manual_seed(1))
    ids, targets = seq[:, :-1], seq[:, 1:]  # (4, 16): the next token of each
    single = train_steps(0, 1, functools.partial(GPTModel, GPT_TINY), ids, targets, "single")
    ranks = spawn(_chapter, 2, ids, targets, timeout=120)
    return {"single": single, "ranks": ranks, "ids": ids}
