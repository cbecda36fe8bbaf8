r"""Stages 5 and 6: multiple heads, first stacked, then split from one projection.

With $h$ heads, each head $i$ has its own projections and attends on its own:

$$
\operatorname{head}_i = \operatorname{Attention}(X W_q^{(i)}, X W_k^{(i)}, X W_v^{(i)}),
$$

$$
\operatorname{MultiHead}(X) = [\operatorname{head}_1; \dots; \operatorname{head}_h]\, W_o .
$$

[`MultiHeadAttentionWrapper`][attention.multihead.MultiHeadAttentionWrapper] computes this
literally, one `CausalAttention` per head.
[`MultiHeadAttention`][attention.multihead.MultiHeadAttention] stacks the $h$ per-head
matrices into one `Linear(d_in, d_out)` each for queries, keys and values, splits the result
into heads with a `view` and a `transpose`, and runs all heads in one batched kernel.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.causal import CausalAttention
from attention.core import check_input, explicit_attention, padding_to_attn_mask

__all__ = ["MultiHeadAttention", "MultiHeadAttentionWrapper"]


class MultiHeadAttentionWrapper(nn.Module):
    r"""`num_heads` independent `CausalAttention` heads whose outputs are concatenated.

    As in the book, each head is `d_out` wide, so the output is `d_out * num_heads` wide (the
    fused class's `d_out` is instead the total width). There is no output projection.

    Args:
        d_in: width of each input embedding.
        d_out: width of **each head**.
        context_length: the longest sequence supported.
        dropout: dropout probability on each head's attention weights.
        num_heads: number of heads $h$.
        qkv_bias: whether the projections have a bias.

    Attributes:
        heads: `nn.ModuleList` of `num_heads` `CausalAttention(d_in, d_out, ...)`, created in order.

    Examples:
        >>> from attention.simple import example_inputs
        >>> inputs = example_inputs()
        >>> batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
        >>> torch.manual_seed(123)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> mha = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0.0, num_heads=2)
        >>> context_vecs = mha(batch)
        >>> context_vecs.shape  # (batch, num_tokens, d_out * num_heads)
        torch.Size([2, 6, 4])
        >>> context_vecs[0, 0]
        tensor([-0.4519,  0.2216,  0.4772,  0.1063], grad_fn=<SelectBackward0>)
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        self.heads = nn.ModuleList(
            [
                CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
                for _ in range(num_heads)
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        """`(batch, num_tokens, d_in)` -> `(batch, num_tokens, d_out * num_heads)`."""
        return torch.cat([head(x) for head in self.heads], dim=-1)


class MultiHeadAttention(nn.Module):
    r"""Production multi-head self-attention on PyTorch's fused kernel.

    $$
    Q = X W_q,\; K = X W_k,\; V = X W_v \in \mathbb{R}^{T \times d_\text{out}}
    $$

    $$
    \xrightarrow{\text{split}}\; Q^{(i)}, K^{(i)}, V^{(i)} \in \mathbb{R}^{T \times d_h},
    \qquad d_h = d_\text{out} / h,
    $$

    $$
    Z^{(i)} = \operatorname{dropout}\!\left(\operatorname{softmax}\!\left(
    \frac{Q^{(i)} K^{(i)\top}}{\sqrt{d_h}} + M\right)\right) V^{(i)},
    $$

    $$
    \text{out} = [Z^{(1)}; \dots; Z^{(h)}]\, W_o + b_o,
    $$

    with $M_{ij} = -\infty$ where key $j$ is in the future ($j > i$, if `causal`) or is padding.

    By default the attention runs in `torch.nn.functional.scaled_dot_product_attention`, which
    dispatches to a fused flash or memory-efficient kernel and never materialises the
    $T \times T$ weights. With `need_weights=True` it runs the explicit path
    ([`explicit_attention`][attention.core.explicit_attention]) and returns the weights too.
    Both paths are tested equal (outputs and gradients) and equal to
    `torch.nn.MultiheadAttention` with the same weights.

    Parameters are created in the book's order (`W_query`, `W_key`, `W_value`, `out_proj`), so
    under the same `torch.manual_seed` this module equals the book's `MultiHeadAttention`.

    Args:
        d_in: width of each input embedding.
        d_out: total output width, split across heads; must be divisible by `num_heads`.
        context_length: the longest sequence supported.
        dropout: dropout probability on the attention weights, active in training only.
        num_heads: number of heads $h$.
        qkv_bias: whether the query/key/value projections have a bias (`out_proj` always has).
        causal: mask future tokens (decoder style); `False` for encoder-style attention.

    Attributes:
        W_query: `nn.Linear(d_in, d_out)`.
        W_key: `nn.Linear(d_in, d_out)`.
        W_value: `nn.Linear(d_in, d_out)`.
        out_proj: `nn.Linear(d_out, d_out)`, $W_o$ and $b_o$.
        dropout: `nn.Dropout(dropout)`.
        mask: bool buffer `(context_length, context_length)`, True above the diagonal.
        head_dim: $d_h$ = `d_out // num_heads`.

    Raises:
        ValueError: if `d_out` is not divisible by `num_heads`.

    Examples:
        >>> from attention.simple import example_inputs
        >>> inputs = example_inputs()
        >>> batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
        >>> torch.manual_seed(123)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> mha = MultiHeadAttention(3, 2, context_length=6, dropout=0.0, num_heads=2)
        >>> context_vecs = mha(batch)
        >>> context_vecs.shape  # (batch, num_tokens, d_out)
        torch.Size([2, 6, 2])
        >>> context_vecs[0, 0]
        tensor([0.3190, 0.4858], grad_fn=<SelectBackward0>)

        The weights, one `(num_tokens, num_tokens)` matrix per head:

        >>> out, attn_weights = mha(batch, need_weights=True)
        >>> attn_weights.shape  # (batch, num_heads, num_tokens, num_tokens)
        torch.Size([2, 2, 6, 6])
        >>> torch.allclose(out, context_vecs, atol=1e-6)
        True
    """

    mask: Tensor

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        *,
        causal: bool = True,
    ) -> None:
        super().__init__()
        if num_heads < 1 or d_out % num_heads != 0:
            raise ValueError(
                f"d_out must be divisible by num_heads: got d_out={d_out}, num_heads={num_heads}"
            )
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.causal = causal
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        ones = torch.ones(context_length, context_length, dtype=torch.bool)
        self.register_buffer("mask", torch.triu(ones, diagonal=1))

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        need_weights: Literal[False] = ...,
    ) -> Tensor: ...

    @overload
    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None, need_weights: Literal[True]
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = ..., *, need_weights: Literal[True]
    ) -> tuple[Tensor, Tensor]: ...

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend over `x`.

        Args:
            x: shape `(batch, num_tokens, d_in)`, `num_tokens <= context_length`.
            key_padding_mask: optional bool `(batch, num_tokens)`, True marks padding: no
                query attends to a padded key. A query with no key left to attend to gets a
                zero context vector (before `out_proj`), never NaN.
            need_weights: also return the attention weights (runs the explicit path).

        Returns:
            `context_vec` of shape `(batch, num_tokens, d_out)`; with `need_weights=True`,
            `(context_vec, attn_weights)` with weights `(batch, num_heads, num_tokens, num_tokens)`.

        Raises:
            ValueError: wrong rank or width of `x`, too many tokens, or a mask of the wrong
                shape or dtype.
        """
        check_input(x, self.d_in, self.context_length, batched=True)
        b, num_tokens, _ = x.shape
        if key_padding_mask is not None:
            self._check_padding_mask(key_padding_mask, b, num_tokens)

        # Q = X W_q, K = X W_k, V = X W_v, then split d_out into num_heads x head_dim
        # and move heads before tokens: (b, T, d_out) -> (b, T, h, d_h) -> (b, h, T, d_h)
        queries = self._split_heads(self.W_query(x))  # (b, h, T, d_h)
        keys = self._split_heads(self.W_key(x))  # (b, h, T, d_h)
        values = self._split_heads(self.W_value(x))  # (b, h, T, d_h)

        dropout_p = self.dropout.p if self.training else 0.0
        attn_weights = None
        if need_weights:
            mask = self._attn_mask(num_tokens, key_padding_mask)  # None | (T, T) | (b, 1, T, T)
            context_vec, attn_weights = explicit_attention(
                queries, keys, values, mask, dropout_p=dropout_p, training=self.training
            )
        elif key_padding_mask is None:
            # The kernel applies the causal mask itself, block by block: nothing T x T is built.
            context_vec = F.scaled_dot_product_attention(
                queries, keys, values, dropout_p=dropout_p, is_causal=self.causal
            )
        else:
            context_vec = self._fused_with_padding(
                queries, keys, values, key_padding_mask, dropout_p
            )

        # merge heads: (b, h, T, d_h) -> (b, T, h, d_h) -> (b, T, d_out)
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, self.d_out)
        out: Tensor = self.out_proj(context_vec)  # (b, T, d_out)
        if need_weights:
            assert attn_weights is not None
            return out, attn_weights
        return out

    def _split_heads(self, t: Tensor) -> Tensor:
        b, num_tokens, _ = t.shape
        t = t.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, h, d_h)
        return t.transpose(1, 2)  # (b, h, T, d_h)

    def _attn_mask(self, num_tokens: int, key_padding_mask: Tensor | None) -> Tensor | None:
        """The explicit path's bool mask (True = masked), or None when nothing is masked."""
        padding = None if key_padding_mask is None else padding_to_attn_mask(key_padding_mask)
        if not self.causal:
            return padding  # None or (b, 1, 1, T): the same for every query
        causal = self.mask[:num_tokens, :num_tokens]  # (T, T): the buffer's top-left corner
        return causal if padding is None else causal | padding  # (T, T) or (b, 1, T, T)

    def _fused_with_padding(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        key_padding_mask: Tensor,
        dropout_p: float,
    ) -> Tensor:
        """The fused kernel with a padding mask; a query with no key left gets a zero vector.

        SDPA takes `is_causal` or a mask, not both. Without the causal mask the padding mask
        stays `(b, 1, 1, T)` and the kernel broadcasts it. With it, one additive float bias
        `(b, 1, T, T)` holds both ($0$ = attend, $-\\infty$ = masked): the one $T \\times T$
        tensor that causal attention over padded batches cannot avoid.
        """
        b, _, num_tokens, _ = queries.shape
        if self.causal:
            # Query i has nothing to attend to when keys 0..i are all padding.
            no_key = (~key_padding_mask).cumsum(dim=-1) == 0  # (b, T)
            bias = torch.zeros(
                b, 1, num_tokens, num_tokens, dtype=queries.dtype, device=queries.device
            )
            bias.masked_fill_(self.mask[:num_tokens, :num_tokens], float("-inf"))  # future keys
            bias.masked_fill_(padding_to_attn_mask(key_padding_mask), float("-inf"))  # padded keys
            bias.masked_fill_(no_key[:, None, :, None], 0.0)  # no -inf-only rows: they give NaN
            attn_mask = bias  # (b, 1, T, T)
        else:
            all_padding = key_padding_mask.all(dim=-1, keepdim=True)  # (b, 1)
            no_key = all_padding.expand(b, num_tokens)  # (b, T): every query, or none
            # Unmask an all-padding sequence (its outputs are zeroed below), then flip to
            # SDPA's convention, True = may attend: (b, 1, 1, T)
            attn_mask = ~padding_to_attn_mask(key_padding_mask & ~all_padding)
        context_vec = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=attn_mask, dropout_p=dropout_p
        )  # (b, h, T, d_h)
        return context_vec.masked_fill(no_key[:, None, :, None], 0.0)

    def _check_padding_mask(self, key_padding_mask: Tensor, b: int, num_tokens: int) -> None:
        if key_padding_mask.shape != (b, num_tokens):
            raise ValueError(
                f"key_padding_mask must have shape (batch, num_tokens) = ({b}, {num_tokens}), "
                f"got {tuple(key_padding_mask.shape)}"
            )
        if key_padding_mask.dtype != torch.bool:
            raise ValueError(
                "key_padding_mask must be a bool tensor (True marks padding), "
                f"got dtype {key_padding_mask.dtype}"
            )

    @classmethod
    def from_wrapper(cls, wrapper: MultiHeadAttentionWrapper) -> MultiHeadAttention:
        """The fused module that computes exactly what `wrapper` computes.

        Head $i$'s `W_query` becomes rows $i d_h \\dots (i+1) d_h$ of the fused `W_query` (and
        likewise for keys and values), which is the slice that the head split's `view` hands
        to head $i$; `out_proj` is the identity with zero bias, since the wrapper has none.

        Args:
            wrapper: a `MultiHeadAttentionWrapper` of `num_heads` heads, each `d_out` wide.

        Returns:
            A `MultiHeadAttention` with `d_out * num_heads` outputs, same device and dtype.

        Examples:
            >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
            <torch._C.Generator object at ...>
            >>> wrapper = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0, num_heads=2)
            >>> fused = MultiHeadAttention.from_wrapper(wrapper)
            >>> x = torch.randn(2, 6, 3)
            >>> torch.allclose(wrapper(x), fused(x), atol=1e-6)
            True
        """
        heads: list[CausalAttention] = list(wrapper.heads)  # type: ignore[arg-type]
        first = heads[0]
        qkv_bias = first.W_query.bias is not None
        weight = first.W_query.weight
        fused = cls(
            first.d_in,
            first.d_out * len(heads),
            first.context_length,
            first.dropout.p,
            num_heads=len(heads),
            qkv_bias=qkv_bias,
        ).to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for name in ("W_query", "W_key", "W_value"):
                target: nn.Linear = getattr(fused, name)
                target.weight.copy_(torch.cat([getattr(h, name).weight for h in heads], dim=0))
                if qkv_bias:
                    target.bias.copy_(torch.cat([getattr(h, name).bias for h in heads], dim=0))
            fused.out_proj.weight.copy_(torch.eye(fused.d_out))
            fused.out_proj.bias.zero_()
        return fused
