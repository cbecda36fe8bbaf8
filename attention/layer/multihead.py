r"""Chapter 9 onwards: the production `MultiHeadAttention`, all heads in one fused kernel.

Chapter 8's [`MultiHeadAttentionWrapper`][attention.derivation.wrapper.MultiHeadAttentionWrapper]
runs one `CausalAttention` per head. This module stacks the $h$ per-head matrices into one
`Linear(d_in, d_out)` each for queries, keys and values, splits the result into heads with a
`view` and a `transpose`, and runs every head in one kernel call, which the planner
([`attention.layer.fused`][attention.layer.fused]) picks from the layer's mask
([`attention.layer.masks`][attention.layer.masks]).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, overload

import torch
from torch import Size, Tensor, nn

from attention.checks import (
    check_dropout,
    check_flag,
    check_input,
    check_padding_mask,
    check_positive,
    check_size,
    check_tensor,
)
from attention.derivation.causal import CausalAttention
from attention.derivation.core import causal_mask, explicit_attention
from attention.derivation.wrapper import MultiHeadAttentionWrapper
from attention.layer import flex
from attention.layer.cache import KVCache, next_positions
from attention.layer.fused import cross_attention, fused_attention, visible
from attention.layer.masks import (
    Mask,
    as_mask,
    chunk_mask,
    evaluate,
    from_flags,
    indices,
    segments,
)
from attention.layer.positions import RotaryTable, rope_frequencies, rotate_with
from attention.layer.score_mods import ScoreMod, as_score_mods

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    r"""Production multi-head self-attention on PyTorch's fused kernel.

    $$
    \begin{aligned}
    Q &= X W_q \in \mathbb{R}^{T \times h d_h}, \\
    K &= X W_k,\; V = X W_v \in \mathbb{R}^{T \times h_{kv} d_h},
    \end{aligned}
    $$

    $$
    \begin{gathered}
    \begin{aligned}
    Z^{(i)} = \operatorname{dropout}\!\biggl(\operatorname{softmax}\!\biggl(
    & \frac{Q^{(i)} K^{(g(i))\top}}{\sqrt{d_h}} \\
    & {} + M\biggr)\biggr) V^{(g(i))},
    \end{aligned} \\
    g(i) = \lfloor i\, h_{kv} / h \rfloor,
    \end{gathered}
    $$

    $$
    \text{out} = [Z^{(0)}; \dots; Z^{(h-1)}]\, W_o + b_o,
    $$

    with $M_{ij} = 0$ where query $i$ may see key $j$ and $-\infty$ elsewhere: the layer's
    `mask` ([`attention.layer.masks`][attention.layer.masks]: the future if `causal`, beyond the
    `window` except the first `sinks` tokens, or any `mask_mod`), then padding and other documents.
    With `score_mods` ([`attention.layer.score_mods`][attention.layer.score_mods]), each scaled
    score passes through them, in order, before $M$ is added. Query head $i$ reads
    key/value head $g(i)$: with `num_kv_heads` $h_{kv} < h$ heads share keys and values
    (grouped-query attention; $h_{kv} = 1$ is multi-query attention). With `rope`, each
    head's queries and keys are rotated by their positions first
    ([`attention.layer.positions`][attention.layer.positions]). With `sink_logit`, each head has a
    learned logit for attending to nothing (gpt-oss).

    One forward serves every call: project, rotate at the tokens' positions, store in the
    cache if one is given, attend, merge the heads. By default the attention runs in
    `torch.nn.functional.scaled_dot_product_attention` through
    [`fused_attention`][attention.layer.fused.fused_attention], which never materialises the
    $T \times T$ weights. With `need_weights=True` it runs the explicit path
    ([`explicit_attention`][attention.derivation.core.explicit_attention]) and returns the
    weights too. Both paths are tested equal (outputs and gradients), and equal to
    `torch.nn.MultiheadAttention` with the same weights.

    Parameters are created in the book's order (`W_query`, `W_key`, `W_value`, `out_proj`), so
    with the defaults and the same `torch.manual_seed` this module equals the book's
    `MultiHeadAttention`. Unlike the book's class it keeps no `(context_length,
    context_length)` mask buffer (16 GiB as bool, 64 GiB as the book's float32, at 131,072
    tokens). A book checkpoint's `mask` entry
    (bool or float) is checked to be the causal mask and dropped, so
    `load_state_dict(book_state_dict)` works with `strict=True`.

    Compiling and exporting: `torch.compile` works, and `torch.export` with a dynamic token
    count, with or without a padding mask (the first eager call tries the mask and score
    modifiers; compiling skips that). A NaN or infinity in a *real* token's input reaches
    every output that attends to it, and, as in PyTorch's kernels, also the earlier ones
    ($0 \cdot \text{NaN}$); in a padded position it changes nothing. Positions (for RoPE,
    the mask, the score modifiers) count each row's real tokens: padding anywhere in a row,
    left, right or between tokens, changes none of its real outputs.

    Args:
        d_in: width of each input embedding.
        d_out: total output width $h d_h$, split across heads.
        context_length: the longest sequence one call takes.
        dropout: dropout probability on the attention weights, active in training only.
        num_heads: number of query heads $h$.
        qkv_bias: whether the query/key/value projections have a bias (`out_proj` always has).
        causal: mask future tokens (decoder style); `False` for encoder-style attention.
            Default True without `mask`; with it, the mask alone, and `causal=True` means
            `causal() & mask`.
        num_kv_heads: key/value heads $h_{kv}$, dividing `num_heads`; default `num_heads`.
        window: with `causal`, the tokens each query sees, itself included; default all.
            Shorthand for `mask=causal() & window(w)`.
        rope: rotate queries and keys by their positions (rotate-half RoPE).
        rope_base: RoPE's base, a finite number above 1.
        sinks: with a `window`, the first `sinks` tokens stay visible to every query
            (StreamingLLM's attention sinks): `mask=causal() & (window(w) | sinks(k))`.
        sink_logit: learn one logit per head for a sink that absorbs weight (gpt-oss).
        kdim: width of the sequence keys are projected from; default `d_in`. With `vdim`,
            for cross-attention (`torch.nn.MultiheadAttention`'s names): then `causal=False`.
        vdim: width of the sequence values are projected from; default `d_in`.
        mask: which keys a query sees: a [`Mask`][attention.layer.masks.Mask] or a `mask_mod`
            function `fn(b, h, q_idx, kv_idx) -> bool` (FlexAttention's), instead of
            `window` and `sinks`.
        score_mods: [`ScoreMod`][attention.layer.score_mods.ScoreMod]s or `score_mod` functions
            `fn(score, b, h, q_idx, kv_idx) -> score`, applied in order to the scaled scores.
        scale: what $q \cdot k$ is multiplied by; default $1 / \sqrt{d_h}$ (Gemma 2 and
            Granite use their own).

    Attributes:
        W_query: `nn.Linear(d_in, d_out)`.
        W_key: `nn.Linear(kdim, num_kv_heads * head_dim)`.
        W_value: `nn.Linear(vdim, num_kv_heads * head_dim)`.
        out_proj: `nn.Linear(d_out, d_out)`, $W_o$ and $b_o$.
        dropout: `nn.Dropout(dropout)`: applied to the weights on the explicit path; the
            kernel gets its `p` in training mode.
        sink_logits: `(num_heads,)` parameter with `sink_logit`, created last; else None.
        rule: the [`Mask`][attention.layer.masks.Mask]: `mask`, or the one `causal`, `window`
            and `sinks` name.
        score_mods: the tuple of [`ScoreMod`][attention.layer.score_mods.ScoreMod]s.
        head_dim: $d_h$ = `d_out // num_heads`.

    Raises:
        TypeError: a size is not an int, a switch not a bool, or `dropout` not a number.
        ValueError: a size below 1, `dropout` outside $[0, 1)$, `d_out` not divisible by
            `num_heads`, `num_heads` not by `num_kv_heads`, a window without `causal`, sinks
            without a window, `mask` with `window` or `sinks`, or `rope` with an odd
            `head_dim`.

    Examples:
        >>> from attention.derivation.simple import example_inputs
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
        causal: bool | None = None,
        num_kv_heads: int | None = None,
        window: int | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        sinks: int = 0,
        sink_logit: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        mask: Mask | Callable[..., Tensor] | None = None,
        score_mods: Sequence[ScoreMod | Callable[..., Tensor]] = (),
        scale: float | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        _check_sizes(d_in, d_out, context_length, num_heads, num_kv_heads)
        self.kdim = d_in if kdim is None else check_size("kdim", kdim)
        self.vdim = d_in if vdim is None else check_size("vdim", vdim)
        self.rule = _rule(causal, window, sinks, mask)
        self.score_mods = as_score_mods(score_mods)
        self.scale = None if scale is None else check_positive("scale", scale)
        # a score modifier without an additive form: no fused kernel can take it
        self._explicit_only = any(mod.bias is None for mod in self.score_mods)
        self._unprobed = True  # the mask and modifiers are tried at the first call
        self._cross = self.rule.bounds.everything  # a cache then holds the other sequence
        causal = self.rule.bounds.causal
        if (self.kdim, self.vdim) != (d_in, d_in):
            _check_cross_options(self.kdim, self.vdim, d_in, causal=causal, rope=rope,
                                 sink_logit=sink_logit, mask=mask,
                                 score_mods=self.score_mods)  # fmt: skip
        check_dropout(dropout)
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_out // num_heads
        self.rope = check_flag("rope", rope)
        rope_frequencies(2, rope_base)  # checks rope_base, used or not
        if rope and self.head_dim % 2:
            raise ValueError(
                "rope rotates pairs of dimensions: head_dim = d_out // num_heads must be "
                f"even, got head_dim={self.head_dim}"
            )
        self.rope_base = float(rope_base)
        self.rotary = (RotaryTable(self.head_dim, rope_base, limit=max(256, 2 * context_length))
                       if rope else None)  # fmt: skip
        check_flag("qkv_bias", qkv_bias)
        check_flag("sink_logit", sink_logit)
        kv_dim = num_kv_heads * self.head_dim
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(self.kdim, kv_dim, bias=qkv_bias)
        self.W_value = nn.Linear(self.vdim, kv_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.sink_logits = nn.Parameter(torch.zeros(num_heads)) if sink_logit else None
        # what a cache from init_cache is made for: forward's fast check (None: no self-cache)
        self._layout = (num_kv_heads, self.head_dim, self.window, self.sinks) if causal else None
        self.register_load_state_dict_pre_hook(_drop_book_mask)  # type: ignore[no-untyped-call]

    @property
    def causal(self) -> bool:
        """Whether the mask certainly hides the future (its bounds)."""
        return self.rule.bounds.causal

    @property
    def window(self) -> int | None:
        """How far back a query sees at most (the mask's reach), or None: unbounded (or a
        reach of 0: only the anchors, as `prefix(n)` alone, which no ring can hold)."""
        return self.rule.bounds.reach or None

    @property
    def sinks(self) -> int:
        """The first positions every query may see beyond the reach (the mask's anchor)."""
        return self.rule.bounds.anchor

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        need_weights: Literal[False] = ...,
        *,
        cache: KVCache | None = ...,
        document_ids: Tensor | None = ...,
        key: Tensor | None = ...,
        value: Tensor | None = ...,
        positions: Tensor | None = ...,
        angles: tuple[Tensor, Tensor] | None = ...,
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: Literal[True],
        *,
        cache: KVCache | None = ...,
        document_ids: Tensor | None = ...,
        key: Tensor | None = ...,
        value: Tensor | None = ...,
        positions: Tensor | None = ...,
        angles: tuple[Tensor, Tensor] | None = ...,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        *,
        need_weights: Literal[True],
        cache: KVCache | None = ...,
        document_ids: Tensor | None = ...,
        key: Tensor | None = ...,
        value: Tensor | None = ...,
        positions: Tensor | None = ...,
        angles: tuple[Tensor, Tensor] | None = ...,
    ) -> tuple[Tensor, Tensor]: ...

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        *,
        cache: KVCache | None = None,
        document_ids: Tensor | None = None,
        key: Tensor | None = None,
        value: Tensor | None = None,
        positions: Tensor | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The one forward: self-attention over `x`, or cross-attention to `key`/`value`.

        Its checks read only shapes, dtypes and devices (no value of a tensor, so no wait for
        the device on a decode step); a [`GPTModel`][attention.model.gpt.GPTModel] checks its ids
        and mask values once and calls this in every block, so hooks on a block's `att` fire.

        Args:
            x: shape `(batch, num_tokens, d_in)`, `num_tokens <= context_length`, of the
                parameters' dtype and device.
            key_padding_mask: optional bool `(batch, num_tokens)`, True marks padding. A padded
                position takes no part: no query attends to it, it attends to nothing (zero
                weights, a zero context vector, so its output is `out_proj`'s bias), its
                input is never read (NaN or inf there changes nothing, gradients included),
                and windows and sinks count real tokens only.
            need_weights: also return the attention weights (runs the explicit path). With a
                ring-buffer cache, their columns are the keys the cache returned: its slots,
                in slot order (`cache.positions` says which position each holds), then the
                chunk's own.
            cache: a [`KVCache`][attention.layer.cache.KVCache] from
                [`init_cache`][attention.layer.multihead.MultiHeadAttention.init_cache]: `x` is the
                next chunk of a sequence whose earlier tokens the cache has taken; positions
                (for RoPE, the window, the sinks) continue from its `length`. A chunk given
                without a mask or ids after one with them is real tokens of document 0.
            document_ids: optional `(batch, num_tokens)` non-negative ints: several documents
                packed in one row; a query sees only the keys of its own document.
            key: cross-attention: `(batch, num_keys, kdim)`, the other sequence (an
                encoder's output) the keys come from; `key_padding_mask` is then its padding,
                `(batch, num_keys)`. Needs `causal=False`, no RoPE, mask or score modifier.
                With a cache, the first call passes `key` and fills it; later calls (a
                decoder's steps) pass none and read it.
            value: `(batch, num_keys, vdim)`, what the values come from; default `key`.
            positions: each row's own positions `(batch, num_tokens)`, padding excluded, if
                the caller computed them ([`next_positions`][attention.layer.cache.next_positions]);
                default: computed here from the cache and `key_padding_mask`.
            angles: RoPE's `(cos, sin)` at those positions, made once by a model for every
                layer ([`RotaryTable.at`][attention.layer.positions.RotaryTable.at]); default: made
                here.

        Returns:
            `context_vec` of shape `(batch, num_tokens, d_out)`; with `need_weights=True`,
            `(context_vec, attn_weights)` with weights `(batch, num_heads, num_tokens, num_keys)`
            (`num_keys` is `num_tokens`, or the keys the cache returned).

        Raises:
            TypeError: `x` is not floating point or not of the parameters' dtype; `cache` not
                a `KVCache`; `document_ids` not integers.
            ValueError: wrong rank or width of `x`, too many tokens, another device, a mask,
                positions or document ids of the wrong shape, or a cache this chunk does not
                fit.

        Examples:
            >>> layer = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, causal=False, kdim=6,
            ...                            vdim=6)
            >>> memory = torch.randn(2, 5, 6)  # (batch, num_keys, kdim): an encoder's output
            >>> cache = layer.init_cache(batch_size=2, max_tokens=5)
            >>> first = layer(torch.randn(2, 3, 8), key=memory, cache=cache)  # fills the cache
            >>> step = layer(torch.randn(2, 1, 8), cache=cache)  # reads it: (2, 1, 8)
            >>> cache.length  # the 5 keys, stored once
            5
        """
        w = self.W_query.weight  # the fast test first: a failed one names what is wrong
        if not (type(x) is Tensor and x.ndim == 3 and x.shape[2] == self.d_in
                and x.shape[1] <= self.context_length and x.dtype == w.dtype
                and x.device == w.device):  # fmt: skip
            check_input(x, self.d_in, self.context_length, batched=True, like=w)  # or autocast
        if need_weights is not False and need_weights is not True:
            check_flag("need_weights", need_weights)
        if key is not None or value is not None or (cache is not None and self._cross):
            if document_ids is not None or positions is not None or angles is not None:
                raise ValueError("document_ids pack one sequence's documents (positions and "
                                 "angles place its tokens): not for cross-attention (key "
                                 "given)")  # fmt: skip
            self._check_cross(x.shape[0], key, value, key_padding_mask, cache)
            out, weights = self._cross_attend(x, key, value, key_padding_mask, cache,
                                              need_weights=need_weights)  # fmt: skip
            return out if weights is None else (out, weights)
        if (self.kdim, self.vdim) != (self.d_in, self.d_in):
            raise ValueError(f"this module projects keys from kdim={self.kdim} and values from "
                             f"vdim={self.vdim} wide inputs: pass key= (and value=), the "
                             "sequence to attend to")  # fmt: skip
        b, num_tokens, _ = x.shape
        if key_padding_mask is not None or document_ids is not None or positions is not None:
            self._check_rows(b, num_tokens, x.device, key_padding_mask, document_ids, positions)
        if key_padding_mask is not None:  # not even a NaN there may reach a real output
            x = x.masked_fill(key_padding_mask[..., None], 0.0)  # (b, T, d_in)
        if cache is not None and not (  # fast: a cache of this layout with room; else named
            self._layout is not None and getattr(cache, "layout", None) == self._layout
            and cache.keys.shape[0] == b and cache.keys.dtype == w.dtype
            and cache.keys.device == w.device
            and (cache.max_tokens is None or cache.length + num_tokens <= cache.max_tokens)
        ):  # fmt: skip
            self._check_cache(cache, b, num_tokens, w)
        if angles is not None and not (type(angles) is tuple and len(angles) == 2
                                       and type(angles[0]) is Tensor
                                       and angles[0].shape[-2:] == (num_tokens, self.head_dim)
                                       and self.rotary is not None):  # fmt: skip
            self._check_angles(angles, num_tokens)
        if positions is None and (
            key_padding_mask is not None or (cache is not None and cache.pads is not None)
        ):
            start, pads = (0, None) if cache is None else (cache.length, cache.pads)
            positions = next_positions(num_tokens, start, pads, key_padding_mask)  # (b, T)|None
        out, attn_weights = self._attend(x, cache, padded=key_padding_mask, documents=document_ids,
                                         positions=positions, angles=angles,
                                         need_weights=need_weights)  # fmt: skip
        return out if attn_weights is None else (out, attn_weights)

    def _check_rows(
        self,
        batch: int,
        num_tokens: int,
        device: torch.device,
        key_padding_mask: object,
        document_ids: object,
        positions: object,
    ) -> None:
        """Raise an error naming the argument unless each is `(batch, num_tokens)`, as it must."""
        if key_padding_mask is not None:
            check_padding_mask(key_padding_mask, batch, num_tokens, device)
        if document_ids is not None:
            _check_documents(document_ids, batch, num_tokens, device)
        if positions is not None:
            pos = check_tensor("positions", positions)
            if pos.shape != (batch, num_tokens) or pos.is_floating_point() or pos.device != device:
                raise ValueError(f"positions must be integers of shape (batch, num_tokens) = "
                                 f"({batch}, {num_tokens}) on {device}, got {pos.dtype} "
                                 f"{tuple(pos.shape)} on {pos.device}")  # fmt: skip

    def _check_angles(self, angles: object, num_tokens: int) -> None:
        """RoPE's `(cos, sin)`: two tensors of `head_dim` columns, one per query position."""
        ok = type(angles) is tuple and len(angles) == 2 and self.rotary is not None
        cos = angles[0] if ok else None  # type: ignore[index]
        if not (ok and isinstance(cos, Tensor) and isinstance(angles[1], Tensor)  # type: ignore[index]
                and cos.shape[-1] == self.head_dim and cos.shape[-2] == num_tokens):  # fmt: skip
            raise ValueError(f"angles must be RoPE's (cos, sin) for {num_tokens} positions and "
                             f"head_dim={self.head_dim}, in a module with rope=True (rope="
                             f"{self.rope}); got {type(angles).__name__}")  # fmt: skip

    def _attend(
        self,
        x: Tensor,
        cache: KVCache | None = None,
        *,
        padded: Tensor | None = None,
        documents: Tensor | None = None,
        positions: Tensor | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention, after [`forward`][attention.layer.multihead.MultiHeadAttention.forward]'s
        checks: project, rotate, store in the cache, plan the kernel call, attend, merge heads.

        Args:
            x: `(batch, num_tokens, d_in)`, padded positions zeroed.
            cache: the layer's cache, or None.
            padded: `(batch, num_tokens)` bool, True = padding, or None.
            documents: `(batch, num_tokens)` document ids, or None.
            positions: `(batch, num_tokens)` each row's own positions, padding excluded; None
                while they are the slots `start ...` for every row.
            angles: RoPE's `(cos, sin)` at those positions, or None: made here.
            need_weights: also return the weights (explicit path).

        Returns:
            `(context_vec, attn_weights)`: `(batch, num_tokens, d_out)`, and the weights
            `(batch, num_heads, num_tokens, num_keys)` with `need_weights`, else None.
        """
        if self._unprobed and not torch.compiler.is_compiling():  # the first eager call:
            _probe(self.rule, self.score_mods, self.num_heads, x)  # try them on its device
            self._unprobed = False
        b, num_tokens, _ = x.shape
        start = 0 if cache is None else cache.length  # the chunk's first slot
        queries, keys, values = self.project(x, start, positions, angles)  # (b, h | h_kv, T, d_h)
        seg = None if padded is None and documents is None else segments(padded, documents)
        k_pos: Tensor | None = None
        k_seg: Tensor | None = seg
        own = start == 0  # the first chunk (or no cache) sees only its own tokens
        if cache is not None:  # store; a later chunk gets every key it may need
            stored = cache.update(keys, values, seg, positions)
            if not own:  # (b, h_kv, S, d_h), their positions and segments
                keys, values, k_pos, k_seg = stored
                if keys.dtype != queries.dtype:  # autocast: the cache keeps the module's dtype
                    keys, values = keys.to(queries.dtype), values.to(queries.dtype)
                if k_seg is not None and seg is None:  # real tokens after padded ones
                    seg = k_seg.new_zeros(b, num_tokens)
        dropout_p = self.dropout.p if self.training else 0.0
        if need_weights or (self._explicit_only and not flex.usable(x.device, dropout_p)):
            q_pos = _positions(start, num_tokens, positions, x.device)
            if k_pos is None:  # the keys are the queries' own tokens, or in order from 0
                k_pos = q_pos if own else torch.arange(keys.shape[2], device=x.device)
            seen = visible(self.rule, q_pos, k_pos, seg, k_seg, num_heads=self.num_heads,
                              batch=b)  # fmt: skip
            context_vec, weights = self._explicit(queries, keys, values, seen, q_pos, k_pos)
            attn_weights = weights if need_weights else None
        elif own:  # padding anywhere: rows compacted, so every plan stays open
            context_vec, attn_weights = fused_attention(
                queries, keys, values, self.rule, padded=padded,
                q_seg=None if documents is None else documents.long(),
                k_seg=None if documents is None else documents.long(), dropout_p=dropout_p,
                sink_logits=self.sink_logits, score_mods=self.score_mods, scale=self.scale,
            ), None  # fmt: skip
        else:
            context_vec, attn_weights = fused_attention(
                queries, keys, values, self.rule, start=start,
                q_pos=positions if k_pos is not None and k_pos.ndim == 2 else None,
                k_pos=k_pos, q_seg=seg, k_seg=k_seg, dropout_p=dropout_p,
                sink_logits=self.sink_logits, score_mods=self.score_mods, scale=self.scale,
            ), None  # fmt: skip
        # merge heads: (b, h, T, d_h) -> (b, T, h, d_h) -> (b, T, d_out)
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, self.d_out)
        out: Tensor = self.out_proj(context_vec)  # (b, T, d_out)
        return out, attn_weights

    def _cross_attend(
        self,
        x: Tensor,
        key: Tensor | None,
        value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cache: KVCache | None = None,
        *,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        r"""Cross-attention: queries from `x`, keys and values from another sequence.

        $Q = X W_q$, $K = M_k W_k$, $V = M_v W_v$ for the other sequence $M$ (`key`,
        `value`: an encoder's output, in an encoder-decoder); every query sees every real key
        (nothing is causal between two sequences), none of the keys' padding. A cache holds
        the keys and values once: the first call, with `key`, fills it; later calls pass
        `key=None` and read them. `forward` checked the arguments.

        Returns:
            `(context_vec, attn_weights)`, the weights None without `need_weights`.
        """
        b, num_tokens, _ = x.shape
        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.transpose(1, 2)  # (b, h, T, d_h)
        keys, values, key_seg = self._memory(
            key, value, key_padding_mask, cache
        )  # (b, h_kv, S, d_h)
        if need_weights:
            seen = None if key_seg is None else (key_seg >= 0)[:, None, None, :]  # (b, 1, 1, S)
            context_vec, attn_weights = self._explicit(queries, keys, values, seen)
        else:
            dropout_p = self.dropout.p if self.training else 0.0
            context_vec = cross_attention(queries, keys, values, key_seg, dropout_p=dropout_p,
                                          scale=self.scale)  # fmt: skip
            attn_weights = None
        context_vec = context_vec.transpose(1, 2).reshape(
            b, num_tokens, self.d_out
        )  # (b, T, d_out)
        return self.out_proj(context_vec), attn_weights

    def _check_cross(
        self,
        batch: int,
        key: object,
        value: object,
        key_padding_mask: object,
        cache: object,
    ) -> None:
        """Raise an error naming the argument unless cross-attention can run on these."""
        plain = self.rule.bounds.everything and not self.score_mods
        if self.causal or self.rope or self.sink_logits is not None or not plain:
            raise ValueError(
                "cross-attention (key and value from another sequence, or a cache on a module "
                "with causal=False) needs causal=False, rope=False, no sink logit, mask or "
                f"score modifier; this module has causal={self.causal}, rope={self.rope}, "
                f"sink_logit={self.sink_logits is not None}, mask={self.rule!r}, "
                f"score_mods={list(self.score_mods)}"
            )
        if cache is not None:
            self._check_cross_cache(cache, batch, key)
        if key is None:
            if value is not None or key_padding_mask is not None:
                raise ValueError("value and key_padding_mask come with key (without key, the "
                                 "cache's keys, values and padding are read)")  # fmt: skip
            return
        w = self.W_key.weight
        k = _check_memory("key", key, self.kdim, "kdim", batch, w)
        if value is None and self.vdim != self.kdim:
            raise ValueError(f"value defaults to key, but values are projected from "
                             f"vdim={self.vdim} and keys from kdim={self.kdim}: pass "
                             "value=")  # fmt: skip
        v = k if value is None else _check_memory("value", value, self.vdim, "vdim", batch, w)
        if v.shape[1] != k.shape[1]:
            raise ValueError(f"key and value must have one length (num_keys), got "
                             f"{k.shape[1]} and {v.shape[1]}")  # fmt: skip
        if key_padding_mask is not None:
            check_padding_mask(key_padding_mask, batch, k.shape[1], k.device)
        if isinstance(cache, KVCache) and not 0 < k.shape[1] <= cache.slots:
            raise ValueError(f"cache holds 1 to {cache.slots} keys (max_tokens), got key "
                             f"with {k.shape[1]}")  # fmt: skip

    def _check_cross_cache(self, cache: object, batch: int, key: object) -> None:
        if not isinstance(cache, KVCache):
            raise TypeError(
                f"cache must be a KVCache (from init_cache), got {type(cache).__name__}"
            )
        weight, keys = self.W_key.weight, cache.keys
        made = (keys.shape[1], keys.shape[3], keys.dtype, keys.device)
        if made != (self.num_kv_heads, self.head_dim, weight.dtype, weight.device):
            raise ValueError(f"cache was made for num_kv_heads={made[0]}, head_dim={made[1]}, "
                             f"{made[2]} on {made[3]}: use this module's init_cache")  # fmt: skip
        if batch != cache.batch_size:
            raise ValueError(f"cache was made for batch_size={cache.batch_size}, got a batch "
                             f"of {batch}")  # fmt: skip
        if key is not None and cache.length:
            raise ValueError(f"cache already holds {cache.length} keys of the other sequence: "
                             "call without key to read them, or reset it first")  # fmt: skip
        if key is None and not cache.length:
            raise ValueError("cache is empty: the first cross-attention call passes key= (and "
                             "value=) to fill it")  # fmt: skip

    def _memory(
        self,
        key: Tensor | None,
        value: Tensor | None,
        key_padding_mask: Tensor | None,
        cache: KVCache | None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The other sequence's keys and values `(b, h_kv, S, d_h)` and segments `(b, S)`."""
        if key is None:  # the cache holds them (checked)
            assert cache is not None
            seg = None if cache.segments is None else cache.segments[:, : cache.length]
            return cache.keys[:, :, : cache.length], cache.values[:, :, : cache.length], seg
        value = key if value is None else value
        if key_padding_mask is not None:  # a NaN in padding must not reach a real output
            key = key.masked_fill(key_padding_mask[..., None], 0.0)
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        b, num_keys, _ = key.shape
        keys = self.W_key(key).view(b, num_keys, self.num_kv_heads, self.head_dim)
        values = self.W_value(value).view(b, num_keys, self.num_kv_heads, self.head_dim)
        keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # (b, h_kv, S, d_h)
        seg = segments(key_padding_mask)  # (b, S): -1 for padding, or None
        if cache is not None:
            keys, values, _, seg = cache.update(keys, values, seg)
        return keys, values, seg

    def project(
        self,
        x: Tensor,
        start: int = 0,
        positions: Tensor | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values split into heads, rotated (RoPE) at positions `start ...`.

        Args:
            x: `(batch, num_tokens, d_in)`.
            start: the first token's position.
            positions: or `(batch, num_tokens)`, each row's own positions.
            angles: RoPE's `(cos, sin)` at those positions, if the model made them.

        Returns:
            `(queries, keys, values)`: `(b, h, T, d_h)`, `(b, h_kv, T, d_h)`, `(b, h_kv, T, d_h)`.
        """
        # Q = X W_q, K = X W_k, V = X W_v: (b, T, h * d_h) -> (b, T, h, d_h) -> (b, h, T, d_h)
        b, num_tokens, _ = x.shape
        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim)
        keys = self.W_key(x).view(b, num_tokens, self.num_kv_heads, self.head_dim)
        values = self.W_value(x).view(b, num_tokens, self.num_kv_heads, self.head_dim)
        queries, keys, values = (
            queries.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
        )
        if self.rotary is not None:  # turn each query and key by m * theta_i, m = start, ...
            if angles is None:  # the model made none: this chunk's own
                angles = self.rotary.at(start, num_tokens, positions, x.device, x.dtype)
            queries, keys = rotate_with(queries, angles), rotate_with(keys, angles)
        return queries, keys, values

    def scores(self, x: Tensor) -> Tensor:
        r"""Every query head's scores $Q K^\top$ times the scale ($1 / \sqrt{d_h}$), unmasked.

        What [`attention.lab.heads`][attention.lab.heads] and the explorer read: the same projection
        and rotation as the forward.

        Args:
            x: `(batch, num_tokens, d_in)`.

        Returns:
            `(batch, num_heads, num_tokens, num_tokens)`.
        """
        check_input(x, self.d_in, self.context_length, batched=True, like=self.W_query.weight)
        queries, keys, _ = self.project(x)  # (b, h, T, d_h), (b, h_kv, T, d_h)
        keys = keys.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # (b, h, T, d_h)
        scale = 1 / math.sqrt(self.head_dim) if self.scale is None else self.scale
        return queries @ keys.transpose(-2, -1) * scale  # (b, h, T, T)

    def mask(self, num_tokens: int, device: torch.device | str | None = None) -> Tensor:
        """This layer's `(num_tokens, num_tokens)` bool mask, True = may attend, from its rule.

        Examples:
            >>> mha = MultiHeadAttention(4, 4, 8, 0.0, num_heads=1, window=2)
            >>> mha.mask(3)
            tensor([[ True, False, False],
                    [ True,  True, False],
                    [False,  True,  True]])
        """
        return chunk_mask(0, num_tokens, self.rule, device)

    def init_cache(self, batch_size: int, max_tokens: int | None = None) -> KVCache:
        """An empty key/value cache for generating with this module, on its device and dtype.

        A layer with a window gets a ring buffer of `window + sinks` slots, whatever the
        length; any other layer a linear cache of `max_tokens`.

        Args:
            batch_size: sequences generated together.
            max_tokens: the most tokens it will take, prompt included; default
                `context_length`, or no limit for a layer with a window.

        Returns:
            A [`KVCache`][attention.layer.cache.KVCache] of `num_kv_heads` heads.

        A module with `causal=False` caches only for cross-attention: the other sequence's
        keys and values, `max_tokens` of them (default `context_length`), stored once.

        Raises:
            ValueError: `max_tokens` (without a window, causal) exceeds `context_length`.
        """
        window = self.window
        if max_tokens is None and window is None:
            max_tokens = self.context_length
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
            if self.causal and window is None and max_tokens > self.context_length:
                raise ValueError(
                    f"max_tokens={max_tokens} is longer than context_length={self.context_length}"
                )
        weight = self.W_key.weight
        cache = KVCache(batch_size, max_tokens, self.num_kv_heads, self.head_dim,
                        window=window, sinks=self.sinks, device=weight.device,
                        dtype=weight.dtype)  # fmt: skip
        cache.layout = self._layout
        return cache

    def check_cache(self, cache: object, batch_size: int, num_tokens: int) -> None:
        """Raise an error naming `cache` unless it was made for this layer and fits the chunk.

        Args:
            cache: what was passed as `cache`.
            batch_size: the chunk's batch.
            num_tokens: the chunk's tokens.

        Raises:
            TypeError: not a `KVCache`.
            ValueError: a non-causal module, another head layout, dtype or device, window,
                batch size, or no room left.
        """
        self._check_cache(cache, batch_size, num_tokens, self.W_key.weight)

    def _check_cache(self, cache: object, batch_size: int, num_tokens: int, like: Tensor) -> None:
        if not isinstance(cache, KVCache):
            raise TypeError(
                f"cache must be a KVCache (from init_cache), got {type(cache).__name__}"
            )
        if not self.rule.bounds.causal:
            raise ValueError(
                f"cache needs a mask that hides the future; this module's mask {self.rule!r} "
                "does not certainly (causal=False, or a mask_mod without bounds: pass "
                "causal=True with it, or use causal() & mask): a later token would change "
                "what the cached ones attended to")  # fmt: skip
        keys = cache.keys
        made = (keys.shape[1], keys.shape[3], keys.dtype, keys.device)
        if made != (self.num_kv_heads, self.head_dim, like.dtype, like.device):
            raise ValueError(
                f"cache was made for num_kv_heads={made[0]}, head_dim={made[1]}, {made[2]} on "
                f"{made[3]}; this module has num_kv_heads={self.num_kv_heads}, head_dim="
                f"{self.head_dim}, {like.dtype} on {like.device}: use its init_cache"
            )
        if cache.ring and (cache.window, cache.sinks) != (
            self.rule.bounds.reach or None,
            self.rule.bounds.anchor,
        ):
            raise ValueError(f"cache keeps window={cache.window}, sinks={cache.sinks}; this "
                             f"module has window={self.window}, sinks={self.sinks}")  # fmt: skip
        if batch_size != keys.shape[0]:
            raise ValueError(
                f"cache was made for batch_size={keys.shape[0]}, got a batch of {batch_size}"
            )
        limit = cache.max_tokens
        if limit is not None and cache.length + num_tokens > limit:
            raise ValueError(
                f"cache holds {cache.length} of max_tokens={limit} tokens: {num_tokens} more "
                "do not fit (reset it, or make a larger one)"
            )

    def _explicit(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        mask: Tensor | None,
        q_pos: Tensor | None = None,
        k_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The explicit path: each query head reads its key/value head, repeated per group.

        `q_pos` `(T,)` or `(b, T)` and `k_pos` `(S,)` or `(b, S)` are the positions the
        score modifiers see.
        """
        group = self.num_heads // self.num_kv_heads  # query head i reads kv head i // group
        keys = keys.repeat_interleave(group, dim=1)  # (b, h, S, d_h)
        values = values.repeat_interleave(group, dim=1)  # (b, h, S, d_h)
        sink = None if self.sink_logits is None else self.sink_logits[:, None, None]  # (h, 1, 1)
        score_mod = None
        if self.score_mods and q_pos is not None and k_pos is not None:
            score_mod = _bind(self.score_mods, q_pos, k_pos, queries.shape[0], self.num_heads)
        return explicit_attention(queries, keys, values, mask, dropout=self.dropout,
                                  sink_logits=sink, score_mod=score_mod,
                                  scale=self.scale)  # fmt: skip

    def extra_repr(self) -> str:
        """Shown by `print(module)`: what is not visible in the submodules."""
        options = [f"num_heads={self.num_heads}", f"causal={self.causal}"]
        if (self.kdim, self.vdim) != (self.d_in, self.d_in):
            options.append(f"kdim={self.kdim}, vdim={self.vdim}")
        if self.num_kv_heads != self.num_heads:
            options.append(f"num_kv_heads={self.num_kv_heads}")
        if self.rule.name not in ("causal()", "everything()"):
            options.append(f"mask={self.rule!r}")
        if self.score_mods:
            options.append(f"score_mods={list(self.score_mods)}")
        if self.scale is not None:
            options.append(f"scale={self.scale:g}")
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


def _rule(causal: bool | None, window: int | None, sinks: int, mask: object) -> Mask:
    """The layer's mask: `mask` (with `causal=True`, `causal() & mask`), or the shorthand's."""
    if causal is not None:
        check_flag("causal", causal)
    if mask is None:
        return from_flags(True if causal is None else causal, window, sinks)
    if window is not None or sinks:
        raise ValueError(f"pass mask= or window=/sinks=, not both: got mask={mask!r:.60}, "
                         f"window={window}, sinks={sinks} (write window(w) | sinks(k) into "
                         "the mask)")  # fmt: skip
    rule = as_mask(mask)
    if causal is False and rule.bounds.causal:
        raise ValueError(f"causal=False, but mask={rule!r} hides the future: drop causal=")
    return from_flags(True, None, 0) & rule if causal else rule


def _check_cross_options(kdim: int, vdim: int, d_in: int, **options: object) -> None:
    """Other widths than `d_in` are for cross-attention: no causal mask, RoPE, sink or mask."""
    if any(value not in (False, None, ()) for value in options.values()):
        got = ", ".join(f"{k}={v}" for k, v in options.items())
        raise ValueError(
            f"kdim={kdim}, vdim={vdim} (other than d_in={d_in}) are for cross-attention, "
            f"which needs causal=False, rope=False, no sink_logit, mask or score_mods; got {got}"
        )


def _probe(rule: Mask, score_mods: Sequence[ScoreMod], num_heads: int, x: Tensor) -> None:
    """Call the mask and each score modifier once, on the first call's batch, its first (at
    most 4) positions and its device: a broken one fails here, by name. NaN and a `bias` that
    is not `fn - score` are looked for where the mask sees (and not on `meta`).

    Raises:
        TypeError: a function that raises, or returns the wrong kind of tensor.
        ValueError: a result of the wrong shape, a NaN, or a `bias` that is not `fn - score`.
    """
    batch, n, device = x.shape[0], max(1, min(4, x.shape[1])), x.device
    pos = torch.arange(n, device=device)
    seen = evaluate(rule, pos, pos, num_heads=num_heads, batch=batch)  # raises, naming it
    b, h, q, kv = indices(pos, pos, batch=batch, num_heads=num_heads)
    score = torch.linspace(-3.0, 3.0, n * n, device=device).view(1, 1, n, n)
    score = score.expand(batch, num_heads, n, n)
    for i, mod in enumerate(score_mods):
        name = f"score_mods[{i}] ({mod.name})"
        out = _call(name, mod.fn, (score, b, h, q, kv), score.shape, exact=True)
        bias = None if mod.bias is None else _call(f"{name}'s bias", mod.bias, (b, h, q, kv),
                                                   score.shape)  # fmt: skip
        if device.type == "meta":
            continue
        if bool(out.isnan()[seen.expand_as(out)].any()):
            raise ValueError(f"{name} turned finite scores into NaN where the mask sees")
        if bias is not None and not torch.allclose(
            out.masked_fill(~seen, 0),
            (score + bias.to(score.dtype)).masked_fill(~seen, 0),
            atol=1e-5,
        ):
            raise ValueError(f"{name}: its bias is not fn(score) - score, as an additive form "
                             "must be")  # fmt: skip


def _call(
    name: str, fn: Callable[..., object], args: tuple[Tensor, ...], shape: Size, exact: bool = False
) -> Tensor:
    """`fn(*args)`, a floating tensor of `shape` (or, unless `exact`, one that broadcasts to
    it), or an error naming `name`."""
    try:
        out = fn(*args)
    except Exception as error:
        shapes = ", ".join(str(tuple(a.shape)) for a in args)
        raise TypeError(f"{name} failed on tensors of shapes {shapes}: "
                        f"{type(error).__name__}: {error}") from error  # fmt: skip
    if not isinstance(out, Tensor) or not out.is_floating_point():
        kind = out.dtype if isinstance(out, Tensor) else type(out).__name__
        raise TypeError(f"{name} must return floating-point scores, got {kind}")
    try:
        if (out.shape != shape) if exact else torch.broadcast_shapes(out.shape, shape) != shape:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"{name} must return the scores' shape {tuple(shape)}"
                         f"{'' if exact else ' (or one that broadcasts to it)'}, got "
                         f"{tuple(out.shape)}") from None  # fmt: skip
    return out


def _bind(
    score_mods: Sequence[ScoreMod], q_pos: Tensor, k_pos: Tensor, batch: int, num_heads: int
) -> Callable[[Tensor], Tensor]:
    """The score modifiers as one function of the scores `(b, h, T, S)`, positions bound."""
    b, h, q, kv = indices(q_pos, k_pos, batch=batch, num_heads=num_heads)

    def modify(scores: Tensor) -> Tensor:
        for mod in score_mods:  # f_n(... f_1(s) ...), in list order
            scores = mod(scores, b, h, q, kv)
        return scores

    return modify


def _positions(
    start: int, num_tokens: int, positions: Tensor | None, device: torch.device
) -> Tensor:
    """The queries' positions: each row's, or the slots `start ...`."""
    if positions is not None:
        return positions
    return torch.arange(start, start + num_tokens, device=device)


def _check_sizes(
    d_in: int, d_out: int, context_length: int, num_heads: int, num_kv_heads: int
) -> None:
    for name, value in (("d_in", d_in), ("d_out", d_out), ("context_length", context_length),
                        ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):  # fmt: skip
        check_size(name, value)
    if d_out % num_heads != 0:
        raise ValueError(
            f"d_out must be divisible by num_heads: got d_out={d_out}, num_heads={num_heads}"
        )
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            "num_heads must be divisible by num_kv_heads (each key/value head serves a "
            f"group of query heads): got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
        )


def _check_memory(
    name: str, t: object, width: int, width_name: str, batch: int, like: Tensor
) -> Tensor:
    """Check cross-attention's `key` or `value`: `(batch, num_keys, width)`, like the module."""
    t = check_tensor(name, t, ndim=3, floating=True, like=like)
    if t.shape[0] != batch or t.shape[2] != width:
        raise ValueError(f"{name} must have shape (batch, num_keys, {width_name}) = ({batch}, "
                         f"num_keys, {width}), got {tuple(t.shape)}")  # fmt: skip
    return t


def _check_documents(
    document_ids: object, batch: int, num_tokens: int, device: torch.device
) -> None:
    ids = check_tensor("document_ids", document_ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"document_ids must be integers, got dtype {ids.dtype}")
    if ids.shape != (batch, num_tokens):
        raise ValueError(
            f"document_ids must have shape (batch, num_tokens) = ({batch}, {num_tokens}), "
            f"got {tuple(ids.shape)}"
        )
    if ids.device != device:
        raise ValueError(f"document_ids must be on the input's device {device}, got {ids.device}")
    if _readable(ids) and bool((ids < 0).any()):
        raise ValueError(f"document_ids must be >= 0, got {int(ids.min())}")


def _readable(t: Tensor) -> bool:
    """Whether a tensor's values may steer Python: not while exporting, not on `meta`."""
    return not torch.compiler.is_exporting() and t.device.type != "meta"


def _drop_book_mask(
    module: nn.Module,
    state_dict: dict[str, Tensor],
    prefix: str,
    *args: object,
) -> None:
    """A load hook: accept a book checkpoint's `mask` buffer, after checking it is causal.

    The book's class stores `triu(ones(context_length, context_length), 1)` (float in the
    book's chapter, bool in later versions); this module computes the mask instead, so the
    entry is checked and dropped. Any other mask would change what the module computes, and
    is refused rather than silently ignored.
    """
    key = prefix + "mask"
    if key not in state_dict:
        return
    mask = state_dict.pop(key)
    causal = getattr(module, "causal", True)
    if not isinstance(mask, Tensor) or mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"the state_dict's {key!r} must be a square (n, n) tensor, got {shape}")
    if mask.device.type != "meta" and not torch.equal(
        mask.bool(),
        ~causal_mask(mask.shape[0], device=mask.device),  # the book's: True hidden
    ):
        raise ValueError(
            f"the state_dict's {key!r} is not the causal mask triu(ones(n, n), diagonal=1) "
            "that a book checkpoint holds: MultiHeadAttention computes its mask (causal or "
            "none, by `causal`) and cannot load another"
        )
    if not causal:
        raise ValueError(
            f"the state_dict's {key!r} is a causal mask, but this module has causal=False: "
            "load it into a causal module, or delete the entry to reuse the weights "
            "without the mask"
        )
