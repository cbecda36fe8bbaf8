r"""The functional core: scores, masks, softmax and explicit attention as pure functions.

Every stage of the derivation, and the production module's explicit path, computes

$$
\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}
+ M\right) V,
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

Masks are boolean and **True marks a position that must not be attended to**, as in the book's
`mask.bool()` and in `torch.nn.MultiheadAttention`'s `key_padding_mask`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "attention_scores",
    "causal_mask",
    "check_dropout",
    "check_input",
    "check_size",
    "explicit_attention",
    "padding_to_attn_mask",
    "softmax_stable",
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
        ValueError: if queries and keys do not share their last dimension $d_k$.

    Examples:
        >>> q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> attention_scores(q, q)
        tensor([[1., 0.],
                [0., 4.]])
    """
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            "queries and keys must share d_k (their last dimension): "
            f"got queries {tuple(queries.shape)} and keys {tuple(keys.shape)}"
        )
    return queries @ keys.transpose(-2, -1)  # (..., num_queries, num_keys)


def softmax_stable(x: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax that cannot overflow: subtract the maximum before exponentiating.

    $$
    \operatorname{softmax}(x)_i = \frac{e^{x_i - m}}{\sum_j e^{x_j - m}}, \qquad m = \max_j x_j.
    $$

    The shift by $m$ cancels between numerator and denominator, so the result equals the naive
    formula wherever that one is finite; but the largest exponent is now $e^0 = 1$, so nothing
    overflows. Equal to `torch.softmax` (which does the same internally).

    Args:
        x: scores of any shape.
        dim: the dimension that sums to 1.

    Returns:
        Weights with the shape of `x`, non-negative, summing to 1 along `dim`.

    Examples:
        >>> softmax_stable(torch.tensor([1000.0, 1000.0]))
        tensor([0.5000, 0.5000])
        >>> softmax_stable(torch.empty(2, 0))  # nothing to normalise: empty, as torch.softmax
        tensor([], size=(2, 0))
    """
    if x.shape[dim] == 0:  # no maximum to subtract; the result is as empty as the input
        return torch.empty_like(x)
    m = x.amax(dim=dim, keepdim=True)
    e = torch.exp(x - m)
    return e / e.sum(dim=dim, keepdim=True)


def causal_mask(num_tokens: int, device: torch.device | str | None = None) -> Tensor:
    r"""The causal mask: True above the diagonal, where key $j$ comes after query $i$ ($j > i$).

    Built for one call: the production module keeps no mask, and builds this one only on the
    explicit path (the fused kernel applies causality itself).

    Args:
        num_tokens: sequence length $T$.
        device: where to build the mask.

    Returns:
        Bool tensor of shape `(num_tokens, num_tokens)`.

    Examples:
        >>> causal_mask(3)
        tensor([[False,  True,  True],
                [False, False,  True],
                [False, False, False]])
    """
    ones = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device)
    return torch.triu(ones, diagonal=1)


def padding_to_attn_mask(key_padding_mask: Tensor) -> Tensor:
    """Broadcast a `(batch, num_keys)` padding mask over heads and queries.

    Args:
        key_padding_mask: bool, shape `(batch, num_keys)`, True marks padding.

    Returns:
        Bool tensor of shape `(batch, 1, 1, num_keys)`, ready to be or-ed with a causal mask of
        shape `(num_queries, num_keys)`.

    Examples:
        >>> padding_to_attn_mask(torch.tensor([[False, True]])).shape
        torch.Size([1, 1, 1, 2])
    """
    return key_padding_mask[:, None, None, :]


def explicit_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""Scaled dot-product attention written out step by step; returns the weights too.

    $$
    \alpha = \operatorname{dropout}\!\left(\operatorname{softmax}\!\left(
    \frac{Q K^\top}{\sqrt{d_k}} + M\right)\right), \qquad Z = \alpha V.
    $$

    A query whose every key is masked (a padded position under left padding, say) gets all-zero
    weights and a zero context vector instead of the $0/0 = $ NaN that a plain softmax over
    $-\infty$ would give.

    Args:
        queries: $Q$, shape `(..., num_queries, d_k)`.
        keys: $K$, shape `(..., num_keys, d_k)`.
        values: $V$, shape `(..., num_keys, d_v)`.
        mask: optional bool, broadcastable to `(..., num_queries, num_keys)`; True = masked.
        dropout_p: probability of zeroing an attention weight (the rest are scaled by
            $1/(1-p)$); applied only if `training`.
        training: whether dropout is active.

    Returns:
        `(context_vec, attn_weights)` of shapes `(..., num_queries, d_v)` and
        `(..., num_queries, num_keys)`.

    Examples:
        >>> q = k = v = torch.eye(3)  # three tokens, d_k = d_v = 3
        >>> z, w = explicit_attention(q, k, v, mask=causal_mask(3))
        >>> w.sum(-1)  # every row of weights sums to 1
        tensor([1.0000, 1.0000, 1.0000])
        >>> w[0]  # the first token can only look at itself
        tensor([1., 0., 0.])
    """
    d_k = keys.shape[-1]
    # omega / sqrt(d_k) = (Q / sqrt(d_k)) K^T: scaling Q first keeps float16 scores finite
    attn_scores = attention_scores(queries / math.sqrt(d_k), keys)  # (..., n_q, n_k)
    fully_masked = None
    if mask is not None:
        # A row with nothing to attend to would be softmax(-inf, ..., -inf) = NaN: let it
        # attend to everything here, and zero its weights afterwards.
        fully_masked = mask.all(dim=-1, keepdim=True)  # (..., n_q, 1)
        attn_scores = attn_scores.masked_fill(mask & ~fully_masked, float("-inf"))
    # alpha = softmax(omega / sqrt(d_k) + M), each row sums to 1; the sums of exponentials are
    # accumulated in float32 even for float16/bfloat16 scores, as the fused kernels do
    attn_weights = torch.softmax(attn_scores, dim=-1, dtype=_softmax_dtype(attn_scores.dtype))
    attn_weights = attn_weights.to(attn_scores.dtype)  # (..., n_q, n_k)
    if fully_masked is not None:
        attn_weights = attn_weights.masked_fill(fully_masked, 0.0)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout_p, training=training)
    # Z = alpha V
    context_vec = attn_weights @ values  # (..., n_q, d_v)
    return context_vec, attn_weights


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def check_input(
    x: Tensor,
    d_in: int,
    context_length: int | None = None,
    *,
    batched: bool,
    like: Tensor | None = None,
) -> None:
    """Raise an error naming the expected and the actual value of an attention input.

    Args:
        x: the input tensor.
        d_in: the expected last dimension.
        context_length: the longest sequence the module supports, if it has a limit.
        batched: whether `x` must be `(batch, num_tokens, d_in)`; otherwise
            `(num_tokens, d_in)` is also accepted.
        like: a parameter of the module: `x` must have its dtype (unless autocast is on for
            its device) and its device.

    Raises:
        TypeError: `x` is not a tensor, not floating point, or not of `like`'s dtype.
        ValueError: wrong rank, wrong last dimension, too many tokens, or not on `like`'s
            device.

    Examples:
        >>> check_input(torch.zeros(2, 7, 3), d_in=3, context_length=6, batched=True)
        Traceback (most recent call last):
        ...
        ValueError: sequence of 7 tokens is longer than context_length=6
        >>> check_input(torch.zeros(2, 6, 3, dtype=torch.long), d_in=3, batched=True)
        Traceback (most recent call last):
        ...
        TypeError: expected a floating-point input (embeddings, not ids), got dtype torch.int64
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"expected the input x to be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"expected a floating-point input (embeddings, not ids), got dtype {x.dtype}"
        )
    if like is not None:
        if x.device != like.device:
            raise ValueError(
                f"expected the input on {like.device} (where the module's parameters are), "
                f"got it on {x.device}: move one with .to()"
            )
        if x.dtype != like.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"expected input of dtype {like.dtype} (the module's parameters), got "
                f"{x.dtype}: convert the input with x.to({like.dtype}) or the module with "
                f".to({x.dtype})"
            )
    expected = "(batch, num_tokens, d_in)" if batched else "(num_tokens, d_in)"
    ranks = (3,) if batched else (2, 3)
    if x.ndim not in ranks:
        raise ValueError(
            f"expected input of shape {expected} with d_in={d_in}, "
            f"got a {x.ndim}-d tensor of shape {tuple(x.shape)}"
        )
    if x.shape[-1] != d_in:
        raise ValueError(
            f"expected input of shape {expected} with d_in={d_in}, "
            f"got last dimension {x.shape[-1]} (shape {tuple(x.shape)})"
        )
    num_tokens = x.shape[-2]
    if context_length is not None and num_tokens > context_length:
        raise ValueError(
            f"sequence of {num_tokens} tokens is longer than context_length={context_length}"
        )


def check_size(name: str, value: object, *, minimum: int = 1) -> int:
    """Check that a size argument (a width, a count, a length) is an int of at least `minimum`.

    Args:
        name: the argument's name, for the message.
        value: what was passed.
        minimum: the smallest allowed value.

    Returns:
        `value`, as an `int`.

    Raises:
        TypeError: `value` is not an int (a float, a bool or a tensor, say).
        ValueError: `value` is below `minimum`.

    Examples:
        >>> check_size("num_heads", 2.0)
        Traceback (most recent call last):
        ...
        TypeError: num_heads must be an int, got 2.0 (float)
        >>> check_size("context_length", 0)
        Traceback (most recent call last):
        ...
        ValueError: context_length must be >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_dropout(value: object, name: str = "dropout") -> float:
    """Check that a dropout probability is a real number in $[0, 1)$.

    $p = 1$ would drop every weight and scale the rest by $1/(1-p)$, a division by zero.

    Args:
        value: what was passed.
        name: the argument's name, for the message.

    Returns:
        `value`, as a `float`.

    Raises:
        TypeError: `value` is not a real number (None, a string, a bool).
        ValueError: `value` is outside $[0, 1)$, or NaN.

    Examples:
        >>> check_dropout(1.5)
        Traceback (most recent call last):
        ...
        ValueError: dropout must be a probability in [0, 1), got 1.5
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r} ({type(value).__name__})")
    if not 0.0 <= value < 1.0:  # False for NaN too
        raise ValueError(f"{name} must be a probability in [0, 1), got {value}")
    return float(value)
