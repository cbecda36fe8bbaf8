r"""Attention over sets of keys computed apart: each set's output and log-sum-exp, their merge.

Attention over every key is the merge of attention over each of several sets of keys, if each
set keeps its log-sum-exp $L_c$ beside its output $O_c$
([`merge`][attention.layer.split_kv.merge]). Split-KV decoding
([`split_kv_attention`][attention.layer.split_kv.split_kv_attention], FlashDecoding's plan)
cuts a long cache into chunks that run at once; ring attention
([`attention.parallel.ring`][attention.parallel.ring]) gives each process one block of keys at
a time. Each set is one tiled pass of [`attention.layer.tiled`][attention.layer.tiled]:
[`partial_attention`][attention.layer.split_kv.partial_attention] forward,
[`partial_backward`][attention.layer.split_kv.partial_backward] for its share of the gradients.

Examples:
    >>> from attention.layer.tiled import flash_attention
    >>> q, k, v = torch.randn(3, 1, 2, 6, 4, dtype=torch.float64).unbind(0)  # (b, h, T, d)
    >>> pos = torch.arange(6)
    >>> parts = [partial_attention(q, k[:, :, s], v[:, :, s], q_positions=pos,
    ...                            k_positions=pos[s]) for s in (slice(0, 2), slice(2, 6))]
    >>> out, lse = merge([o for o, _ in parts], [l for _, l in parts])
    >>> bool((out - flash_attention(q, k, v)).abs().max() < 1e-12)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from attention.checks import check_size, check_tensor
from attention.layer.arguments import Positions, check_qkv
from attention.layer.masks import Mask
from attention.layer.score_mods import ScoreMod
from attention.layer.tiled import _backward, _forward, _Problem, _problem

__all__ = ["merge", "partial_attention", "partial_backward", "split_kv_attention"]


def partial_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Mask | Callable[..., Tensor] | None = None,
    score_mods: Sequence[ScoreMod] | ScoreMod = (),
    q_positions: Positions = None,
    k_positions: Positions = None,
) -> tuple[Tensor, Tensor]:
    r"""Attention over one set of keys and its log-sum-exp: what
    [`merge`][attention.layer.split_kv.merge] takes.

    $O = \sum_j e^{S_j - L} v_j$ and $L = \log \sum_j e^{S_j}$ over the visible keys of the
    set, by [`flash_attention`][attention.layer.tiled.flash_attention]'s forward (its arguments,
    scale $1 / \sqrt{d}$), the whole set one tile: its `(num_queries, num_keys)` scores at
    once. Not differentiable by autograd:
    [`partial_backward`][attention.layer.split_kv.partial_backward] gives the set's gradients.

    Args:
        q: `(batch, num_heads, num_queries, head_dim)`.
        k: the set's keys, `(batch, num_kv_heads, num_keys, head_dim)`.
        v: its values, `(batch, num_kv_heads, num_keys, d_v)`.
        mask: as for `flash_attention`.
        score_mods: likewise.
        q_positions: likewise; default the last `num_queries` positions of the keys.
        k_positions: likewise; default `0 .. num_keys - 1`.

    Returns:
        `(O, L)`: `(batch, num_heads, num_queries, d_v)` and `(batch, num_heads, num_queries)`;
        a query that sees no key of the set gets zeros and $L = -\infty$.
    """
    problem = _one_tile(q, k, v, mask, score_mods, q_positions, k_positions)
    with torch.no_grad():
        return _forward(problem, q, k, v)


def _one_tile(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: object,
    score_mods: object,
    q_positions: Positions,
    k_positions: Positions,
) -> _Problem:
    """The arguments checked, by name; the whole set of keys one tile (at least 1 by 1)."""
    check_qkv(q, k, v)
    blocks = (max(q.shape[2], 1), max(k.shape[2], 1))  # one tile: every query, every key
    sizes = (q.shape[0], q.shape[2], k.shape[2], q.shape[-1])  # (b, T, S, d)
    return _problem(mask, score_mods, None, blocks, (q_positions, k_positions), sizes, q.device)


def partial_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_out: Tensor,
    lse: Tensor,
    delta: Tensor,
    *,
    mask: Mask | Callable[..., Tensor] | None = None,
    score_mods: Sequence[ScoreMod] | ScoreMod = (),
    q_positions: Positions = None,
    k_positions: Positions = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One set of keys' share of the gradients, from the merged $L$ and $D$ over every set.

    With $P_{ij} = e^{S_{ij} - L_i}$ recomputed (one tile), $dV = P^\top dO$,
    $dP = dO\, V^\top$, $dS = P \circ (dP - D)$ (FlashAttention-2's backward); summed over
    the sets, the gradients of attention over every key.

    Args:
        q: `(batch, num_heads, num_queries, head_dim)`, as for
            [`partial_attention`][attention.layer.split_kv.partial_attention].
        k: the set's keys `(batch, num_kv_heads, num_keys, head_dim)`.
        v: its values `(batch, num_kv_heads, num_keys, d_v)`.
        d_out: $dO$, `(batch, num_heads, num_queries, d_v)`.
        lse: the merged $L$ over every set, `(batch, num_heads, num_queries)`.
        delta: $D = \operatorname{rowsum}(dO \circ O)$ with the merged $O$, of `lse`'s shape.
        mask: as for `partial_attention`.
        score_mods: likewise.
        q_positions: likewise.
        k_positions: likewise.

    Returns:
        `(dq, dk, dv)`, of `q`'s, `k`'s and `v`'s shapes.
    """
    problem = _one_tile(q, k, v, mask, score_mods, q_positions, k_positions)
    check_tensor("d_out", d_out, like=q, shape=(*q.shape[:-1], v.shape[-1]))
    check_tensor("lse", lse, like=q, shape=q.shape[:-1])
    check_tensor("delta", delta, like=q, shape=q.shape[:-1])
    saved = tuple(t.detach() for t in (q, k, v, lse))
    return _backward(problem, saved, d_out.detach(), delta.detach())


