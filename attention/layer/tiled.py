r"""FlashAttention in tiles, forward and backward, in plain PyTorch: no $T \times S$ matrix.

The queries are cut into tiles of `block_q` rows, the keys and values into tiles of `block_k`.
FlashAttention-2's forward takes one query tile at a time (the outer loop) and visits its key
tiles (the inner loop) with the online softmax of
[`online_attention`][attention.derivation.core.online_attention]: a running maximum $m$, a
running sum $\ell$ and an unnormalised output $O$ per query, one division at the end. It keeps
one number per query for the backward, the log-sum-exp of its scores,

$$
L_i = m_i + \log \ell_i = \log \sum_j e^{S_{ij}},
$$

so that any weight can be recomputed from its score alone: $P_{ij} = e^{S_{ij} - L_i}$. The
backward ([`FlashAttention`][attention.layer.tiled.FlashAttention]) saves only $Q, K, V, O, L$
(and the positions): it recomputes each tile's weights from them.

A tile that the mask's [`Bounds`][attention.layer.masks.Bounds] certainly hide is skipped,
scores and all: the future of a causal tile, what lies beyond a window's reach
([`tile_grid`][attention.layer.tiled.tile_grid] draws the plan,
[`counting_tiles`][attention.layer.tiled.counting_tiles] counts what the loops did). A tile that
the bounds certainly show in full computes no mask.

A loop to read, not a kernel: each tile is a few PyTorch calls, so the Python loop costs
more than the arithmetic at small tiles. What it shows is the memory: beside $Q, K, V, O$ the
largest tensor held is one tile's `(batch, heads, block_q, block_k)`.

Examples:
    >>> from attention.layer.masks import causal
    >>> q, k, v = torch.randn(3, 1, 2, 10, 4, dtype=torch.float64).unbind(0)  # (b, h, T, d)
    >>> with counting_tiles() as counts:
    ...     out = flash_attention(q, k, v, mask=causal(), block_q=4, block_k=4)
    >>> counts["forward"]  # 3 x 3 tiles: the 3 above the diagonal certainly hidden
    TileCounts(computed=6, skipped=3, full=3)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attention.checks import check_positive, check_size, check_tensor
from attention.layer.arguments import Positions, check_qkv, positions_line
from attention.layer.masks import Bounds, Mask, as_mask, everything
from attention.layer.score_mods import ScoreMod, as_score_mods
from attention.layer.tokens import Tokens, visible

__all__ = [
    "FULL",
    "PARTIAL",
    "SKIPPED",
    "FlashAttention",
    "TileCounts",
    "counting_tiles",
    "flash_attention",
    "hidden",
    "tile_grid",
]

SKIPPED = 0
"""A tile's fate in [`tile_grid`][attention.layer.tiled.tile_grid]: certainly hidden, not
computed."""
PARTIAL = 1
"""A tile's fate: maybe partly visible: its scores computed and the mask evaluated."""
FULL = 2
"""A tile's fate: certainly visible in full: its scores computed, no mask evaluated."""


@dataclass
class TileCounts:
    """The tiles one pass (forward or backward) met, inside
    [`counting_tiles`][attention.layer.tiled.counting_tiles].

    Attributes:
        computed: tiles whose scores were computed.
        skipped: tiles certainly hidden by the mask's bounds: nothing computed.
        full: of the computed, those certainly visible in full: no mask evaluated.
    """

    computed: int = 0
    skipped: int = 0
    full: int = 0


_COUNTERS: list[dict[str, TileCounts]] = []


@contextlib.contextmanager
def counting_tiles() -> Iterator[dict[str, TileCounts]]:
    """Count the tiles every tiled pass in the block computes and skips.

    Yields:
        `{"forward": TileCounts, "backward": TileCounts}`, filled as the passes run (each
        call adds to them; split-KV's chunks count as forward passes).
    """
    counts = {"forward": TileCounts(), "backward": TileCounts()}
    _COUNTERS.append(counts)
    try:
        yield counts
    finally:
        _COUNTERS.remove(counts)


def _count(which: str, fate: int) -> None:
    for counts in _COUNTERS:
        tally = counts[which]
        tally.skipped += fate == SKIPPED
        tally.computed += fate != SKIPPED
        tally.full += fate == FULL


