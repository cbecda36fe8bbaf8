r"""One key/value block for a block of queries: its output and log-sum-exp, the merge, its backward.

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

The backward needs only the final $o$ and $\ell$: with $P_{ij} = e^{s_{ij} - \ell_i}$ recomputed
block by block, $dV_B = P^\top dO$, $dP = dO\,V_B^\top$, and
$dS = P \circ (dP - D)$ with $D_i = \sum_c dO_{ic} O_{ic}$ (FlashAttention-2's rule).

Grouped-query heads: queries `(b, h, T, d)` are viewed as `(b, h_kv, g, T, d)` against keys
`(b, h_kv, 1, S, d)`, so query head $i$ reads key/value head $i // g$ with no copy of the keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from attention.layer.masks import Bounds, Mask, evaluate, indices
from attention.layer.score_mods import ScoreMod

__all__ = ["block_attention", "block_backward", "block_cost", "hidden", "merge"]


def scores(
    q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, mask: Mask, mods: Sequence[ScoreMod]
) -> Tensor:
    """Scaled, modified, masked scores `(b, h, T, S)`: $-\\infty$ where the mask hides a key.

    `q` `(b, h, T, d)`, `k` `(b, h_kv, S, d)` with `h_kv` dividing `h`; positions `(b, T)`,
    `(b, S)` (-1: no token).
    """
    b, h, num_q, d = q.shape
    h_kv, num_k = k.shape[1], k.shape[2]
    grouped = q.view(b, h_kv, h // h_kv, num_q, d)  # (b, h_kv, g, T, d): no copy of k
    s = grouped @ k[:, :, None].transpose(-2, -1) / math.sqrt(d)  # (b, h_kv, g, T, S)
    s = s.view(b, h, num_q, num_k)  # query head i = kv head i // g
    if mods:
        idx = indices(q_pos, k_pos, batch=b, num_heads=h)
        for mod in mods:
            s = mod(s, *idx)
    seen = evaluate(mask, q_pos, k_pos, num_heads=h, batch=b)  # (b or 1, h or 1, T, S)
    return s.masked_fill(~seen, -math.inf)


def weighted(p: Tensor, v: Tensor) -> Tensor:
    """`p` `(b, h, T, S)` times `v` `(b, h_kv, S, d_v)` per group: `(b, h, T, d_v)`."""
    b, h, num_q, num_k = p.shape
    h_kv = v.shape[1]
    out = p.view(b, h_kv, h // h_kv, num_q, num_k) @ v[:, :, None]  # (b, h_kv, g, T, d_v)
    return out.view(b, h, num_q, v.shape[-1])


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

    Examples:
        >>> from attention.layer.masks import causal
        >>> q = k = v = torch.ones(1, 1, 2, 1)  # head_dim 1: every score is 1
        >>> pos = torch.arange(2)[None]
        >>> out, lse = block_attention(q, k, v, pos, pos, causal())
        >>> lse  # log(e^1), log(2 e^1): query 0 sees one key, query 1 two
        tensor([[[1.0000, 1.6931]]])
    """
    s = scores(q, k, q_pos, k_pos, mask, mods)  # (b, h, T, S)
    lse = torch.logsumexp(s, dim=-1)  # (b, h, T); -inf where nothing is seen
    p = torch.exp(s - finite(lse)[..., None])  # 0 where hidden
    return weighted(p, v), lse


def finite(lse: Tensor) -> Tensor:
    """$\\ell$ with $-\\infty$ (a query that sees nothing) as 0, to subtract safely."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    """The log-sum-exp rule: two blocks' `(out, lse)` as the result over both.

    Examples:
        >>> one = torch.ones(1, 1, 1, 2)
        >>> out, lse = merge(one, torch.zeros(1, 1, 1), 3 * one, torch.zeros(1, 1, 1))
        >>> out  # equal weights: the mean
        tensor([[[[2., 2.]]]])
    """
    lse = torch.logaddexp(lse_a, lse_b)  # (b, h, T)
    safe = finite(lse)
    w_a = torch.exp(lse_a - safe)[..., None]  # e^{l_a - l}, 0 where l_a = -inf
    w_b = torch.exp(lse_b - safe)[..., None]
    return w_a * out_a + w_b * out_b, lse


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
    with torch.enable_grad():  # the scores again, to differentiate any score modifier
        q_, k_ = q.detach().requires_grad_(), k.detach().requires_grad_()
        s = scores(q_, k_, q_pos, k_pos, mask, mods)  # (b, h, T, S)
        p = torch.exp(s.detach() - finite(lse)[..., None])  # P_ij = e^{s_ij - l_i}
        b, h, num_q, num_k = p.shape
        h_kv = v.shape[1]
        grouped = p.view(b, h_kv, h // h_kv, num_q, num_k)
        d_o = d_out.view(b, h_kv, h // h_kv, num_q, -1)
        dv = (grouped.transpose(-2, -1) @ d_o).sum(dim=2)  # dV = P^T dO, summed over g
        dp = (d_o @ v[:, :, None].transpose(-2, -1)).view(b, h, num_q, num_k)  # dO V^T
        ds = p * (dp - delta[..., None])  # dS = P o (dP - D); 0 where hidden
        dq, dk = torch.autograd.grad(s, (q_, k_), ds)
    return dq, dk, dv


def hidden(bounds: Bounds, q_range: tuple[int, int], k_range: tuple[int, int]) -> bool:
    """Whether the bounds certainly hide every key of a block from every query of another.

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
    reach = bounds.reach
    return reach is not None and q_lo - k_hi >= reach and k_lo >= bounds.anchor


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
