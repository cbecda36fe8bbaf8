"""The ring chapter's runs: one spawn of two CPU processes computes everything the page shows.

[`chapter_results`][attention_site.ring.chapter_results] starts two gloo processes once; each
checks ring attention against one process over the whole sequence, times one block's compute
against one block's transfer, trains the book's GPT with DDP, FSDP2 and the ring, and tries
torch's own `context_parallel` on the CPU. The page prints what comes back.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from attention import GPTModel
from attention.layer.masks import causal, everything
from attention.parallel import (
    causal_pairs,
    contiguous_shard,
    ring_attention,
    spawn,
    zigzag_shard,
)
from attention.parallel.blocks import block_attention
from attention.parallel.ring import held
from attention.parallel.training import train_steps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["GPT_TINY", "chapter_results", "ring_figure", "zigzag_figure"]

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
    out = ring_attention(mine[0], mine[1], mine[2], own)
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
    # forked from the build's worker, which has imported all they need: about 2 s less CPU
    # each than a fresh interpreter (2026-11-29); spawned off Linux (macOS's system libraries
    # are not safe to fork, Windows cannot)
    start = "fork" if sys.platform == "linux" else "spawn"
    ranks = spawn(_chapter, 2, ids, targets, timeout=120, start_method=start)
    return {"single": single, "ranks": ranks, "ids": ids}


def _colour(j: int, alpha: float = 0.55) -> tuple[float, float, float, float]:
    from attention_site.diagrams import _HEADS, _rgb

    return (*_rgb(_HEADS[j % len(_HEADS)]), alpha)


def ring_figure(world: int = 4) -> Figure:
    """The ring: `world` processes, each sending its key/value block on; and who holds which
    block at each step ([`held`][attention.parallel.ring.held]).

    Examples:
        >>> texts = [t.get_text() for t in ring_figure(3).axes[0].texts]
        >>> texts.count("K₂V₂"), "step 2" in texts  # block 2 is held once at each step
        (3, True)
    """
    from attention_site.diagrams import _Board, _sub

    if not 2 <= world <= 4:
        raise ValueError(f"world must be 2 to 4 to draw, got {world}")
    board = _Board(4.7, 2.9, "the ring: queries stay, key/value blocks travel")
    centre, radius = (1.0, 1.45), 0.7
    boxes = []
    for r in range(world):  # process 0 on top, then clockwise
        angle = math.pi / 2 - 2 * math.pi * r / world
        x, y = centre[0] + radius * math.cos(angle), centre[1] + radius * math.sin(angle)
        boxes.append(board.box(x, y, f"P{_sub(r)}: Q{_sub(r)}", fill=_colour(r, 0.3), size=9))
    for r in range(world):
        board.arrow(boxes[r], boxes[(r + 1) % world], bend="arc3,rad=-0.3")
    board.text(centre[0], centre[1], "K, V →\nnext", size=9)
    left, top, cell = 2.6, 2.25, 0.5
    for r in range(world):
        board.text(left + (r + 0.5) * cell, top + 0.14, f"P{_sub(r)}", size=9)
    for step in range(world):
        y = top - (step + 0.5) * cell * 0.62
        board.text(left - 0.08, y, f"step {step}", size=9, ha="right")
        for r in range(world):
            j = held(r, step, world)
            board.box(left + (r + 0.5) * cell, y, f"K{_sub(j)}V{_sub(j)}", w=cell - 0.04,
                      h=cell * 0.56, fill=_colour(j, 0.3), size=9)  # fmt: skip
    return board.done("a step: compute the block held, while the next one arrives")


def zigzag_figure(num_tokens: int = 16, world: int = 4) -> Figure:
    """Who computes which (query, key) pairs under a causal mask: contiguous against zigzag
    shards, each query's row in its process's colour, and the pairs each process computes
    ([`causal_pairs`][attention.parallel.shards.causal_pairs]).

    Examples:
        >>> texts = [t.get_text() for t in zigzag_figure(8, 2).axes[0].texts]
        >>> "pairs: 10, 26" in texts, "pairs: 18, 18" in texts
        (True, True)
    """
    from attention_site.diagrams import _Board, _sub

    if not 2 <= world <= 4 or not 2 * world <= num_tokens <= 16:
        raise ValueError(f"draw 2 to 4 processes and 2 world to 16 tokens, got {world}, "
                         f"{num_tokens}")  # fmt: skip
    board = _Board(4.7, 3.3, "causal work per process: contiguous and zigzag")
    cell = 2.1 / num_tokens
    for n, (layout, shard) in enumerate((("contiguous", contiguous_shard),
                                         ("zigzag", zigzag_shard))):  # fmt: skip
        owner = [0] * num_tokens
        for r in range(world):
            for i in shard(torch.arange(num_tokens)[None], None, r, world)[1][0].tolist():
                owner[i] = r
        left = 0.15 + n * 2.35
        face = functools.partial(_owned, owner)
        board.cells(left, 2.85, num_tokens, num_tokens, face, cell)
        board.text(left + 1.05, 3.0, layout, size=10)
        pairs = causal_pairs(num_tokens, world, layout)
        board.text(left + 1.05, 0.55, "pairs: " + ", ".join(map(str, pairs)), size=9)
    board.legend(0.15, 0.2, [(_colour(r), f"P{_sub(r)}") for r in range(world)], dx=0.8, dy=0)
    return board.fig


def _owned(owner: list[int], i: int, j: int) -> Any:
    """Query `i`, key `j`: its process's colour where the causal mask lets it see, else grey."""
    from attention_site.diagrams import _FAINT_INK

    return _colour(owner[i]) if j <= i else _FAINT_INK