# ---------------------------------------------------------------------------------------
# The problem: positions, documents, mask, modifiers, scale, tiles
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Problem:
    """Everything but Q, K, V that a tile needs (the positions are `(T,)` or `(b, T)`)."""

    rule: Mask
    mods: tuple[ScoreMod, ...]
    scale: float
    block_q: int
    block_k: int
    q_line: Tensor
    k_line: Tensor
    q_docs: Tensor | None
    k_docs: Tensor | None

    def tiles(self, line: Tensor, block: int) -> list[tuple[int, int]]:
        """`(lo, hi)` of each tile of `line`'s tokens."""
        n = line.shape[-1]
        return [(lo, min(lo + block, n)) for lo in range(0, n, block)]

    def tokens(self, line: Tensor, docs: Tensor | None, lo: int, hi: int, batch: int) -> Tokens:
        """Tokens `lo .. hi - 1` as [`Tokens`][attention.layer.tokens.Tokens], for `visible`."""
        sliced = None if docs is None else docs[:, lo:hi]
        return Tokens(batch, hi - lo, line.device, given=line[..., lo:hi], docs=sliced)


def _extent(line: Tensor, lo: int, hi: int) -> tuple[int, int, bool] | None:
    """`(min, max, any padding)` of the real positions in tokens `lo .. hi - 1`; None: none."""
    pos = line[..., lo:hi]
    real = pos >= 0  # -1: no token
    if not bool(real.any()):
        return None
    low = int(pos.masked_fill(~real, torch.iinfo(pos.dtype).max).min())
    return low, int(pos.max()), not bool(real.all())


def hidden(bounds: Bounds, q_range: tuple[int, int], k_range: tuple[int, int]) -> bool:
    """Whether the bounds certainly hide every key of a block from every query of another.

    A tile's test here, a ring step's in [`attention.parallel.ring`][attention.parallel.ring].

    Args:
        bounds: the mask's [`Bounds`][attention.layer.masks.Bounds].
        q_range: the queries' smallest and largest position (real tokens only); `(0, -1)`:
            none.
        k_range: the keys'.

    Examples:
        >>> from attention.layer.masks import causal, window
        >>> hidden(causal().bounds, (0, 3), (4, 7))  # keys all in the queries' future
        True
        >>> hidden(window(2).bounds, (6, 7), (0, 3))  # all further back than the window
        True
        >>> hidden(causal().bounds, (4, 7), (0, 3))
        False
    """
    (q_lo, q_hi), (k_lo, k_hi) = q_range, k_range
    if q_lo > q_hi or k_lo > k_hi:
        return True  # no token on one side
    if q_lo >= bounds.causal_from and k_lo > q_hi:
        return True  # every key lies after every query: j > i
    reach = bounds.reach  # every key beyond the reach, and no anchor (sink) among them
    return reach is not None and q_lo - k_hi >= reach and k_lo >= bounds.anchor


def _fate(
    bounds: Bounds, qs: tuple[int, int, bool] | None, ks: tuple[int, int, bool] | None, docs: bool
) -> int:
    """SKIPPED, PARTIAL or FULL for a tile of query positions `qs` and key positions `ks`."""
    if qs is None or ks is None:  # no real query or no real key: nothing to see
        return SKIPPED
    (q_min, q_max, q_pad), (k_min, k_max, k_pad) = qs, ks
    if hidden(bounds, (q_min, q_max), (k_min, k_max)):
        return SKIPPED
    if docs or q_pad or k_pad:
        return PARTIAL  # documents and padding are not in the bounds: evaluate the mask
    near = 0 <= q_min - k_max and q_max - k_min < bounds.near  # every 0 <= i - j < near
    first = k_max < bounds.first and k_max <= q_min  # every j < first and j <= i
    return FULL if bounds.everything or near or first else PARTIAL


def _grid(problem: _Problem, batch: int) -> list[list[int]]:
    """The fate of every tile: `[query tile][key tile]`."""
    docs = problem.q_docs is not None or problem.k_docs is not None
    q_ext = [_extent(problem.q_line, *t) for t in problem.tiles(problem.q_line, problem.block_q)]
    k_ext = [_extent(problem.k_line, *t) for t in problem.tiles(problem.k_line, problem.block_k)]
    return [[_fate(problem.rule.bounds, qs, ks, docs) for ks in k_ext] for qs in q_ext]