def merge(outputs: Sequence[Tensor], lses: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    r"""Attention over several sets of keys, from each set's output and log-sum-exp.

    Set $c$ gave $O_c = \sum_{j \in c} e^{S_j - L_c} v_j$ with $L_c = \log \sum_{j \in c}
    e^{S_j}$. Over every key, $L = \log \sum_c e^{L_c}$ and each set's share of the weight is
    $e^{L_c - L}$:

    $$
    O = \sum_c e^{L_c - L}\, O_c .
    $$

    Split-KV decoding's rule, and ring attention's; the forward's tile update is the same one.

    Args:
        outputs: each `(..., num_queries, d_v)`.
        lses: each `(..., num_queries)`; $-\infty$ where a set holds no visible key.

    Returns:
        `(O, L)`: the merged output and log-sum-exp, of those shapes.

    Examples:
        >>> o, lse = merge([torch.tensor([[1.0]]), torch.tensor([[3.0]])],
        ...                [torch.tensor([0.0]), torch.tensor([0.0])])  # equal weight
        >>> o, lse
        (tensor([[2.]]), tensor([0.6931]))
    """
    outputs, lses = _sets("outputs", outputs), _sets("lses", lses)
    if len(outputs) != len(lses) or not outputs:
        raise ValueError(
            f"merge needs one lse per output, at least one: got {len(outputs)} "
            f"outputs and {len(lses)} lses"
        )
    first = check_tensor("outputs[0]", outputs[0], floating=True)  # the others are like it
    for i, (o, lse_c) in enumerate(zip(outputs, lses, strict=True)):
        check_tensor(f"outputs[{i}]", o, like=first, shape=first.shape)
        check_tensor(f"lses[{i}]", lse_c, like=first, shape=first.shape[:-1])
    stacked = torch.stack(lses)  # (n, ..., T)
    lse = torch.logsumexp(stacked, dim=0)  # L = log sum_c e^(L_c)
    shift = lse.masked_fill(lse.isneginf(), 0.0)  # no visible key anywhere: weights 0
    weights = torch.exp(stacked - shift)  # e^(L_c - L): (n, ..., T)
    out = (weights[..., None] * torch.stack(list(outputs))).sum(dim=0)  # sum_c e^(L_c-L) O_c
    return out, lse


def _sets(name: str, value: object) -> list[Tensor]:
    """One tensor per set: a list or tuple of them, or one tensor stacked over the sets."""
    if isinstance(value, Tensor) and value.ndim >= 1:
        return list(value.unbind(0))
    if not isinstance(value, list | tuple):
        raise TypeError(
            f"{name} must be a list or tuple of tensors, one per set of keys, got "
            f"{type(value).__name__}"
        )
    return list(value)


def split_kv_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    num_splits: int,
    mask: Mask | Callable[..., Tensor] | None = None,
    score_mods: Sequence[ScoreMod] | ScoreMod = (),
    q_positions: Positions = None,
    k_positions: Positions = None,
    scale: float | None = None,
    workers: int = 1,
) -> Tensor:
    r"""Decoding's attention: a few queries over many keys, cut into `num_splits` chunks.

    Each chunk $c$ of keys gives its own $(O_c, L_c)$ (one tiled forward); the chunks are
    independent, so they can run at once (on `workers` threads here, on more of a GPU's cores
    in FlashDecoding), and [`merge`][attention.layer.split_kv.merge] combines them.

    Args:
        q: `(batch, num_heads, num_queries, head_dim)`, usually one query.
        k: `(batch, num_kv_heads, num_keys, head_dim)`.
        v: `(batch, num_kv_heads, num_keys, d_v)`.
        num_splits: chunks of keys, 1 to `num_keys`.
        mask: as in [`flash_attention`][attention.layer.tiled.flash_attention].
        score_mods: likewise.
        q_positions: likewise; default the last `num_queries` positions of the keys.
        k_positions: likewise; default `0 .. num_keys - 1`.
        scale: likewise; default $1 / \sqrt{d}$.
        workers: threads computing chunks at once (1: one after another).

    Returns:
        $O$, `(batch, num_heads, num_queries, d_v)`.

    Examples:
        >>> from attention.layer.tiled import flash_attention
        >>> q = torch.randn(1, 4, 1, 8, dtype=torch.float64)  # one new token's query
        >>> k, v = torch.randn(2, 1, 4, 1000, 8, dtype=torch.float64).unbind(0)
        >>> one = flash_attention(q, k, v, block_k=1000)
        >>> bool((split_kv_attention(q, k, v, num_splits=8) - one).abs().max() < 1e-12)
        True
    """
    check_qkv(q, k, v)
    num_keys = k.shape[2]
    num_splits = check_size("num_splits", num_splits)
    if num_splits > num_keys:
        raise ValueError(f"num_splits must be at most num_keys={num_keys}, got {num_splits}")
    workers = check_size("workers", workers)
    size = -(-num_keys // num_splits)  # keys per chunk, rounded up
    blocks = (max(q.shape[2], 1), size)  # every query, one chunk of keys
    sizes = (q.shape[0], q.shape[2], num_keys, q.shape[-1])  # (b, T, S, d)
    positions = (q_positions, k_positions)
    problem = _problem(mask, score_mods, scale, blocks, positions, sizes, q.device)

    def chunk(lo: int) -> tuple[Tensor, Tensor]:  # (O_c, L_c) of keys lo .. lo + size - 1
        hi = min(lo + size, num_keys)
        k_docs = None if problem.k_docs is None else problem.k_docs[:, lo:hi]
        part = replace(problem, k_line=problem.k_line[..., lo:hi], k_docs=k_docs)
        return _forward(part, q, k[:, :, lo:hi], v[:, :, lo:hi])

    starts = range(0, num_keys, size)
    if workers == 1:
        parts = [chunk(lo) for lo in starts]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(chunk, starts))
    out, _ = merge([o for o, _ in parts], [lse for _, lse in parts])
    return out
