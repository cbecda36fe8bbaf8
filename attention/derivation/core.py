r"""The functional core: scores, masks, softmax and explicit attention as pure functions.

Every chapter of the derivation, and the production module's explicit path, computes

$$
\begin{aligned}
& \operatorname{Attention}(Q, K, V) \\
& \quad = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right) V,
\end{aligned}
$$

where $M$ is $0$ where a query may look at a key and $-\infty$ where it may not. This module holds
that formula once, in the symbols used throughout the site:

| symbol | name in code | shape |
| --- | --- | --- |
| $Q$ | `queries` | `(..., num_queries, d_k)` |
| $K$ | `keys` | `(..., num_keys, d_k)` |
| $V$ | `values` | `(..., num_keys, d_v)` |
| $\omega = Q K^\top$ | `attn_scores` | `(..., num_queries, num_keys)` |
| $\alpha$ | `attn_weights` | `(..., num_queries, num_keys)` |
| $Z = \alpha V$ | `context_vec` | `(..., num_queries, d_v)` |

Masks are boolean and **True marks a key the query may attend to**, as in PyTorch's
`scaled_dot_product_attention` and FlexAttention's `mask_mod`: one convention in the whole
package. The book writes the opposite (its `mask.bool()` is True above the diagonal, where
the score becomes $-\infty$); the one class that keeps the book's buffer,
[`CausalAttention`][attention.derivation.causal.CausalAttention], converts it where it calls
[`explicit_attention`][attention.derivation.core.explicit_attention].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from attention.checks import check_flag, check_size, check_tensor

__all__ = [
    "attention_scores",
    "causal_mask",
    "explicit_attention",
    "online_attention",
    "softmax_stable",
    "softmax_with_sink",
]


def attention_scores(queries: Tensor, keys: Tensor) -> Tensor:
    r"""Unnormalised attention scores $\omega = Q K^\top$: one dot product per query-key pair.

    Args:
        queries: $Q$, shape `(..., num_queries, d_k)`.
        keys: $K$, shape `(..., num_keys, d_k)`; the same $d_k$ as `queries`.

    Returns:
        $\omega$, shape `(..., num_queries, num_keys)`, with
        $\omega_{ij} = q^{(i)} \cdot k^{(j)}$.

    Raises:
        TypeError: not floating-point tensors of one dtype.
        ValueError: not at least 2-d, on different devices, or not sharing their last
            dimension $d_k$.

    Examples:
        >>> q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> attention_scores(q, q)
        tensor([[1., 0.],
                [0., 4.]])
    """
    check_tensor("queries", queries, floating=True)
    check_tensor("keys", keys, like=queries)
    if queries.ndim < 2 or keys.ndim < 2:
        raise ValueError(
            "queries and keys must be at least 2-d, (..., num_tokens, d_k): "
            f"got queries {tuple(queries.shape)} and keys {tuple(keys.shape)}"
        )
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            "queries and keys must share d_k (their last dimension): "
            f"got queries {tuple(queries.shape)} and keys {tuple(keys.shape)}"
        )
    return queries @ keys.transpose(-2, -1)  # (..., num_queries, num_keys)


def softmax_stable(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax that cannot overflow: subtract the maximum before exponentiating.

    $$
    \begin{gathered}
    \operatorname{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}}, \\
    m = \max_j x_j.
    \end{gathered}
    $$

    The shift by $m$ cancels between numerator and denominator, so the result equals the naive
    formula wherever that one is finite; but the largest exponent is now $e^0 = 1$, so nothing
    overflows. Equal to `torch.softmax` (which does the same internally).

    Args:
        x: scores of any shape.
        dim: the dimension that sums to 1.

    Returns:
        Weights with the shape of `x`, non-negative, summing to 1 along `dim`.

    Raises:
        TypeError: `x` is not a floating-point tensor.
        ValueError: `dim` is not one of `x`'s dimensions.

    Examples:
        >>> softmax_stable(torch.tensor([1000.0, 1000.0]))
        tensor([0.5000, 0.5000])
        >>> softmax_stable(torch.empty(2, 0))  # nothing to normalise: empty, as torch.softmax
        tensor([], size=(2, 0))
    """
    check_tensor("x", x, floating=True)
    if x.ndim == 0:  # one number: its weight is 1, as torch.softmax gives
        return torch.ones_like(x)
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(
            f"dim must be in -{x.ndim} .. {x.ndim - 1} for x of shape {tuple(x.shape)}, got {dim}"
        )
    if x.shape[dim] == 0:  # no maximum to subtract; the result is as empty as the input
        return torch.empty_like(x)
    m = x.amax(dim=dim, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)