def tile_grid(
    mask: Mask | None,
    q_positions: Tensor,
    k_positions: Tensor,
    *,
    block_q: int = 64,
    block_k: int = 64,
) -> Tensor:
    """Each tile's fate, from the mask's bounds alone: `(query tiles, key tiles)` int64.

    [`SKIPPED`][attention.layer.tiled.SKIPPED] (0), `PARTIAL` (1) or `FULL` (2), as the
    passes of [`flash_attention`][attention.layer.tiled.flash_attention] see them.

    Examples:
        >>> from attention.layer.masks import window
        >>> pos = torch.arange(8)
        >>> tile_grid(window(2), pos, pos, block_q=2, block_k=2)
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]])
    """
    q_positions = check_tensor("q_positions", q_positions, ndim=(1, 2))
    k_positions = check_tensor("k_positions", k_positions, ndim=(1, 2))
    sizes = (1, q_positions.shape[-1], k_positions.shape[-1], 8)  # one row; any head size
    positions = (q_positions, k_positions)
    problem = _problem(mask, (), None, (block_q, block_k), positions, sizes, q_positions.device)
    return torch.tensor(_grid(problem, 1), dtype=torch.long)


# ---------------------------------------------------------------------------------------
# One tile: its scores, with grouped heads read without copies
# ---------------------------------------------------------------------------------------


