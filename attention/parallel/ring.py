r"""Ring attention: each process keeps its queries and passes its key/value block around a ring.

$P$ processes each hold one shard of a sequence: queries, keys and values of their tokens, and
the tokens' positions. At step $t = 0 \dots P-1$ process $r$ holds the key/value block of
process $(r - t) \bmod P$; it starts sending that block to $r + 1$ and receiving the next from
$r - 1$ (`batch_isend_irecv`), computes its queries against the block it holds while the
transfer runs ([`attention.parallel.blocks`][attention.parallel.blocks]), and merges the
result by the log-sum-exp rule ([`merge`][attention.layer.split_kv.merge]). After $P$ steps
every query has seen every key: the output is attention over the whole sequence, though no
process ever held more than two blocks. A block that the mask's bounds certainly hide from a
process's queries is passed on without being computed.

The backward runs the same ring: the key/value block travels again, with the gradients
$dK, dV$ that each process adds for its own queries; after $P$ steps they arrive back at the
block's owner. $dQ$ stays home.

Before the ring, every process sends every other a short description of its shard (one
`all_gather_object`, bounded by the group's timeout): a wrong shard raises the same error on
every process, instead of leaving the others waiting for a block that never comes. A wrong
`mask` or `score_mods` on one process is sent the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from attention.layer.masks import Mask, as_mask, causal
from attention.layer.score_mods import ScoreMod, as_score_mods
from attention.layer.split_kv import merge
from attention.layer.tiled import hidden
from attention.parallel.blocks import block_attention, block_backward

__all__ = ["Shard", "held", "ring_attention"]


def held(rank: int, step: int, world: int) -> int:
    """Whose key/value block process `rank` holds at `step`: $(r - t) \\bmod P$.

    Examples:
        >>> [[held(r, t, 3) for r in range(3)] for t in range(3)]  # steps down, processes across
        [[0, 1, 2], [2, 0, 1], [1, 2, 0]]
    """
    return (rank - step) % world


@dataclass(frozen=True)
class Shard:
    """What one process holds, as every process learns it before the ring starts.

    Attributes:
        rank: the process's rank in the group.
        tokens: its tokens (the shard's length).
        low: its smallest position among real tokens.
        high: its largest (`low > high`: no real token).
        shapes: the shapes of its `(q, k, v)`.
        dtype: their dtype, as a string.
        error: what is wrong with this process's arguments, or None.
        kind: the error's class: `"ValueError"`, or `"TypeError"` for a mask or score modifier
            of the wrong kind.
        rule: its mask and score modifiers, by name: every process must give the same.
        positions: its tokens' positions `(batch, tokens)` on the CPU, for the check that no
            position is on two processes.
    """

    rank: int
    tokens: int
    low: int
    high: int
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    error: str | None
    kind: str = "ValueError"
    rule: str = ""
    positions: Tensor | None = None


def describe(
    rank: int,
    q: Any,
    k: Any,
    v: Any,
    positions: Any,
    wrong: Exception | None = None,
    rule: str = "",
) -> Shard:
    """This process's [`Shard`][attention.parallel.ring.Shard], its arguments checked here
    (`wrong`: what checking its mask and score modifiers raised; `rule`: their names)."""
    if wrong is not None:
        return Shard(rank, 0, 0, -1, (), "", str(wrong), type(wrong).__name__)
    error = local_error(q, k, v, positions)
    if error is not None:
        return Shard(rank, 0, 0, -1, (), "", error)
    real = positions[positions >= 0]
    low, high = (int(real.min()), int(real.max())) if real.numel() else (0, -1)
    shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    return Shard(
        rank,
        q.shape[2],
        low,
        high,
        shapes,
        str(q.dtype),
        None,
        rule=rule,
        positions=positions.detach().to("cpu", torch.long),
    )


def shared_position(shards: Sequence[Shard]) -> str | None:
    """Where two processes hold the same position of one row (each token is on one process),
    named; None where every position is on one process only."""
    held_by = [(s.rank, s.positions) for s in shards if s.positions is not None]
    if not held_by:
        return None
    for row in range(held_by[0][1].shape[0]):
        line = torch.cat([p[row] for _, p in held_by])
        owner = torch.cat([torch.full_like(p[row], rank) for rank, p in held_by])
        real = line >= 0
        line, owner = line[real], owner[real]
        order = torch.sort(line, stable=True).indices
        line, owner = line[order], owner[order]
        twice = (line[1:] == line[:-1]).nonzero()
        if twice.numel():
            i = int(twice[0, 0])
            a, b = int(owner[i]), int(owner[i + 1])
            where = f"twice on rank {a}" if a == b else f"on rank {a} and rank {b}"
            return (
                f"position {int(line[i])} of row {row} is {where}: each token has its own "
                "position, on one process (the whole sequence's, not each shard's "
                "own)"
            )
    return None


def local_error(q: Any, k: Any, v: Any, positions: Any) -> str | None:
    """What is wrong with one process's own tensors (named), or None."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.ndim != 4 or not t.is_floating_point():
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            return f"{name} must be a floating tensor (batch, heads, tokens, head_dim), got {got}"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    b, h, num_tokens, d = q.shape
    if k.shape[:3] != v.shape[:3] or k.shape[0] != b or k.shape[2] != num_tokens:
        return (
            f"k and v must be (batch={b}, kv_heads, tokens={num_tokens}, head_dim) like "
            f"q, got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[3] != d or h % k.shape[1]:
        return (
            f"k must have q's head_dim={d} and a number of heads dividing q's {h}, "
            f"got k {tuple(k.shape)}"
        )
    if (
        not isinstance(positions, Tensor)
        or positions.shape != (b, num_tokens)
        or (positions.is_floating_point() or positions.dtype == torch.bool)
    ):
        got = (
            f"{positions.dtype} {tuple(positions.shape)}"
            if isinstance(positions, Tensor)
            else type(positions).__name__
        )
        return f"positions must be integers of shape (batch, tokens) = {(b, num_tokens)}, got {got}"
    return None


def exchange(
    q: Any,
    k: Any,
    v: Any,
    positions: Any,
    group: dist.ProcessGroup | None,
    wrong: Exception | None = None,
    rule: str = "",
) -> list[Shard]:
    """Every process's `Shard`, checked alike everywhere: one error, raised on every process.

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: a process's arguments are wrong, or the shards' heads, head sizes or
            dtypes differ between processes (the argument and the rank named).
        TypeError: a process's mask or score modifiers (`wrong`) are of the wrong kind.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_attention: group: no process group is initialised; call "
            "torch.distributed.init_process_group(backend, timeout=...) "
            "in every process first"
        )
    rank = dist.get_rank(group)
    shards: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(shards, describe(rank, q, k, v, positions, wrong, rule), group=group)
    for shard in shards:  # the same order everywhere: the same first error
        if shard.error is not None:
            error = TypeError if shard.kind == "TypeError" else ValueError
            raise error(f"ring_attention: rank {shard.rank}: {shard.error}")
    first = shards[0]
    for shard in shards[1:]:
        for name, mine, theirs in zip("qkv", shard.shapes, first.shapes, strict=True):
            if (mine[0], mine[1], mine[3]) != (theirs[0], theirs[1], theirs[3]):
                raise ValueError(
                    f"ring_attention: {name}: every process needs the same (batch, heads, "
                    f"head_dim): rank 0 has {theirs}, rank {shard.rank} has {mine}"
                )
        if shard.dtype != first.dtype:
            raise ValueError(
                f"ring_attention: q: rank 0 has {first.dtype}, rank {shard.rank} has {shard.dtype}"
            )
        if shard.rule != first.rule:
            raise ValueError(
                f"ring_attention: mask: every process needs the same mask and "
                f"score modifiers: rank 0 has {first.rule}, rank {shard.rank} has "
                f"{shard.rule}"
            )
    twice = shared_position(shards)
    if twice is not None:
        raise ValueError(f"ring_attention: positions: {twice}")
    return shards


@dataclass(frozen=True)
class Ring:
    """A group as a ring: this process's rank, its neighbours' global ranks, every shard."""

    group: dist.ProcessGroup | None
    rank: int
    world: int
    shards: list[Shard]

    def peer(self, offset: int) -> int:
        """The global rank of the process `offset` places on along the ring."""
        group = self.group if self.group is not None else dist.group.WORLD
        assert group is not None
        return dist.get_global_rank(group, (self.rank + offset) % self.world)

    def owner(self, step: int) -> int:
        """Whose block this process holds at `step`."""
        return held(self.rank, step, self.world)

    def skips(self, mask: Mask, step: int) -> bool:
        """Whether the mask's bounds hide the block held at `step` from this process's queries."""
        mine, theirs = self.shards[self.rank], self.shards[self.owner(step)]
        return hidden(mask.bounds, (mine.low, mine.high), (theirs.low, theirs.high))

    def empty(self, step: int, like: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Buffers for the block held at `step`: `like`'s tensors, with that block's tokens."""
        tokens = self.shards[self.owner(step)].tokens
        return tuple(
            t.new_empty(*t.shape[:-2], tokens, t.shape[-1])
            if t.ndim == 4
            else t.new_empty(t.shape[0], tokens)
            for t in like
        )

    def start(self, send: tuple[Tensor, ...], recv: tuple[Tensor, ...], tag: int = 0) -> list[Any]:
        """Send `send` to the next process, receive `recv` from the previous: started, not
        waited for (one `batch_isend_irecv`)."""
        ops = [
            dist.P2POp(dist.isend, t.contiguous(), self.peer(1), self.group, tag + i)
            for i, t in enumerate(send)
        ]
        ops += [
            dist.P2POp(dist.irecv, t, self.peer(-1), self.group, tag + i)
            for i, t in enumerate(recv)
        ]
        return list(dist.batch_isend_irecv(ops))


def ring_forward(
    ring: Ring, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, mask: Mask, mods: tuple[ScoreMod, ...]
) -> tuple[Tensor, Tensor]:
    """The forward ring: `(out, lse)`, `(b, h, T, d_v)` and `(b, h, T)`, over every block."""
    b, h, num_tokens, _ = q.shape
    out = q.new_zeros(b, h, num_tokens, v.shape[-1])
    lse = q.new_full((b, h, num_tokens), -torch.inf)  # nothing seen yet
    block: tuple[Tensor, ...] = (k, v, pos)
    for step in range(ring.world):
        works, incoming = [], block
        if step < ring.world - 1:  # the next block travels while this one is computed
            incoming = ring.empty(step + 1, block)
            works = ring.start(block, incoming)
        if not ring.skips(mask, step):
            out_b, lse_b = block_attention(q, block[0], block[1], pos, block[2], mask, mods)
            out, lse = merge([out, out_b], [lse, lse_b])
        for work in works:
            work.wait()
        block = incoming
    return out, lse


def ring_backward(
    ring: Ring, saved: tuple[Tensor, ...], d_out: Tensor, mask: Mask, mods: tuple[ScoreMod, ...]
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward ring: `(dq, dk, dv)`; each block's `(dk, dv)` travel with it, home."""
    q, k, v, pos, out, lse = saved
    delta = (d_out * out).sum(dim=-1)  # D_i = sum_c dO_ic O_ic, (b, h, T)
    dq = torch.zeros_like(q)
    block: tuple[Tensor, ...] = (k, v, pos)
    grads: tuple[Tensor, ...] = (torch.zeros_like(k), torch.zeros_like(v))
    pending: list[Any] = []
    for step in range(ring.world):
        works, incoming = [], block
        if step < ring.world - 1:
            incoming = ring.empty(step + 1, block)
            works = ring.start(block, incoming)
        share = None
        if not ring.skips(mask, step):
            dq_b, dk_b, dv_b = block_backward(
                q, block[0], block[1], pos, block[2], mask, mods, d_out, lse, delta
            )
            dq, share = dq + dq_b, (dk_b, dv_b)
        for work in pending:  # this block's gradients so far, from the previous process
            work.wait()
        if share is not None:
            grads = (grads[0] + share[0], grads[1] + share[1])
        for work in works:
            work.wait()
        if ring.world > 1:  # the gradients follow their block; after P steps they are home
            arriving = ring.empty(step + 1, grads)
            pending, grads = ring.start(grads, arriving, tag=3), arriving
        block = incoming
    for work in pending:
        work.wait()
    return dq, grads[0], grads[1]


class RingFunction(torch.autograd.Function):
    """`ring_attention` as an autograd function: saves `out` and `lse`, recomputes the rest."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        pos: Tensor,
        ring: Ring,
        mask: Mask,
        mods: tuple[ScoreMod, ...],
    ) -> Tensor:
        out, lse = ring_forward(ring, q, k, v, pos, mask, mods)
        ctx.save_for_backward(q, k, v, pos, out, lse)
        ctx.ring, ctx.mask, ctx.mods = ring, mask, mods
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        dq, dk, dv = ring_backward(
            ctx.ring, ctx.saved_tensors, d_out.contiguous(), ctx.mask, ctx.mods
        )
        return dq, dk, dv, None, None, None, None


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    *,
    mask: Mask | None = None,
    score_mods: Any = (),
    group: dist.ProcessGroup | None = None,
) -> Tensor:
    r"""Attention of this process's queries over every process's keys, passed around a ring.

    $$
    o_i = \sum_j \operatorname{softmax}_j\big(f(q_i \cdot k_j / \sqrt{d_h}) + M_{ij}\big)\, v_j
    $$

    over every key $j$ of every process in `group`, merged block by block by the log-sum-exp
    rule; differentiable (the backward passes $dK, dV$ around the ring). Every process of the
    group calls it at once.

    Args:
        q: this process's queries, `(batch, heads, tokens, head_dim)`.
        k: its keys, `(batch, kv_heads, tokens, head_dim)`; `kv_heads` divides `heads`
            (grouped-query: query head `i` reads key/value head `i // (heads // kv_heads)`).
        v: its values, `(batch, kv_heads, tokens, head_dim_v)`.
        positions: `(batch, tokens)` int, each token's position in the whole sequence (any
            order, any split between processes; -1: no token).
        mask: a mask of the layer's algebra ([`attention.layer.masks`][attention.layer.masks]),
            evaluated at positions; default `causal()`.
        score_mods: score modifiers ([`attention.layer.score_mods`][attention.layer.score_mods]).
        group: the process group; default the world.

    Returns:
        This process's output, `(batch, heads, tokens, head_dim_v)`.

    Raises:
        RuntimeError: no process group is initialised (`group`).
        ValueError: on every process, when any process's `q`, `k`, `v` or `positions` are of
            the wrong shape, or the shards' heads or head sizes differ (argument and rank named).
        TypeError: on every process, when any process's `mask` or `score_mods` are not a mask
            or modifiers (rank named).
    """
    rule: Mask = causal()
    mods: tuple[ScoreMod, ...] = ()
    wrong = None
    try:  # checked here, but raised on every process by `exchange`
        rule = rule if mask is None else as_mask(mask)
        mods = as_score_mods(score_mods)
    except (TypeError, ValueError) as error:
        wrong = error
    named = f"mask {rule.name}, score_mods {[mod.name for mod in mods]}"
    shards = exchange(q, k, v, positions, group, wrong, named)
    ring = Ring(group, dist.get_rank(group), dist.get_world_size(group), shards)
    out: Tensor = RingFunction.apply(q, k, v, positions.long(), ring, rule, mods)  # type: ignore[no-untyped-call]
    return out
