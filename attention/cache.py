r"""The key/value cache: what one attention layer keeps of the tokens it has seen.

A model generates one token at a time. Token $t$'s query must meet the keys and values of
tokens $0 \dots t$; those of tokens $0 \dots t - 1$ were computed at the steps before and do
not change (a causal layer's keys depend only on the past), so they are kept instead of
recomputed. The cache is allocated once, `(batch, h_kv, max_tokens, head_dim)` for keys and
for values, and filled in place: a prompt in one call or in chunks (*prefill*), then one token
per call (*decode*).

A chunk of $T$ new tokens arriving after $L$ cached ones has queries at positions
$L \dots L + T - 1$ and meets keys $0 \dots L + T - 1$: its causal mask is aligned to the
bottom right, query $i$ seeing key $j$ when $j \le L + i$
([`chunk_mask`][attention.cache.chunk_mask]).

Examples:
    >>> from attention import MultiHeadAttention
    >>> mha = MultiHeadAttention(8, 8, context_length=16, dropout=0.0, num_heads=2).eval()
    >>> x = torch.randn(1, 6, 8)
    >>> cache = mha.init_cache(batch_size=1, max_tokens=16)
    >>> prefill = mha(x[:, :4], cache=cache)  # tokens 0..3
    >>> step = mha(x[:, 4:5], cache=cache)  # token 4, attending to 0..4
    >>> cache
    KVCache(batch_size=1, length=5, max_tokens=16, num_kv_heads=2, head_dim=4)
    >>> torch.allclose(step, mha(x[:, :5])[:, 4:], atol=1e-6)  # as if recomputed
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.checks import check_size, check_tensor

if TYPE_CHECKING:
    from attention.multihead import MultiHeadAttention

__all__ = ["KVCache", "attend_cached", "chunk_mask"]


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    Made by [`MultiHeadAttention.init_cache`][attention.multihead.MultiHeadAttention.init_cache]
    on the module's device and dtype, with `num_kv_heads` heads: grouped-query attention
    shrinks it by `num_heads / num_kv_heads`.

    Args:
        batch_size: sequences generated together.
        max_tokens: the most tokens it holds, prompt included.
        num_kv_heads: key/value heads.
        head_dim: width of each head.
        device: where to allocate it.
        dtype: the keys' and values' dtype.

    Attributes:
        keys: `(batch_size, num_kv_heads, max_tokens, head_dim)`, filled up to `length`.
        values: the same shape.
        padding: `(batch_size, max_tokens)` bool, True where a cached token is padding.
        length: how many tokens it holds.
    """

    def __init__(
        self,
        batch_size: int,
        max_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size), ("max_tokens", max_tokens),
            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
        ):  # fmt: skip
            check_size(name, value)
        shape = (batch_size, num_kv_heads, max_tokens, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.padding = torch.zeros(batch_size, max_tokens, dtype=torch.bool, device=device)
        self.length = 0
        self.padded = False  # whether any cached token is padding

    @property
    def batch_size(self) -> int:
        return self.keys.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.keys.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values it holds when full."""
        return 2 * self.keys.numel() * self.keys.element_size()

    def reset(self) -> None:
        """Forget every token (the memory stays allocated)."""
        self.length = 0
        self.padded = False

    def append(
        self, keys: Tensor, values: Tensor, key_padding_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Write a chunk's keys and values after the cached ones; return all of them.

        Args:
            keys: the chunk's keys, `(batch_size, num_kv_heads, T, head_dim)`.
            values: likewise.
            key_padding_mask: the chunk's padding, `(batch_size, T)`, or None.

        Returns:
            `(keys, values, padding)` of every cached token, `(batch, h_kv, length, d_h)`
            views, and `(batch, length)` (None when no cached token is padding).

        Raises:
            ValueError: another batch size or head shape, or more tokens than fit.
        """
        check_tensor("keys", keys, ndim=4, like=self.keys)
        check_tensor("values", values, ndim=4, like=self.keys)
        b, h_kv, num_tokens, d_h = keys.shape
        if b != self.batch_size:
            raise ValueError(
                f"the cache was made for batch_size={self.batch_size}, got a batch of {b}"
            )
        if (h_kv, d_h) != self.keys.shape[1::2] or values.shape != keys.shape:
            raise ValueError(
                f"keys and values must be (batch, {self.keys.shape[1]}, T, {self.keys.shape[3]})"
                f", got {tuple(keys.shape)} and {tuple(values.shape)}"
            )
        end = self.length + num_tokens
        if end > self.max_tokens:
            raise ValueError(
                f"the cache holds {self.length} of max_tokens={self.max_tokens} tokens: "
                f"{num_tokens} more do not fit (reset it, or make a larger one)"
            )
        self.keys[:, :, self.length : end] = keys
        self.values[:, :, self.length : end] = values
        self.padding[:, self.length : end] = False if key_padding_mask is None else key_padding_mask
        self.padded |= key_padding_mask is not None and bool(key_padding_mask.any())
        self.length = end
        padding = self.padding[:, :end] if self.padded else None
        return self.keys[:, :, :end], self.values[:, :, :end], padding

    def __repr__(self) -> str:
        b, h_kv, max_tokens, d_h = self.keys.shape
        return (
            f"KVCache(batch_size={b}, length={self.length}, max_tokens={max_tokens}, "
            f"num_kv_heads={h_kv}, head_dim={d_h})"
        )


def chunk_mask(
    start: int,
    num_tokens: int,
    *,
    window: int | None = None,
    padding: Tensor | None = None,
    device: torch.device | str | None = None,
) -> Tensor | None:
    r"""The mask of a chunk of queries at positions `start ...` against every cached key.

    Query $i$ (position $L + i$, $L$ = `start`) is hidden from key $j$ when $j > L + i$ (the
    future), $j \le L + i - w$ (beyond the window), or key $j$ is padding; a padded query's
    whole row is hidden (it attends to nothing). True = hidden.

    Args:
        start: $L$, the tokens cached before the chunk.
        num_tokens: $T$, the chunk's tokens.
        window: the tokens each query sees, itself included.
        padding: `(batch, L + T)` bool, True where a token is padding, or None.
        device: where to build it.

    Returns:
        None when nothing is hidden (one new token, no window in reach, no padding); else
        `(T, L + T)`, or `(batch, 1, T, L + T)` with padding.

    Examples:
        >>> chunk_mask(3, 2)  # queries at 3 and 4 over keys 0..4: the bottom-right triangle
        tensor([[False, False, False, False,  True],
                [False, False, False, False, False]])
        >>> chunk_mask(3, 1) is None  # one new token sees every cached one
        True
    """
    total = start + num_tokens
    rows = torch.arange(start, total, device=device)[:, None]  # positions of the queries
    cols = torch.arange(total, device=device)[None, :]  # positions of the keys
    hidden = cols > rows  # the future: (T, L + T)
    if window is not None:
        hidden |= cols <= rows - window
    if padding is not None:  # padded keys, and every key of a padded query
        hidden = hidden | padding[:, None, None, :] | padding[:, None, start:, None]
    elif not bool(hidden.any()):
        return None
    return hidden


def attend_cached(
    mha: MultiHeadAttention,
    x: Tensor,
    key_padding_mask: Tensor | None,
    need_weights: bool,
    cache: KVCache,
) -> Tensor | tuple[Tensor, Tensor]:
    """`MultiHeadAttention.forward` with a cache: the chunk `x` attends to every cached token.

    Appends the chunk's keys and values first; RoPE positions start at the cache's length.
    `x` arrives checked, its padded positions zeroed.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache (from init_cache), got {type(cache).__name__}")
    b, num_tokens, _ = x.shape
    start = cache.length  # the chunk's first position
    queries = mha._split_heads(mha.W_query(x), mha.num_heads)  # (b, h, T, d_h)
    keys = mha._split_heads(mha.W_key(x), mha.num_kv_heads)  # (b, h_kv, T, d_h)
    values = mha._split_heads(mha.W_value(x), mha.num_kv_heads)  # (b, h_kv, T, d_h)
    queries, keys = mha._rotate(queries, keys, start=start)
    # every token so far: (b, h_kv, L + T, d_h) each, and their padding (b, L + T) or None
    keys, values, padding = cache.append(keys, values, key_padding_mask)
    mask = chunk_mask(start, num_tokens, window=mha.window, padding=padding,
                      device=queries.device)  # None | (T, L+T) | (b, 1, T, L+T)  # fmt: skip
    attn_weights = None
    if need_weights:
        context_vec, attn_weights = mha._explicit(queries, keys, values, mask)
    else:
        if mask is not None and padding is not None:  # padded queries: any row, zeroed
            mask = mask & ~padding[:, None, start:, None]
        context_vec = F.scaled_dot_product_attention(
            queries, keys, values,
            attn_mask=None if mask is None else mask.logical_not(),
            dropout_p=mha.dropout.p if mha.training else 0.0,
            enable_gqa=mha.num_kv_heads != mha.num_heads,
        )  # fmt: skip
        if key_padding_mask is not None:
            context_vec = context_vec.masked_fill(key_padding_mask[:, None, :, None], 0.0)
    context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, mha.d_out)
    out: Tensor = mha.out_proj(context_vec)  # (b, T, d_out)
    return (out, attn_weights) if attn_weights is not None else out
