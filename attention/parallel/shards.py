r"""Splitting a sequence between processes: contiguous or zigzag, with each token's position.

With a causal mask, query $i$ sees $i + 1$ keys, so a contiguous split gives the last process
the most work: of $T$ tokens in $P$ equal parts, process $r$ computes
$\sum_{i \in \text{part } r} (i + 1)$ pairs, from $\approx T^2 / 2P^2$ for the first to
$\approx (2P - 1)\, T^2 / 2P^2$ for the last. **Zigzag** cuts the sequence into $2P$ chunks and
gives process $r$ chunks $r$ and $2P - 1 - r$, one from each end: every process then does the
same work, to within one chunk's diagonal.

Each shard comes with its tokens' positions, which is all that
[`ring_attention`][attention.parallel.ring.ring_attention] needs to apply the mask.

Examples:
    >>> x = torch.arange(8)[None]  # (batch, tokens): token i holds i
    >>> [zigzag_shard(x, None, rank, 2)[1].tolist() for rank in range(2)]
    [[[0, 1, 6, 7]], [[2, 3, 4, 5]]]
    >>> pieces = [zigzag_shard(x, None, rank, 2)[0] for rank in range(2)]
    >>> zigzag_unshard(pieces)
    tensor([[0, 1, 2, 3, 4, 5, 6, 7]])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attention.checks import check_size

__all__ = ["causal_pairs", "contiguous_shard", "zigzag_shard", "zigzag_unshard"]


def _positions(x: Tensor, positions: Tensor | None, dim: int) -> Tensor:
    """`positions` `(batch, tokens)`, checked, or `0 ... tokens - 1` for every row."""
    num_tokens = x.shape[dim]
    if positions is None:
        return torch.arange(num_tokens, device=x.device).expand(x.shape[0], num_tokens)
    if positions.shape != (x.shape[0], num_tokens):
        raise ValueError(
            f"positions must be (batch, tokens) = {(x.shape[0], num_tokens)}, "
            f"got {tuple(positions.shape)}"
        )
    return positions


def _check(rank: int, world: int, chunks: int, num_tokens: int) -> None:
    check_size("world", world)
    check_size("rank", rank, minimum=0)
    if rank >= world:
        raise ValueError(f"rank must be in 0 .. world - 1 = {world - 1}, got {rank}")
    if num_tokens < chunks:
        raise ValueError(f"{num_tokens} tokens cannot be cut into {chunks} chunks")


def contiguous_shard(
    x: Tensor, positions: Tensor | None, rank: int, world: int, *, dim: int = 1
) -> tuple[Tensor, Tensor]:
    """Process `rank`'s part of `x` cut into `world` consecutive parts, and its positions.

    Args:
        x: the whole sequence, batch first, tokens along `dim`.
        positions: `(batch, tokens)`, or None: `0 ... tokens - 1`.
        rank: the process.
        world: the processes.
        dim: the tokens' dimension.

    Returns:
        `(x's part, its positions (batch, part))`.
    """
    _check(rank, world, world, x.shape[dim])
    pos = _positions(x, positions, dim)
    return x.tensor_split(world, dim=dim)[rank], pos.tensor_split(world, dim=1)[rank]


def zigzag_shard(
    x: Tensor, positions: Tensor | None, rank: int, world: int, *, dim: int = 1
) -> tuple[Tensor, Tensor]:
    """Process `rank`'s chunks `rank` and `2 world - 1 - rank` of `x` cut into `2 world`.

    Args and Returns as [`contiguous_shard`][attention.parallel.shards.contiguous_shard].
    """
    _check(rank, world, 2 * world, x.shape[dim])
    pos = _positions(x, positions, dim)
    first, last = rank, 2 * world - 1 - rank
    chunks, pos_chunks = x.tensor_split(2 * world, dim=dim), pos.tensor_split(2 * world, dim=1)
    return (
        torch.cat((chunks[first], chunks[last]), dim=dim),
        torch.cat((pos_chunks[first], pos_chunks[last]), dim=1),
    )


def zigzag_unshard(pieces: Sequence[Tensor], *, dim: int = 1) -> Tensor:
    """The inverse of [`zigzag_shard`][attention.parallel.shards.zigzag_shard]: every rank's
    piece, in rank order, back into the whole sequence."""
    world = len(pieces)
    num_tokens = sum(p.shape[dim] for p in pieces)
    sizes = [len(c) for c in torch.arange(num_tokens).tensor_split(2 * world)]  # chunk sizes
    front, back = [], []
    for rank, piece in enumerate(pieces):
        a, b = piece.split([sizes[rank], sizes[2 * world - 1 - rank]], dim=dim)
        front.append(a)
        back.append(b)
    return torch.cat(front + back[::-1], dim=dim)


def causal_pairs(num_tokens: int, world: int, layout: str = "zigzag") -> list[int]:
    """The (query, key) pairs a causal mask lets each process compute: its work.

    Examples:
        >>> causal_pairs(8, 2, "contiguous"), causal_pairs(8, 2, "zigzag")
        ([10, 26], [18, 18])
    """
    shard = {"zigzag": zigzag_shard, "contiguous": contiguous_shard}[layout]
    line = torch.arange(num_tokens)[None]  # (1, T)
    return [int((shard(line, None, r, world)[1] + 1).sum()) for r in range(world)]
