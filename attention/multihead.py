r"""Chapters 8 and 9: multiple heads, first stacked, then split from one projection.

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
from torch import Tensor, nn

from attention.cache import KVCache, attend_cached
from attention.causal import CausalAttention
from attention.checks import (
    check_dropout,
    check_flag,
    check_input,
    check_padding_mask,
    check_size,
    drop_book_mask,
)
from attention.core import explicit_attention
from attention.fused import (
    attention_mask,
    fused_attention,
    rotate_tokens,
    shift_to_right_padding,
)
from attention.positions import apply_rope, rope_angles, rope_frequencies

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

    Raises:
        TypeError: a size is not an int, or `dropout` not a number.
        ValueError: a size below 1, or `dropout` outside $[0, 1)$.

    Examples:
        >>> from attention.simple import example_inputs
        >>> inputs = example_inputs()
        >>> batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
        >>> _ = torch.manual_seed(123)
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
        check_size("num_heads", num_heads)  # the heads check their other arguments
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
    Q = X W_q \in \mathbb{R}^{T \times h d_h}, \qquad
    K = X W_k,\; V = X W_v \in \mathbb{R}^{T \times h_{kv} d_h},
    $$

    $$
    Z^{(i)} = \operatorname{dropout}\!\left(\operatorname{softmax}\!\left(
    \frac{Q^{(i)} K^{(g(i))\top}}{\sqrt{d_h}} + M\right)\right) V^{(g(i))},
    \qquad g(i) = \lfloor i\, h_{kv} / h \rfloor,
    $$

    $$
    \text{out} = [Z^{(1)}; \dots; Z^{(h)}]\, W_o + b_o,
    $$

    with $M_{ij} = -\infty$ where key $j$ is in the future ($j > i$, if `causal`), beyond the
    `window` ($j \le i - w$) or padding. Query head $i$ reads key/value head $g(i)$: with
    `num_kv_heads` $h_{kv} < h$ heads share keys and values (grouped-query attention; $h_{kv} =
    1$ is multi-query attention). With `rope`, each head's queries and keys are rotated by
    their positions first ([`attention.positions`][attention.positions]).

    By default the attention runs in `torch.nn.functional.scaled_dot_product_attention` through
    [`fused_attention`][attention.fused.fused_attention], which never materialises the
    $T \times T$ weights. With `need_weights=True` it runs the explicit path
    ([`explicit_attention`][attention.core.explicit_attention]) and returns the weights too.
    Both paths are tested equal (outputs and gradients), and equal to
    `torch.nn.MultiheadAttention` with the same weights.

    Parameters are created in the book's order (`W_query`, `W_key`, `W_value`, `out_proj`), so
    with the defaults and the same `torch.manual_seed` this module equals the book's
    `MultiHeadAttention`. Unlike the book's class it keeps no `(context_length,
    context_length)` mask buffer (16 GiB at 131,072 tokens). A book checkpoint's `mask` entry
    (bool or float) is checked to be the causal mask and dropped, so
    `load_state_dict(book_state_dict)` works with `strict=True`.

    Compiling and exporting: `torch.compile` works (with a `key_padding_mask`, the check for
    right padding reads the mask, one graph break); `torch.export` works with a dynamic token
    count, with or without a padding mask. `torch.jit.script` is not supported: TorchScript is
    deprecated upstream. A NaN or infinity in a *real* token's input reaches every output that
    attends to it, and, as in PyTorch's kernels, also the earlier ones ($0 \cdot \text{NaN}$);
    in a padded position it changes nothing. RoPE positions and window distances count token
    slots, padded or not: left and right padding change no real output, but padding *between*
    real tokens moves them apart.

    Args:
        d_in: width of each input embedding.
        d_out: total output width $h d_h$, split across heads.
        context_length: the longest sequence supported.
        dropout: dropout probability on the attention weights, active in training only.
        num_heads: number of query heads $h$.
        qkv_bias: whether the query/key/value projections have a bias (`out_proj` always has).
        causal: mask future tokens (decoder style); `False` for encoder-style attention.
        num_kv_heads: key/value heads $h_{kv}$, dividing `num_heads`; default `num_heads`.
        window: with `causal`, the tokens each query sees, itself included; default all.
        rope: rotate queries and keys by their positions (rotate-half RoPE).
        rope_base: RoPE's base.

    Attributes:
        W_query: `nn.Linear(d_in, d_out)`.
        W_key: `nn.Linear(d_in, num_kv_heads * head_dim)`.
        W_value: `nn.Linear(d_in, num_kv_heads * head_dim)`.
        out_proj: `nn.Linear(d_out, d_out)`, $W_o$ and $b_o$.
        dropout: `nn.Dropout(dropout)`: applied to the weights on the explicit path; the
            kernel gets its `p` in training mode.
        head_dim: $d_h$ = `d_out // num_heads`.

    Raises:
        TypeError: a size is not an int, a switch not a bool, or `dropout` not a number.
        ValueError: a size below 1, `dropout` outside $[0, 1)$, `d_out` not divisible by
            `num_heads`, `num_heads` not by `num_kv_heads`, a window without `causal`, or
            `rope` with an odd `head_dim`.

    Examples:
        >>> from attention.simple import example_inputs
        >>> inputs = example_inputs()
        >>> batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
        >>> _ = torch.manual_seed(123)
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

        A current model's layer: 8 query heads sharing 2 key/value heads, RoPE, a window:

        >>> llama_like = MultiHeadAttention(64, 64, context_length=4096, dropout=0.0,
        ...     num_heads=8, num_kv_heads=2, rope=True, window=1024)
        >>> llama_like.W_key  # 2 heads of 8: a quarter of the keys
        Linear(in_features=64, out_features=16, bias=False)
    """

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
        num_kv_heads: int | None = None,
        window: int | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
    ) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("d_out", d_out), ("num_heads", num_heads)):
            check_size(name, value)
        check_size("context_length", context_length)
        check_dropout(dropout)
        if d_out % num_heads != 0:
            raise ValueError(
                f"d_out must be divisible by num_heads: got d_out={d_out}, num_heads={num_heads}"
            )
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_size("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                "num_heads must be divisible by num_kv_heads (each key/value head serves a "
                f"group of query heads): got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
            )
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_out // num_heads
        self.causal = check_flag("causal", causal)
        if window is not None:
            check_size("window", window)
            if not causal:
                raise ValueError(f"a sliding window needs causal=True, got window={window}")
        self.window = window
        self.rope = check_flag("rope", rope)
        rope_frequencies(2, rope_base)  # checks rope_base, used or not
        if rope and self.head_dim % 2:
            raise ValueError(
                "rope rotates pairs of dimensions: head_dim = d_out // num_heads must be "
                f"even, got head_dim={self.head_dim}"
            )
        self.rope_base = float(rope_base)
        check_flag("qkv_bias", qkv_bias)
        kv_dim = num_kv_heads * self.head_dim
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_load_state_dict_pre_hook(drop_book_mask)  # type: ignore[no-untyped-call]

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        need_weights: Literal[False] = ...,
        *,
        cache: KVCache | None = ...,
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: Literal[True],
        *,
        cache: KVCache | None = ...,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        *,
        need_weights: Literal[True],
        cache: KVCache | None = ...,
    ) -> tuple[Tensor, Tensor]: ...

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        *,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend over `x`.

        Args:
            x: shape `(batch, num_tokens, d_in)`, `num_tokens <= context_length`, of the
                parameters' dtype and device.
            key_padding_mask: optional bool `(batch, num_tokens)`, True marks padding. A padded
                position takes no part: no query attends to it, it attends to nothing (zero
                weights, a zero context vector, so its output is `out_proj`'s bias), and its
                input is never read (NaN or inf there changes nothing, gradients included).
            need_weights: also return the attention weights (runs the explicit path).
            cache: a [`KVCache`][attention.cache.KVCache] from
                [`init_cache`][attention.multihead.MultiHeadAttention.init_cache]: `x` is the
                next chunk of a sequence whose earlier tokens the cache holds; its keys and
                values are appended, and it attends to every cached token (positions, for
                RoPE, continue from the cache's length).

        Returns:
            `context_vec` of shape `(batch, num_tokens, d_out)`; with `need_weights=True`,
            `(context_vec, attn_weights)` with weights `(batch, num_heads, num_tokens, num_keys)`
            (`num_keys` is `num_tokens`, or the cache's length).

        Raises:
            TypeError: `x` is not floating point or not of the parameters' dtype.
            ValueError: wrong rank or width of `x`, too many tokens, another device, a mask
                of the wrong shape or dtype, or a chunk the cache cannot take.
        """
        check_input(x, self.d_in, self.context_length, batched=True, like=self.W_query.weight)
        check_flag("need_weights", need_weights)
        b, num_tokens, _ = x.shape
        shift = None
        if key_padding_mask is not None:
            check_padding_mask(key_padding_mask, b, num_tokens, x.device)
            # Padded positions must not matter at all: not even a NaN there may reach the
            # real outputs (0 * NaN = NaN inside a matmul), so their inputs are zeroed first.
            x = x.masked_fill(key_padding_mask[..., None], 0.0)  # (b, T, d_in)
        if cache is not None:
            return attend_cached(self, x, key_padding_mask, need_weights, cache)
        if key_padding_mask is not None:
            if self.causal and not need_weights:
                # The kernel needs no mask for real tokens followed by padding: rows whose
                # real tokens are one run elsewhere (left padding) are rotated into that
                # layout here, and their outputs rotated back at the end.
                shift = shift_to_right_padding(key_padding_mask)  # (b,) or None
                if shift is not None:
                    x = rotate_tokens(x, shift)  # (b, T, d_in)
                    key_padding_mask = rotate_tokens(key_padding_mask, shift)  # (b, T)

        # Q = X W_q, K = X W_k, V = X W_v, each split into heads of head_dim and moved before
        # the tokens: (b, T, h * d_h) -> (b, T, h, d_h) -> (b, h, T, d_h)
        queries = self._split_heads(self.W_query(x), self.num_heads)  # (b, h, T, d_h)
        keys = self._split_heads(self.W_key(x), self.num_kv_heads)  # (b, h_kv, T, d_h)
        values = self._split_heads(self.W_value(x), self.num_kv_heads)  # (b, h_kv, T, d_h)
        del x  # a zeroed or rotated copy is freed here, before the kernel (when not training)
        queries, keys = self._rotate(queries, keys, start=0)

        attn_weights = None
        if need_weights:
            mask = attention_mask(
                num_tokens, causal=self.causal, window=self.window,
                key_padding_mask=key_padding_mask, device=queries.device,
            )  # fmt: skip
            context_vec, attn_weights = self._explicit(queries, keys, values, mask)
        else:
            context_vec = fused_attention(
                queries, keys, values, causal=self.causal, window=self.window,
                key_padding_mask=key_padding_mask,
                dropout_p=self.dropout.p if self.training else 0.0,
            )  # fmt: skip

        # merge heads: (b, h, T, d_h) -> (b, T, h, d_h) -> (b, T, d_out)
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, self.d_out)
        out: Tensor = self.out_proj(context_vec)  # (b, T, d_out)
        if shift is not None:
            out = rotate_tokens(out, -shift)  # every token back in its place
        if need_weights:
            assert attn_weights is not None
            return out, attn_weights
        return out

    def init_cache(self, batch_size: int, max_tokens: int | None = None) -> KVCache:
        """An empty key/value cache for generating with this module, on its device and dtype.

        Args:
            batch_size: sequences generated together.
            max_tokens: the most tokens it will hold, prompt included; default
                `context_length`.

        Returns:
            A [`KVCache`][attention.cache.KVCache] of `num_kv_heads` heads.

        Raises:
            ValueError: the module is not causal, or `max_tokens` exceeds `context_length`.
        """
        if not self.causal:
            raise ValueError("a key/value cache needs causal=True: later tokens would change "
                             "what earlier ones attend to")  # fmt: skip
        max_tokens = self.context_length if max_tokens is None else max_tokens
        check_size("max_tokens", max_tokens)
        if max_tokens > self.context_length:
            raise ValueError(
                f"max_tokens={max_tokens} is longer than context_length={self.context_length}"
            )
        weight = self.W_key.weight
        return KVCache(batch_size, max_tokens, self.num_kv_heads, self.head_dim,
                       device=weight.device, dtype=weight.dtype)  # fmt: skip

    def _rotate(self, queries: Tensor, keys: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """RoPE, if on: turn each query and key by m * theta_i, m = start, start + 1, ..."""
        if not self.rope:
            return queries, keys
        cos, sin = rope_angles(queries.shape[-2], self.head_dim, self.rope_base, offset=start,
                               device=queries.device, dtype=queries.dtype)  # fmt: skip
        return apply_rope(queries, cos, sin), apply_rope(keys, cos, sin)

    def _explicit(
        self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The explicit path: each query head reads its key/value head, repeated per group."""
        group = self.num_heads // self.num_kv_heads  # query head i reads kv head i // group
        keys = keys.repeat_interleave(group, dim=1)  # (b, h, S, d_h)
        values = values.repeat_interleave(group, dim=1)  # (b, h, S, d_h)
        return explicit_attention(queries, keys, values, mask, dropout=self.dropout)

    def _split_heads(self, t: Tensor, num_heads: int) -> Tensor:
        b, num_tokens, _ = t.shape
        t = t.view(b, num_tokens, num_heads, self.head_dim)  # (b, T, heads, d_h)
        return t.transpose(1, 2)  # (b, heads, T, d_h)

    def extra_repr(self) -> str:
        """Shown by `print(module)`: what is not visible in the submodules."""
        options = [f"num_heads={self.num_heads}", f"causal={self.causal}"]
        if self.num_kv_heads != self.num_heads:
            options.append(f"num_kv_heads={self.num_kv_heads}")
        if self.window is not None:
            options.append(f"window={self.window}")
        if self.rope:
            options.append(f"rope_base={self.rope_base:g}")
        return ", ".join(options)

    @classmethod
    def from_wrapper(cls, wrapper: MultiHeadAttentionWrapper) -> MultiHeadAttention:
        """The fused module that computes exactly what `wrapper` computes.

        Head $i$'s `W_query` becomes rows $i d_h \\dots (i+1) d_h$ of the fused `W_query` (and
        likewise for keys and values), which is the slice that the head split's `view` hands
        to head $i$; `out_proj` is the identity with zero bias, since the wrapper has none.
        The new module is in the wrapper's mode (`training` or `eval`).

        Args:
            wrapper: a `MultiHeadAttentionWrapper` of `num_heads` heads, each `d_out` wide.

        Returns:
            A `MultiHeadAttention` with `d_out * num_heads` outputs, same device, dtype and
            mode.

        Raises:
            TypeError: `wrapper` is not a `MultiHeadAttentionWrapper`.

        Examples:
            >>> _ = torch.manual_seed(0)
            >>> wrapper = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0, num_heads=2)
            >>> fused = MultiHeadAttention.from_wrapper(wrapper.eval())
            >>> fused.training
            False
            >>> x = torch.randn(2, 6, 3)
            >>> torch.allclose(wrapper(x), fused(x), atol=1e-6)
            True
        """
        if not isinstance(wrapper, MultiHeadAttentionWrapper):
            raise TypeError(f"expected a MultiHeadAttentionWrapper, got {type(wrapper).__name__}")
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
        return fused.train(wrapper.training)
