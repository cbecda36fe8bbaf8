r"""One key/value block for a block of queries: its output and log-sum-exp, its backward, its cost.

Ring attention computes attention one key/value block at a time, as FlashAttention does one
tile at a time. For queries $Q$ (positions $i$) and one block $B$ of keys and values
(positions $j \in B$), with scaled, modified scores $s_{ij}$ and the mask $M$:

$$
\begin{aligned}
\ell_i^B &= \log \sum_{j \in B,\, M_{ij}} e^{s_{ij}}, \\
o_i^B &= \sum_{j \in B,\, M_{ij}} e^{s_{ij} - \ell_i^B}\, v_j .
\end{aligned}
$$

Two blocks' results merge into the result over both (the **log-sum-exp rule**):

$$
\begin{aligned}
\ell_i &= \log\big(e^{\ell_i^A} + e^{\ell_i^B}\big), \\
o_i &= e^{\ell_i^A - \ell_i}\, o_i^A \\
&\quad + e^{\ell_i^B - \ell_i}\, o_i^B ,
\end{aligned}
$$

so merging every block, in any order, is softmax attention over all keys. A query that sees
no key of a block has $\ell_i^B = -\infty$ and $o_i^B = 0$; one that sees no key at all keeps
$o_i = 0$ (as the layer gives a padded query).

The arithmetic is the layer's, one set of keys of
[`attention.layer.split_kv`][attention.layer.split_kv]: a block is one set of keys of
[`partial_attention`][attention.layer.split_kv.partial_attention] (its $T \times S$ scores at
once), the rule is [`merge`][attention.layer.split_kv.merge], the backward
[`partial_backward`][attention.layer.split_kv.partial_backward], and whether the mask hides a
block [`hidden`][attention.layer.tiled.hidden].

The backward needs only the final $o$ and $\ell$: with $P_{ij} = e^{s_{ij} - \ell_i}$ recomputed
block by block, $dV_B = P^\top dO$, $dP = dO\,V_B^\top$, and
$dS = P \circ (dP - D)$ with $D_i = \sum_c dO_{ic} O_{ic}$ (FlashAttention-2's rule).

Grouped-query heads: query head $i$ reads key/value head $i // g$ with no copy of the keys.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from attention.layer.masks import Mask
from attention.layer.score_mods import ScoreMod
from attention.layer.split_kv import merge, partial_attention, partial_backward

__all__ = ["block_attention", "block_backward", "block_cost", "merge"]


def block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Mask,
    mods: Sequence[ScoreMod] = (),
) -> tuple[Tensor, Tensor]:
    """One block: $o^B$ `(b, h, T, d_v)` and $\\ell^B$ `(b, h, T)` (-inf: no key seen).

    `q` `(b, h, T, d)`, `k` `(b, h_kv, S, d)` with `h_kv` dividing `h`, `v` `(b, h_kv, S, d_v)`;
    positions `(b, T)`, `(b, S)` (-1: no token). Not differentiable by autograd: the backward is
    [`block_backward`][attention.parallel.blocks.block_backward].

    Examples:
        >>> import torch
        >>> from attention.layer.masks import causal
        >>> q = k = v = torch.ones(1, 1, 2, 1)  # head_dim 1: every score is 1
        >>> pos = torch.arange(2)[None]
        >>> out, lse = block_attention(q, k, v, pos, pos, causal())
        >>> lse  # log(e^1), log(2 e^1): query 0 sees one key, query 1 two
        tensor([[[1.0000, 1.6931]]])
    """
    return partial_attention(
        q, k, v, mask=mask, score_mods=mods, q_positions=q_pos, k_positions=k_pos
    )


def block_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    mask: Mask,
    mods: Sequence[ScoreMod],
    d_out: Tensor,
    lse: Tensor,
    delta: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """One block's share of the gradients, recomputed from the final `lse` and $D$ (`delta`).

    Args:
        q: the queries `(b, h, T, d)`, as for
            [`block_attention`][attention.parallel.blocks.block_attention].
        k: the block's keys `(b, h_kv, S, d)`.
        v: its values `(b, h_kv, S, d_v)`.
        q_pos: the queries' positions `(b, T)`.
        k_pos: the keys' positions `(b, S)`.
        mask: the mask.
        mods: the score modifiers.
        d_out: $dO$ `(b, h, T, d_v)`.
        lse: the final $\\ell$ `(b, h, T)` over every block.
        delta: $D = \\operatorname{rowsum}(dO \\circ O)$, `(b, h, T)`.

    Returns:
        `(dq, dk, dv)` of this block: `(b, h, T, d)`, `(b, h_kv, S, d)`, `(b, h_kv, S, d_v)`.
    """
    return partial_backward(
        q, k, v, d_out, lse, delta, mask=mask, score_mods=mods, q_positions=q_pos, k_positions=k_pos
    )


def block_cost(
    tokens: int, heads: int, kv_heads: int, head_dim: int, itemsize: int = 2
) -> tuple[int, int]:
    """One ring step without skipping, for one row: its floating-point operations and the bytes
    of the key/value block it passes on.

    $4\\,h\\,n^2 d$ operations ($Q K^\\top$ and $P V$, a multiply and an add each) against
    $2\\,h_{kv}\\,n\\,d$ numbers sent: compute grows with the block's length squared, the
    transfer with its length.

    Examples:
        >>> block_cost(4096, heads=32, kv_heads=8, head_dim=128)  # bfloat16
        (274877906944, 16777216)
    """
    return 4 * heads * tokens**2 * head_dim, 2 * kv_heads * tokens * head_dim * itemsize
