r"""Chapter 9 onwards: the production `MultiHeadAttention`, all heads in one fused kernel.

Chapter 8's [`MultiHeadAttentionWrapper`][attention.derivation.wrapper.MultiHeadAttentionWrapper]
runs one `CausalAttention` per head. This module stacks the $h$ per-head matrices into one
`Linear(d_in, d_out)` each for queries, keys and values, splits the result into heads with a
`view` and a `transpose`, and runs every head in one kernel call, which the planner
([`attention.layer.fused`][attention.layer.fused]) picks from the layer's mask
([`attention.layer.masks`][attention.layer.masks]) and the tokens' positions
([`attention.layer.tokens`][attention.layer.tokens]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Unpack, overload

import torch
from torch import Tensor, nn

from attention.checks import check_dropout, check_flag, check_input, check_size
from attention.derivation.wrapper import MultiHeadAttentionWrapper
from attention.layer import arguments, convert, cross, flex
from attention.layer.arguments import ForwardOptions
from attention.layer.cache import KVCache
from attention.layer.fused import Plan, plan_call, run
from attention.layer.masks import Mask
from attention.layer.positions import RotaryTable, rotate_with
from attention.layer.probe import probe
from attention.layer.qk_norm import QKNormKind, RMSNorm, apply_qk_norm, qk_norms
from attention.layer.rope_scaling import RopeScaling
from attention.layer.score_mods import ScoreMod
from attention.layer.spec import Specified, layer_spec
from attention.layer.tokens import Tokens, queries

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(Specified, nn.Module):
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

    One forward serves every call: check, project, rotate, `cache.update`, plan, run, merge
    ([`attention.layer.fused`][attention.layer.fused]). Every token has one position
    ([`attention.layer.tokens`][attention.layer.tokens]), which RoPE, the mask, the score
    modifiers, the cache and the plan all read: by default each row counts its real tokens
    after what the cache holds (padding anywhere changes none of a row's real outputs), or
    `positions=` gives them. By default the kernel is `scaled_dot_product_attention`, which
    never materialises the $T \times T$ weights; `need_weights=True` runs the explicit path
    ([`explicit_attention`][attention.derivation.core.explicit_attention]) and returns them.
    Both are tested equal (outputs and gradients), and equal to `torch.nn.MultiheadAttention`.
    What the attention computes is one frozen
    [`AttentionSpec`][attention.layer.spec.AttentionSpec], `spec`, changed only whole
    ([`replace`][attention.layer.spec.Specified.replace]).

    Parameters are created in the book's order (`W_query`, `W_key`, `W_value`, `out_proj`), so
    with the defaults and the same `torch.manual_seed` this module equals the book's
    `MultiHeadAttention`, without its `(context_length, context_length)` mask buffer (64 GiB
    as the book's float32 at 131,072 tokens); a book checkpoint's `mask` entry is checked to
    be the causal mask and dropped, so `load_state_dict(book_state_dict)` works strictly.

    Compiling and exporting: `torch.compile` works, and `torch.export` with a dynamic token
    count, with or without a padding mask (the first eager call tries the mask and score
    modifiers; compiling skips that). A NaN or infinity in a *real* token's input reaches
    every output that attends to it, and, as in PyTorch's kernels, also the earlier ones
    ($0 \cdot \text{NaN}$); in a padded position it changes nothing.

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
        rope_base: RoPE's base, a finite number above 1 (checked with or without `rope`).
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
        rope_scaling: with `rope`, a [`RopeScaling`][attention.layer.rope_scaling.RopeScaling]
            (or a config's `rope_parameters` dict): scaled frequencies, part of each head.
        qk_norm: RMSNorm of queries and keys before RoPE, per `"head"` (Qwen3, Gemma 3) or
            over the `"projection"` (OLMo 2) ([`attention.layer.qk_norm`][attention.layer.qk_norm]);
            `qk_norm_eps` its $\epsilon$.
        out_features: the output's width, default `d_out` (Qwen3 and Gemma 3 map
            $h d_h$ back to a narrower `hidden_size`).
        output_gate: gate the heads' concatenation by the input before $W_o$ (Qwen3-Next's
            gated attention): $[Z^{(0)}; \dots; Z^{(h-1)}] \odot \sigma(x W_g)$, with
            `W_gate` `nn.Linear(d_in, d_out)` (a bias with `qkv_bias`). Self-attention only.

    Attributes:
        W_query: `nn.Linear(d_in, d_out)`.
        W_key: `nn.Linear(kdim, num_kv_heads * head_dim)`.
        W_value: `nn.Linear(vdim, num_kv_heads * head_dim)`.
        out_proj: `nn.Linear(d_out, out_features)`, $W_o$ and $b_o$.
        W_gate: `nn.Linear(d_in, d_out)`, $W_g$, with `output_gate` (created last); else None.
        dropout: `nn.Dropout(dropout)`: applied to the weights on the explicit path; the
            kernel gets its `p` in training mode.
        sink_logits: `(num_heads,)` parameter with `sink_logit`; else None.
        q_norm: the queries' `RMSNorm` with `qk_norm` (created after `out_proj`, with `k_norm`);
            else None.
        spec: the [`AttentionSpec`][attention.layer.spec.AttentionSpec]; `rule` (its mask:
            `mask`, or the one `causal`, `window` and `sinks` name), `score_mods` and `scale`
            read it.
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
        rope_scaling: RopeScaling | Mapping[str, Any] | None = None,
        qk_norm: QKNormKind | None = None,
        qk_norm_eps: float = 1e-6,
        out_features: int | None = None,
        output_gate: bool = False,
    ) -> None:
        super().__init__()
        d_in, d_out, context_length, num_heads, num_kv_heads = arguments.check_sizes(
            d_in, d_out, context_length, num_heads, num_kv_heads
        )
        self.kdim = d_in if kdim is None else check_size("kdim", kdim)
        self.vdim = d_in if vdim is None else check_size("vdim", vdim)
        check_dropout(dropout)
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_out // num_heads  # d_h
        self._trace: list[Plan | None] = [None]  # the last call's plan (a list: compiles)
        self.spec = layer_spec(
            num_heads,
            num_kv_heads,
            self.head_dim,
            context_length,
            (self.kdim, self.vdim, d_in),
            causal=causal,
            window=window,
            sinks=sinks,
            mask=mask,
            score_mods=score_mods,
            scale=scale,
            rope=rope,
            rope_base=rope_base,
            sink_logit=sink_logit,
            rope_scaling=rope_scaling,
            qk_norm=qk_norm,
        )
        limit = max(256, 2 * context_length)  # positions in RoPE's table; later ones computed
        scaling = self._spec.rope_scaling
        self.rotary = RotaryTable(self.head_dim, rope_base, limit, scaling) if rope else None
        self._unprobed = True  # the mask and modifiers are tried at the first call
        kv_dim = num_kv_heads * self.head_dim
        bias = check_flag("qkv_bias", qkv_bias)
        self.W_query = nn.Linear(d_in, d_out, bias=bias)
        self.W_key = nn.Linear(self.kdim, kv_dim, bias=bias)
        self.W_value = nn.Linear(self.vdim, kv_dim, bias=bias)
        width = d_out if out_features is None else check_size("out_features", out_features)
        self.out_features, self.out_proj = width, nn.Linear(d_out, width)
        self.dropout = nn.Dropout(dropout)
        self.sink_logits = nn.Parameter(torch.zeros(num_heads)) if sink_logit else None
        self.q_norm: RMSNorm | None
        self.k_norm: RMSNorm | None
        self.q_norm, self.k_norm = qk_norms(
            qk_norm, num_heads, num_kv_heads, self.head_dim, qk_norm_eps
        )
        gate = check_flag("output_gate", output_gate)
        self.W_gate = nn.Linear(d_in, d_out, bias=bias) if gate else None
        self.register_load_state_dict_pre_hook(convert.drop_book_mask)  # type: ignore[no-untyped-call]

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        need_weights: Literal[False] = ...,
        **options: Unpack[ForwardOptions],
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: Literal[True],
        **options: Unpack[ForwardOptions],
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        *,
        need_weights: Literal[True],
        **options: Unpack[ForwardOptions],
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
                [`init_cache`][attention.layer.spec.Specified.init_cache]: `x` is the
                next chunk of a sequence whose earlier tokens the cache has taken; positions
                (for RoPE, the mask, the modifiers) continue from each row's last (its
                `next`). A chunk given without ids after one with them is document 0.
            document_ids: optional `(batch, num_tokens)` non-negative ints: several documents
                packed in one row; a query sees only the keys of its own document.
            key: cross-attention: `(batch, num_keys, kdim)`, the other sequence (an
                encoder's output) the keys come from; `key_padding_mask` is then its padding,
                `(batch, num_keys)`. Needs `causal=False`, no RoPE, mask or score modifier.
                With a cache, the first call passes `key` and fills it; later calls (a
                decoder's steps) pass none and read it ([`cross`][attention.layer.cross]).
            value: `(batch, num_keys, vdim)`, what the values come from; default `key`.
            positions: each token's position `(batch, num_tokens)`, non-negative ints, read
                by RoPE, the mask, the score modifiers and the cache alike (offsets, gaps,
                any order where the mask allows); default: each row's real tokens counted
                after the cache's. With a cache, no later call may hold a key an earlier
                query sees (causal: positions grow; a ring cache checks it).
            angles: RoPE's `(cos, sin)` at those positions, made once by a model for every
                layer ([`RotaryTable.at`][attention.layer.positions.RotaryTable.at]); default: made
                here.

        Returns:
            `context_vec` of shape `(batch, num_tokens, d_out)`; with `need_weights=True`,
            `(context_vec, attn_weights)` with weights `(batch, num_heads, num_tokens, num_keys)`
            (`num_keys` is `num_tokens`, or the keys the cache returned).

        Raises:
            TypeError: `x` is not floating point or not of the parameters' dtype; `cache` not
                a `KVCache`; `document_ids` or `positions` not integers.
            ValueError: wrong rank or width of `x`, too many tokens, another device, a mask,
                positions or document ids of the wrong shape, or a cache this chunk does not
                fit.
        """
        w = self.W_query.weight  # the fast test first: a failed one names what is wrong
        like = (w.dtype, w.device)
        shaped = type(x) is Tensor and x.ndim == 3 and x.shape[2] == self.d_in  # (b, T, d_in)
        if not (shaped and x.shape[1] <= self.context_length and (x.dtype, x.device) == like):
            check_input(x, self.d_in, self.context_length, batched=True, like=w)  # or autocast
        if need_weights is not False and need_weights is not True:
            check_flag("need_weights", need_weights)
        spec = self._spec
        if key is not None or value is not None or (cache is not None and self._cross):
            self_only = {"document_ids": document_ids, "positions": positions, "angles": angles}
            cross.check(self, x.shape[0], key, value, key_padding_mask, cache, **self_only)
            out, weights = cross.attend(self, x, key, value, key_padding_mask, cache, need_weights)
            return out if weights is None else (out, weights)
        if (self.kdim, self.vdim) != (self.d_in, self.d_in):
            cross.refuse_self_attention(self)
        b, num_tokens, _ = x.shape
        counted = key_padding_mask is None and document_ids is None and positions is None
        if not counted:  # padding, documents or given positions: each row's own positions
            x = arguments.padding_zeroed(x, key_padding_mask, document_ids, positions)
        if cache is not None and not (  # fast: a cache of this layout with room; else named
            getattr(cache, "layout", None) == self._layout is not None
            and (cache.keys.shape[0], cache.keys.dtype, cache.keys.device) == (b, *like)
            and cache.length >= (self._prefix or 0)
            and (cache.max_tokens is None or cache.length + num_tokens <= cache.max_tokens)
        ):
            arguments.check_cache(self, cache, b, num_tokens, w)
        if angles is not None:  # fast: a pair of one shape that fits; else named
            cos, sin = angles if type(angles) is tuple and len(angles) == 2 else (None, None)
            rotary_dim = self.head_dim if self.rotary is None else self.rotary.dim
            if not (
                type(cos) is type(sin) is Tensor
                and self.rotary is not None
                and cos.shape == sin.shape
                and cos.shape[-2:] == (num_tokens, rotary_dim)
                and cos.shape[:-2] in ((), (1, 1), (b, 1))
                and (cos.dtype, cos.device, sin.device) == (sin.dtype, x.device, x.device)
                and cos.dtype.is_floating_point
            ):
                arguments.check_angles(angles, num_tokens, rotary_dim, self.rope, b, x.device)
        if num_tokens == 0:  # nothing to attend, nothing stored: empty outputs
            empty = x.new_zeros(b, 0, self.out_features)
            return (empty, x.new_zeros(b, self.num_heads, 0, 0)) if need_weights else empty
        if counted and (cache is None or cache.contiguous):
            q = Tokens(b, num_tokens, x.device, 0 if cache is None else cache.length, counted=True)
        else:
            q = queries(b, num_tokens, key_padding_mask, positions, document_ids, x.device, cache)
        if cache is not None and cache.length == 0 and self._prefix:
            arguments.check_prefill(spec.mask, q)
        out, attn_weights = self._attend(x, q, cache, angles, need_weights)
        return out if attn_weights is None else (out, attn_weights)

    def _attend(
        self,
        x: Tensor,
        q: Tokens,
        cache: KVCache | None,
        angles: tuple[Tensor, Tensor] | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention, after the checks: project, rotate, `cache.update`, plan, run, merge.

        `x` `(b, T, d_in)` (padding zeroed), `q` its tokens' positions, RoPE's `angles` if the
        model made them; returns `(b, T, d_out)` and the weights with `need_weights`.
        """
        spec = self._spec
        if self._unprobed and not torch.compiler.is_compiling():  # the first eager call:
            probe(spec.mask, spec.score_mods, self.num_heads, x)  # try them on its device
            self._unprobed = False
        b, num_tokens, _ = x.shape
        queries_, keys, values = self.project(x, q, angles)  # (b, h | h_kv, T, d_h)
        k, own = q, cache is None or cache.length == 0  # a first chunk sees its own tokens
        if cache is not None:  # store; a later chunk gets every key it may need
            stored_keys, stored_values, stored = cache.update(q, keys, values)
            if not own:  # (b, h_kv, S, d_h) and their positions
                keys, values, k = stored_keys, stored_values, stored
                if keys.dtype != queries_.dtype:  # autocast: the cache keeps the module's dtype
                    keys, values = keys.to(queries_.dtype), values.to(queries_.dtype)
        options, sink_logits = self._options, self.sink_logits
        p = self.dropout.p if self.training else 0.0  # dropout's p: none out of training
        if options is None or options.dropout_p != p or options.sink_logits is not sink_logits:
            options = self._new_options(p, sink_logits)
        use_flex = x.device.type in flex.ON and flex.usable(x.device, p, sink_logits is not None)
        try:
            self._trace[0] = chosen = plan_call(  # what runs: the plan printed is this one
                spec.mask, q, k, options, own=own, need_weights=need_weights, flex=use_flex
            )
            context_vec, attn_weights = run(
                chosen, queries_, keys, values, spec.mask, q, k, options
            )
        except Exception as error:  # the cache took the chunk: never read it as if it ran
            if cache is not None:
                cache.spoil(error, num_tokens)
            raise
        attn_weights = attn_weights if need_weights else None
        # merge heads: (b, h, T, d_h) -> (b, T, h, d_h) -> (b, T, d_out)
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, self.d_out)
        if self.W_gate is not None:  # Qwen3-Next: [Z_0; ...; Z_h-1] * sigma(x W_g)
            context_vec = context_vec * torch.sigmoid(self.W_gate(x))  # (b, T, d_out)
        out: Tensor = self.out_proj(context_vec)  # (b, T, out_features)
        return out, attn_weights

    def project(
        self,
        x: Tensor,
        positions: Tokens | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values split into heads, rotated (RoPE) at the tokens' positions.

        Args:
            x: `(batch, num_tokens, d_in)`.
            positions: the tokens' positions; default `0 ... num_tokens - 1`.
            angles: RoPE's `(cos, sin)` at those positions, if the model made them.

        Returns:
            `(queries, keys, values)`: `(b, h, T, d_h)`, `(b, h_kv, T, d_h)`, `(b, h_kv, T, d_h)`.
        """
        # Q = X W_q, K = X W_k, V = X W_v: (b, T, h * d_h) -> (b, T, h, d_h) -> (b, h, T, d_h)
        b, num_tokens, _ = x.shape
        queries_, keys = self.W_query(x), self.W_key(x)  # (b, T, h d_h), (b, T, h_kv d_h)
        if self.q_norm is not None and self.k_norm is not None:  # QK-norm, before RoPE
            queries_, keys = apply_qk_norm(
                self._spec.qk_norm, self.q_norm, self.k_norm, queries_, keys, self.head_dim
            )
        h, h_kv, d_h = self.num_heads, self.num_kv_heads, self.head_dim
        queries_ = queries_.view(b, num_tokens, h, d_h).transpose(1, 2)  # (b, h, T, d_h)
        keys = keys.view(b, num_tokens, h_kv, d_h).transpose(1, 2)  # (b, h_kv, T, d_h)
        values = self.W_value(x).view(b, num_tokens, h_kv, d_h).transpose(1, 2)
        if self.rotary is not None:  # turn each query and key by m * theta_i at its position m
            if angles is None:
                angles = self.rotary.of(
                    positions or Tokens(b, num_tokens, x.device, start=0), x.dtype
                )
            queries_, keys = rotate_with(queries_, angles), rotate_with(keys, angles)
        return queries_, keys, values

    @classmethod
    def from_wrapper(cls, wrapper: MultiHeadAttentionWrapper) -> MultiHeadAttention:
        """The fused module computing what `wrapper` does ([`convert`][attention.layer.convert])."""
        return convert.from_wrapper(cls, wrapper)