def softmax_with_sink(scores: Tensor, sink_logits: Tensor) -> Tensor:
    """Softmax over the last dimension with one more term, $e^{z}$, that takes no key.

    Args:
        scores: `(..., num_queries, num_keys)`, masked entries at $-\\infty$.
        sink_logits: broadcastable to `(..., num_queries, 1)`.

    Returns:
        The weights, `scores`' shape; each row sums to less than 1.

    Examples:
        >>> scores = torch.tensor([[0.0, 0.0]])  # one query, two keys, equal scores
        >>> softmax_with_sink(scores, torch.tensor(0.0))  # the sink (gpt-oss) takes a third
        tensor([[0.3333, 0.3333]])
    """
    sink = sink_logits.to(scores.dtype).expand(*scores.shape[:-1], 1)
    with_sink = torch.cat((scores, sink), dim=-1)  # (..., n_q, n_k + 1)
    return torch.softmax(with_sink, dim=-1)[..., :-1]  # the sink's column leaves


def causal_mask(
    num_tokens: int, device: torch.device | str | None = None, *, window: int | None = None
) -> Tensor:
    r"""The causal mask: True where query $i$ may see key $j$, at or before it ($j \le i$).

    With a `window` $w$, also the keys too far back: query $i$ sees only
    $i - w < j \le i$, its last $w$ tokens itself included (a sliding window, as in Mistral).

    Built for one call: the production module keeps no mask, and builds this one only on the
    explicit path (the fused kernel applies causality itself).

    Args:
        num_tokens: sequence length $T$.
        device: where to build the mask.
        window: how many tokens each query sees, itself included; None for all before it.

    Returns:
        Bool tensor of shape `(num_tokens, num_tokens)`.

    Examples:
        >>> causal_mask(3)
        tensor([[ True, False, False],
                [ True,  True, False],
                [ True,  True,  True]])
        >>> causal_mask(3, window=2)  # token 2 no longer sees token 0
        tensor([[ True, False, False],
                [ True,  True, False],
                [False,  True,  True]])
    """
    check_size("num_tokens", num_tokens, minimum=0)
    i = torch.arange(num_tokens, device=device)[:, None]  # query positions, a column
    j = torch.arange(num_tokens, device=device)[None, :]  # key positions, a row
    seen = j <= i  # (T, T): not the future
    if window is not None:
        seen &= j > i - check_size("window", window)  # nor the keys too far back
    return seen