def _grouped(t: Tensor, num_kv_heads: int) -> Tensor:
    """`(b, h, n, d)` as `(b, h_kv, h / h_kv, n, d)`: query head `i` reads key head `i // g`."""
    b, h, n, d = t.shape
    return t.view(b, num_kv_heads, h // num_kv_heads, n, d)


def _qk(q_i: Tensor, k_j: Tensor) -> Tensor:
    """$Q_i K_j^\\top$, heads grouped: `(b, h, tq, d)`, `(b, h_kv, tk, d)` -> `(b, h, tq, tk)`."""
    b, h, tq, _ = q_i.shape
    s = _grouped(q_i, k_j.shape[1]) @ k_j.unsqueeze(2).transpose(-2, -1)  # (b, h_kv, g, tq, tk)
    return s.reshape(b, h, tq, k_j.shape[2])


def _pv(p: Tensor, v_j: Tensor) -> Tensor:
    """$P V_j$ for grouped heads: `(b, h, tq, tk)`, `(b, h_kv, tk, d_v)` -> `(b, h, tq, d_v)`."""
    b, h, tq, _ = p.shape
    return (_grouped(p, v_j.shape[1]) @ v_j.unsqueeze(2)).reshape(b, h, tq, v_j.shape[-1])


def _summed(a: Tensor, b_: Tensor, num_kv_heads: int) -> Tensor:
    """$\\sum_{\\text{group}} A^\\top B$: `(b, h, tq, x)`, `(b, h, tq, y)` -> `(b, h_kv, x, y)`,
    a key head's gradient gathered from the query heads that read it."""
    ga, gb = _grouped(a, num_kv_heads), _grouped(b_, num_kv_heads)
    return (ga.transpose(-2, -1) @ gb).sum(dim=2)


def _modify(problem: _Problem, raw: Tensor, qt: Tokens, kt: Tokens, fate: int) -> Tensor:
    """The scores the softmax takes: the modifiers $f(S)$ in order, then the mask ($-\\infty$)."""
    s = raw
    if problem.mods:
        from attention.layer.fused import bind  # the layer's own binding of positions

        s = bind(problem.mods, qt.line, kt.line, raw.shape[0], raw.shape[1])(raw)
        if s.shape != raw.shape:
            raise ValueError(
                f"score_mods {list(problem.mods)} must return the scores' shape "
                f"{tuple(raw.shape)}, got {tuple(s.shape)}"
            )
    if fate == PARTIAL:  # the mask, evaluated on this tile only: (b or 1, h or 1, tq, tk)
        seen = visible(problem.rule, qt, kt, num_heads=raw.shape[1])
        s = s.masked_fill(~seen, -math.inf)
    return s


# ---------------------------------------------------------------------------------------
# The forward: FlashAttention-2's Algorithm 1
# ---------------------------------------------------------------------------------------


def _present(problem: _Problem, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """`k` and `v` with the keys at position -1 (no token) zeroed: a weight of 0 times a NaN
    there would still be NaN, and no value of a missing token may reach an output."""
    absent = problem.k_line < 0  # (S,) or (b or 1, S)
    if not bool(absent.any()):
        return k, v
    absent = absent.reshape(absent.shape[0] if absent.ndim == 2 else 1, 1, -1, 1)
    return k.masked_fill(absent, 0.0), v.masked_fill(absent, 0.0)


def _forward(problem: _Problem, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """$O$ `(b, h, T, d_v)` and $L$ `(b, h, T)`: outer loop over query tiles, inner over keys."""
    b = q.shape[0]
    k, v = _present(problem, k, v)
    grid = _grid(problem, b)
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])  # O: (b, h, T, d_v)
    lse = q.new_full(q.shape[:-1], -math.inf)  # L: (b, h, T); -inf for a query seeing nothing
    k_tiles = problem.tiles(problem.k_line, problem.block_k)
    for i, (q_lo, q_hi) in enumerate(problem.tiles(problem.q_line, problem.block_q)):
        q_i = q[:, :, q_lo:q_hi] * problem.scale  # Q_i / sqrt(d): (b, h, tq, d)
        qt = problem.tokens(problem.q_line, problem.q_docs, q_lo, q_hi, b)
        m = q.new_full((*q_i.shape[:-1], 1), -math.inf)  # running maximum m: (b, h, tq, 1)
        ell = q.new_zeros(m.shape)  # running sum l: (b, h, tq, 1)
        o = q.new_zeros(*q_i.shape[:-1], v.shape[-1])  # unnormalised output: (b, h, tq, d_v)
        for fate, (k_lo, k_hi) in zip(grid[i], k_tiles, strict=True):
            _count("forward", fate)
            if fate == SKIPPED:
                continue
            kt = problem.tokens(problem.k_line, problem.k_docs, k_lo, k_hi, b)
            s = _modify(problem, _qk(q_i, k[:, :, k_lo:k_hi]), qt, kt, fate)  # S_ij: (b,h,tq,tk)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # m' = max(m, rowmax S_ij)
            shift = m_new.masked_fill(m_new.isneginf(), 0.0)  # a row that saw nothing yet: 0
            p = torch.exp(s - shift)  # P~ = e^(S_ij - m'): (b, h, tq, tk)
            rescale = torch.exp(m - shift)  # e^(m - m'): (b, h, tq, 1)
            ell = rescale * ell + p.sum(dim=-1, keepdim=True)  # l' = e^(m - m') l + rowsum P~
            o = rescale * o + _pv(p, v[:, :, k_lo:k_hi])  # O' = e^(m - m') O + P~ V_j
            m = m_new
        seen = ell != 0  # a query with no visible key keeps O = 0, L = -inf; NaN stays NaN
        out[:, :, q_lo:q_hi] = torch.where(seen, o / torch.where(seen, ell, 1.0), 0.0)  # O = O / l
        lse[:, :, q_lo:q_hi] = torch.where(seen, m + torch.log(ell), -math.inf)[..., 0]  # L
    return out, lse


# ---------------------------------------------------------------------------------------
# The backward: FlashAttention-2's Algorithm 2, every weight recomputed from L
# ---------------------------------------------------------------------------------------


def _tile_grads(
    problem: _Problem,
    saved: tuple[Tensor, ...],
    dout: Tensor,
    delta: Tensor,
    tiles: tuple[tuple[int, int], tuple[int, int]],
    fate: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """One tile's share of the gradients: `(dQ_i, dK_j, dV_j)` from $Q_i, K_j, V_j, L_i, dO_i$.

    $$
    \\begin{aligned}
    P &= e^{S - L}, & dV_j &\\mathrel{+}= P^\\top dO_i, & dP &= dO_i V_j^\\top, \\\\
    dS &= P \\circ (dP - D_i), & dQ_i &\\mathrel{+}= dS\\, K_j / \\sqrt{d}, &
    dK_j &\\mathrel{+}= dS^\\top Q_i / \\sqrt{d}.
    \\end{aligned}
    $$
    """
    q, k, v, lse = saved
    (q_lo, q_hi), (k_lo, k_hi) = tiles
    b, num_kv_heads = q.shape[0], k.shape[1]
    q_i = q[:, :, q_lo:q_hi] * problem.scale  # Q_i / sqrt(d): (b, h, tq, d)
    k_j, v_j = k[:, :, k_lo:k_hi], v[:, :, k_lo:k_hi]  # (b, h_kv, tk, d), (b, h_kv, tk, d_v)
    do_i = dout[:, :, q_lo:q_hi]  # dO_i: (b, h, tq, d_v)
    qt = problem.tokens(problem.q_line, problem.q_docs, q_lo, q_hi, b)
    kt = problem.tokens(problem.k_line, problem.k_docs, k_lo, k_hi, b)
    with torch.enable_grad():  # only for a modifier's derivative, within this tile
        raw = _qk(q_i, k_j).requires_grad_(bool(problem.mods))  # Q_i K_j^T / sqrt(d)
        s = _modify(problem, raw, qt, kt, fate)  # S = f(Q_i K_j^T / sqrt(d)) + M
        lse_i = lse[:, :, q_lo:q_hi, None]  # L_i: (b, h, tq, 1)
        p = torch.exp(s - lse_i.masked_fill(lse_i.isneginf(), 0.0))  # P = e^(S - L), recomputed
        dv = _summed(p, do_i, num_kv_heads)  # dV_j += P^T dO_i: (b, h_kv, tk, d_v)
        dp = _qk(do_i, v_j)  # dP = dO_i V_j^T: (b, h, tq, tk)
        ds = p * (dp - delta[:, :, q_lo:q_hi, None])  # dS = P o (dP - D_i): (b, h, tq, tk)
        if problem.mods:  # through f: dS_raw = f'(raw) o dS (1 for an added bias)
            (ds,) = torch.autograd.grad(s, raw, ds.detach())
    ds = ds.detach()
    dq = _pv(ds, k_j) * problem.scale  # dQ_i += dS K_j / sqrt(d): (b, h, tq, d)
    dk = _summed(ds, q_i, num_kv_heads)  # dK_j += dS^T Q_i / sqrt(d): (b, h_kv, tk, d)
    return dq, dk, dv.detach()


def _backward(
    problem: _Problem, saved: tuple[Tensor, ...], dout: Tensor, delta: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV: outer loop over key tiles (dK_j, dV_j accumulate), inner over query tiles.

    `saved` is $Q, K, V, L$ and `delta` $D$, with $L$ and $D$ over every key: the keys may be
    one set of several (a ring's block), whose share of the gradients this is.
    """
    q, k, v, lse = saved
    k, v = _present(problem, k, v)  # as in the forward: a missing token's NaN reaches nothing
    saved = (q, k, v, lse)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    grid = _grid(problem, q.shape[0])
    q_tiles = problem.tiles(problem.q_line, problem.block_q)
    for j, (k_lo, k_hi) in enumerate(problem.tiles(problem.k_line, problem.block_k)):
        for i, (q_lo, q_hi) in enumerate(q_tiles):
            _count("backward", grid[i][j])
            if grid[i][j] == SKIPPED:
                continue
            tiles = ((q_lo, q_hi), (k_lo, k_hi))
            dq_i, dk_j, dv_j = _tile_grads(problem, saved, dout, delta, tiles, grid[i][j])
            dq[:, :, q_lo:q_hi] += dq_i
            dk[:, :, k_lo:k_hi] += dk_j
            dv[:, :, k_lo:k_hi] += dv_j
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """The tiled forward and backward as one autograd node that saves $Q, K, V, O, L$ only.

    Gradients reach `q`, `k` and `v`; a score modifier's own tensors (a learned bias) get none.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, problem: _Problem) -> Tensor:
        out, lse = _forward(problem, q, k, v)
        assert out.shape == (*q.shape[:-1], v.shape[-1]) and lse.shape == q.shape[:-1]
        lines = (problem.q_line, problem.k_line, problem.q_docs, problem.k_docs)
        ctx.save_for_backward(q, k, v, out, lse, *lines)  # positions: T + S integers
        ctx.problem = problem
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = (t.detach() for t in ctx.saved_tensors[:5])  # no backward graph
        dout = dout.detach()
        delta = (dout * out).sum(dim=-1)  # D = rowsum(dO o O): (b, h, T), before the loops
        dq, dk, dv = _backward(ctx.problem, (q, k, v, lse), dout, delta)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        return dq, dk, dv, None


# ---------------------------------------------------------------------------------------
# The public functions
# ---------------------------------------------------------------------------------------


def _problem(
    mask: object,
    score_mods: object,
    scale: float | None,
    blocks: tuple[int, int],
    positions: tuple[Positions, Positions],
    sizes: tuple[int, int, int, int],
    device: torch.device,
) -> _Problem:
    """The arguments checked, by name, and gathered: `blocks` is (block_q, block_k),
    `positions` (q_positions, k_positions) and `sizes` (batch, num_queries, num_keys, head_dim)."""
    (block_q, block_k), (q_positions, k_positions) = blocks, positions
    batch, num_queries, num_keys, head_dim = sizes
    rule = everything() if mask is None else as_mask(mask)
    mods = as_score_mods(score_mods)
    scale = 1 / math.sqrt(head_dim) if scale is None else check_positive("scale", scale)
    block_q, block_k = check_size("block_q", block_q), check_size("block_k", block_k)
    q_line, q_docs = positions_line(
        "q_positions", q_positions, num_queries, max(num_keys - num_queries, 0), batch, device
    )
    k_line, k_docs = positions_line("k_positions", k_positions, num_keys, 0, batch, device)
    return _Problem(rule, mods, scale, block_q, block_k, q_line, k_line, q_docs, k_docs)


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Mask | Callable[..., Tensor] | None = None,
    score_mods: Sequence[ScoreMod] | ScoreMod = (),
    q_positions: Positions = None,
    k_positions: Positions = None,
    scale: float | None = None,
    block_q: int = 64,
    block_k: int = 64,
) -> Tensor:
    r"""$\operatorname{softmax}(f(Q K^\top / \sqrt{d}) + M)\, V$ in tiles, forward and backward.

    Args:
        q: $Q$, `(batch, num_heads, num_queries, head_dim)`.
        k: $K$, `(batch, num_kv_heads, num_keys, head_dim)`; `num_heads` a multiple of
            `num_kv_heads` (grouped-query heads, read without copying).
        v: $V$, `(batch, num_kv_heads, num_keys, d_v)`.
        mask: a [`Mask`][attention.layer.masks.Mask] or a `mask_mod` function; None: every key.
        score_mods: [`ScoreMod`][attention.layer.score_mods.ScoreMod]s applied in order to each
            tile's scaled scores (ALiBi, a soft cap: any elementwise function; the backward
            takes its derivative per tile).
        q_positions: the queries' positions, `(num_queries,)` or `(batch, num_queries)` (-1:
            no token), or [`Tokens`][attention.layer.tokens.Tokens] with documents; default
            the last `num_queries` of the keys' (a chunk after a cache).
        k_positions: the keys', likewise; default `0 .. num_keys - 1`.
        scale: what $Q K^\top$ is multiplied by; default $1 / \sqrt{d}$.
        block_q: queries per tile.
        block_k: keys per tile.

    Returns:
        $O$, `(batch, num_heads, num_queries, d_v)`; a query that sees no key gets zeros.

    Raises:
        TypeError: tensors not floating point of one dtype, positions not integers, a mask
            or modifier that is not a function.
        ValueError: shapes that do not fit, a block size below 1, a scale not above 0.

    Examples:
        >>> q, k, v = torch.randn(3, 2, 4, 100, 8, dtype=torch.float64).unbind(0)
        >>> out = flash_attention(q, k, v, block_q=32, block_k=16)
        >>> ref = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1) @ v
        >>> bool((out - ref).abs().max() < 1e-12)
        True
    """
    check_qkv(q, k, v)
    sizes = (q.shape[0], q.shape[2], k.shape[2], q.shape[-1])  # (b, T, S, d)
    blocks, positions = (block_q, block_k), (q_positions, k_positions)
    problem = _problem(mask, score_mods, scale, blocks, positions, sizes, q.device)
    out: Tensor = FlashAttention.apply(q, k, v, problem)  # type: ignore[no-untyped-call]
    return out