def explicit_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None = None,
    dropout: Callable[[Tensor], Tensor] | None = None,
    sink_logits: Tensor | None = None,
    score_mod: Callable[[Tensor], Tensor] | None = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Scaled dot-product attention written out step by step; returns the weights too.

    $$
    \begin{aligned}
    \alpha &= \operatorname{dropout}\!\left(\operatorname{softmax}\!\left(
    \frac{Q K^\top}{\sqrt{d_k}} + M\right)\right), \\
    Z &= \alpha V.
    \end{aligned}
    $$

    A query whose every key is masked (a padded position under left padding, say) gets all-zero
    weights and a zero context vector instead of the $0/0 = $ NaN that a plain softmax over
    $-\infty$ would give. A masked key's weight is exactly 0, but $0 \cdot \text{NaN}$ is NaN:
    a NaN or infinite *value* at a masked key still reaches $Z$, as in PyTorch's own kernels.
    (The production module zeroes padded inputs first, so padding never carries one.)

    Args:
        queries: $Q$, shape `(..., num_queries, d_k)`.
        keys: $K$, shape `(..., num_keys, d_k)`.
        values: $V$, shape `(..., num_keys, d_v)`.
        mask: optional bool, broadcastable to `(..., num_queries, num_keys)`; True = may
            attend (the score is kept), False = hidden (the score becomes $-\infty$).
        dropout: applied to the weights right after the softmax: a module's `nn.Dropout`,
            which zeroes each weight with probability $p$ and scales the rest by $1/(1-p)$ in
            training mode, and does nothing in eval mode.
        sink_logits: optional logits $z$ of an *attention sink* (gpt-oss), broadcastable to
            `(..., num_queries, 1)`: one more term $e^{z}$ in each softmax, for a key that is
            always visible and has a zero value
            ([`softmax_with_sink`][attention.derivation.core.softmax_with_sink]); the rows
            then sum to less than 1.
        score_mod: optional function of the scaled scores $Q K^\top / \sqrt{d_k}$ that
            returns the scores the softmax takes (before the mask): a layer's score
            modifiers ([`attention.layer.score_mods`][attention.layer.score_mods]), bound to
            positions.
        scale: what $Q K^\top$ is multiplied by, instead of $1 / \sqrt{d_k}$ (SDPA's
            `scale`; Gemma 2's and Granite's layers use their own).

    Returns:
        `(context_vec, attn_weights)` of shapes `(..., num_queries, d_v)` and
        `(..., num_queries, num_keys)`.

    Raises:
        TypeError: tensors of different dtypes, or a mask that is not bool.
        ValueError: shapes that do not fit together, or tensors on different devices.

    Examples:
        >>> q = k = v = torch.eye(3)  # three tokens, d_k = d_v = 3
        >>> z, w = explicit_attention(q, k, v, mask=causal_mask(3))
        >>> w.sum(-1)  # every row of weights sums to 1
        tensor([1.0000, 1.0000, 1.0000])
        >>> w[0]  # the first token can only look at itself
        tensor([1., 0., 0.])
    """
    _check_values_and_mask(queries, keys, values, mask)
    d_k = keys.shape[-1]
    # omega / sqrt(d_k) = (Q / sqrt(d_k)) K^T, in float32 for float16/bfloat16 inputs (as the
    # fused kernels accumulate): a float16 score overflows past 65,504
    work = _softmax_dtype(queries.dtype)
    scaled = queries / math.sqrt(d_k) if scale is None else queries * scale
    attn_scores = attention_scores(scaled.to(work), keys.to(work))
    if score_mod is not None:  # f(omega / sqrt(d_k)): ALiBi, a soft cap, ...
        attn_scores = score_mod(attn_scores)
    fully_masked = None
    if mask is not None:
        # A row with nothing to attend to would be softmax(-inf, ..., -inf) = NaN: let it
        # attend to everything here, and zero its weights afterwards.
        fully_masked = ~mask.any(dim=-1, keepdim=True)  # (..., n_q, 1)
        attn_scores = attn_scores.masked_fill(~mask & ~fully_masked, float("-inf"))
    if score_mod is not None:  # a modifier may hide keys too (-inf): a row left with none
        dead = attn_scores.isneginf().all(dim=-1, keepdim=True)  # is empty, as if masked
        attn_scores = attn_scores.masked_fill(dead, 0.0)
        fully_masked = dead if fully_masked is None else fully_masked | dead
    # alpha = softmax(omega / sqrt(d_k) + M), each row sums to 1 (in the scores' float32 for
    # float16/bfloat16 inputs, then cast back)
    if sink_logits is None:
        attn_weights = torch.softmax(attn_scores, dim=-1)
    else:  # one more term in each row: attention.layer.sinks
        attn_weights = softmax_with_sink(attn_scores, sink_logits)
    attn_weights = attn_weights.to(queries.dtype)  # (..., n_q, n_k)
    if fully_masked is not None:
        attn_weights = attn_weights.masked_fill(fully_masked, 0.0)
    if dropout is not None:
        attn_weights = dropout(attn_weights)  # alpha~: (..., n_q, n_k)
    # Z = alpha V
    context_vec = attn_weights @ values  # (..., n_q, d_v)
    return context_vec, attn_weights


def online_attention(
    queries: Tensor, keys: Tensor, values: Tensor, *, block_size: int, causal: bool = False
) -> Tensor:
    r"""Attention over one block of keys at a time, with an online softmax, as fused kernels do.

    FlashAttention never holds all the scores $s_j = q \cdot k_j / \sqrt{d_k}$ of a query. It
    starts from $m = -\infty$, $\ell = 0$, $o = 0$ and, for each block of keys, updates a
    running maximum $m$, a running sum $\ell$ and an unnormalised output $o$, rescaling the
    old ones whenever the maximum grows:

    $$
    \begin{aligned}
    m' &= \max(m, \max_j s_j), \\
    \ell' &= e^{m - m'} \ell + \sum_j e^{s_j - m'}, \\
    o' &= e^{m - m'} o + \sum_j e^{s_j - m'} v_j .
    \end{aligned}
    $$

    After the last block, $\ell = \sum_j e^{s_j - m}$ over every key, and one division gives
    the softmax-weighted average of the values:

    $$
    z = \frac{o}{\ell} = \sum_j \frac{e^{s_j - m}}{\sum_{j'} e^{s_{j'} - m}}\, v_j
      = \sum_j \alpha_j v_j .
    $$

    A loop to read, not a kernel: the scores held at once are `(..., num_queries, block_size)`.

    Args:
        queries: $Q$, shape `(..., num_queries, d_k)`.
        keys: $K$, shape `(..., num_keys, d_k)`, at least one key.
        values: $V$, shape `(..., num_keys, d_v)`.
        block_size: keys per block, at least 1.
        causal: hide key $j$ from query $i$ when $j > i$ (as many queries as keys).

    Returns:
        $Z$, shape `(..., num_queries, d_v)`: the context vectors of
        [`explicit_attention`][attention.derivation.core.explicit_attention], up to rounding.

    Raises:
        TypeError: not floating-point tensors of one dtype, or `causal` not a bool.
        ValueError: shapes that do not fit together, no keys, or `block_size` below 1.

    Examples:
        >>> q, k, v = torch.randn(3, 2, 10, 4).unbind(0)  # (b, T, d) each
        >>> z, _ = explicit_attention(q, k, v, mask=causal_mask(10))
        >>> torch.allclose(online_attention(q, k, v, block_size=3, causal=True), z, atol=1e-6)
        True
    """
    _check_online(queries, keys, values, block_size, causal)
    num_queries, num_keys = queries.shape[-2], keys.shape[-2]
    q = queries / math.sqrt(keys.shape[-1])  # s_j = q . k_j / sqrt(d_k)
    m = q.new_full((*q.shape[:-1], 1), -math.inf)  # running maximum: (..., n_q, 1)
    ell = q.new_zeros((*q.shape[:-1], 1))  # running sum: (..., n_q, 1)
    o = q.new_zeros((*q.shape[:-1], values.shape[-1]))  # unnormalised output: (..., n_q, d_v)
    rows = torch.arange(num_queries, device=q.device)[:, None]  # query i: (n_q, 1)
    for start in range(0, num_keys, block_size):
        s = attention_scores(q, keys[..., start : start + block_size, :])  # (..., n_q, B)
        if causal:  # hide key j from query i when j > i
            cols = torch.arange(start, start + s.shape[-1], device=q.device)  # key j: (B,)
            s = s.masked_fill(cols > rows, -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # m' = max(m, max_j s_j)
        p = torch.exp(s - m_new)  # e^(s_j - m'): (..., n_q, B)
        rescale = torch.exp(m - m_new)  # e^(m - m'): (..., n_q, 1)
        ell = rescale * ell + p.sum(dim=-1, keepdim=True)  # l' = e^(m - m') l + sum_j e^(s_j - m')
        o = rescale * o + p @ values[..., start : start + block_size, :]  # o' (..., n_q, d_v)
        m = m_new
    return o / ell  # z = o / l: the softmax's denominator, divided out once at the end


def _check_online(
    queries: Tensor, keys: Tensor, values: Tensor, block_size: int, causal: bool
) -> None:
    check_size("block_size", block_size)
    check_flag("causal", causal)
    check_tensor("queries", queries, floating=True)
    check_tensor("keys", keys, like=queries)
    if min(queries.ndim, keys.ndim) < 2 or keys.shape[-2] == 0:
        raise ValueError(
            "queries and keys must be (..., num_tokens, d_k), with at least one key: "
            f"got queries {tuple(queries.shape)} and keys {tuple(keys.shape)}"
        )
    _check_values_and_mask(queries, keys, values, None)
    num_queries, num_keys = queries.shape[-2], keys.shape[-2]
    if causal and num_queries != num_keys:
        raise ValueError(f"causal needs num_queries == num_keys, got {num_queries} and {num_keys}")


def _check_values_and_mask(
    queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None
) -> None:
    check_tensor("values", values, like=queries)
    if values.ndim < 2 or values.shape[-2] != keys.shape[-2]:
        raise ValueError(
            "values must be (..., num_keys, d_v) with the keys' num_keys: "
            f"got keys {tuple(keys.shape)} and values {tuple(values.shape)}"
        )
    if mask is None:
        return
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}")
    scores = (
        *torch.broadcast_shapes(queries.shape[:-2], keys.shape[:-2]),
        queries.shape[-2],
        keys.shape[-2],
    )
    try:
        torch.broadcast_shapes(mask.shape, scores)
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
            f"(..., num_queries, num_keys) = {scores}"
        ) from None


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
