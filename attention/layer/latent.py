r"""Multi-head latent attention (DeepSeek-V2 and V3, Kimi K2): a cache of one small latent
per token, from which every head's keys and values are made.

Grouped-query attention shrinks the cache by sharing key/value heads. Latent attention keeps
every head's keys and values distinct, but makes them from one compressed vector per token,
$c_t \in \mathbb{R}^{r}$ ($r$ = `kv_lora_rank`), by an up-projection per head; only $c_t$ and
one RoPE key $k^R_t \in \mathbb{R}^{d_R}$ shared by all heads ($d_R$ = `qk_rope_head_dim`) are
cached. For token $t$ and head $i$, with $x_t$ the input:

$$
\begin{aligned}
[c_t;\ \tilde k^R_t] &= W_{DKV}\, x_t, \\
c_t &\leftarrow \operatorname{RMSNorm}(c_t), \\
k^R_t &= \operatorname{RoPE}_t(\tilde k^R_t), \\
k^{(i)}_t &= [W^{(i)}_{UK} c_t;\ k^R_t], \\
v^{(i)}_t &= W^{(i)}_{UV} c_t, \\
q^{(i)}_t &= [q^{(i),N}_t;\ \operatorname{RoPE}_t(q^{(i),R}_t)],
\end{aligned}
$$

with $[q^{(i),N}_t; q^{(i),R}_t] = W^{(i)}_{UQ} \operatorname{RMSNorm}(W_{DQ}\, x_t)$ (or
$W^{(i)}_Q x_t$ without `q_lora_rank`), and

$$
\begin{aligned}
o^{(i)}_t &= \sum_s \operatorname{softmax}_s\bigl(\tau\, q^{(i)}_t \cdot k^{(i)}_s
  + M_{ts}\bigr)\, v^{(i)}_s, \\
\text{out}_t &= W_O\, [o^{(0)}_t; \dots; o^{(h-1)}_t],
\end{aligned}
$$

with $\tau$ = `softmax_factor` $/ \sqrt{d_N + d_R}$, $M$ the mask, and
$W^{(i)}_{UK} \in \mathbb{R}^{d_N \times r}$, $W^{(i)}_{UV} \in \mathbb{R}^{d_V \times r}$
(`kv_b_proj`, stacked), $d_N$ = `qk_nope_head_dim`, $d_V$ = `v_head_dim`.

Two ways to compute it, equal:

- **naive**: expand the latents into $k^{(i)}_s$ and $v^{(i)}_s$ for every head, then
  attention as usual ($h$ heads of keys of width $d_N + d_R$, values of width $d_V$);
- **absorbed**: $q^{(i),N} \cdot W^{(i)}_{UK} c_s = (W^{(i)\top}_{UK} q^{(i),N}) \cdot c_s$, so
  the key up-projection moves onto the query, which then scores the latents directly; and
  $\sum_s a_s W^{(i)}_{UV} c_s = W^{(i)}_{UV} \sum_s a_s c_s$, so the value up-projection is
  applied once, after the weighted sum of latents. The attention is then multi-query
  attention over one head of keys $[c_s; k^R_s]$ (width $r + d_R$) and values $c_s$ (width
  $r$): what the cache holds, never expanded.

RoPE is applied only to the decoupled parts $q^R$ and $k^R$: a rotation between $q^N$ and
$W_{UK} c$ would depend on the distance $t - s$ and could not be folded into the query once.

Parameter names and layouts are transformers' `DeepseekV3Attention`'s, so its state dict
loads as it is. Masks, score modifiers, positions, padding, documents and the cache are the
package's, as in [`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention]; the
kernel call is chosen by the same planner ([`attention.layer.fused`][attention.layer.fused]),
SDPA or the explicit path (FlexAttention is not used here).

Examples:
    >>> _ = torch.manual_seed(0)
    >>> mla = MultiHeadLatentAttention(32, num_heads=4, context_length=16, kv_lora_rank=8,
    ...     qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, q_lora_rank=12)
    >>> x = torch.randn(2, 5, 32)
    >>> naive = mla(x)
    >>> mla.absorb = True
    >>> torch.allclose(mla(x), naive, atol=1e-6)
    True
    >>> cache = mla.init_cache(batch_size=2, max_tokens=16)
    >>> cache.keys.shape, cache.values.shape  # (b, 1, slots, d_R), (b, 1, slots, r)
    (torch.Size([2, 1, 16, 4]), torch.Size([2, 1, 16, 8]))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import torch
from torch import Tensor, nn

from attention.checks import check_dropout, check_flag, check_input, check_positive, check_size
from attention.layer import arguments
from attention.layer.cache import KVCache
from attention.layer.fused import Plan, plan_call, run
from attention.layer.masks import Mask
from attention.layer.positions import RotaryTable, rope_frequencies, rotate_with
from attention.layer.probe import probe
from attention.layer.score_mods import ScoreMod, as_score_mods
from attention.layer.spec import AttentionSpec, Specified
from attention.layer.tokens import Tokens, queries

__all__ = [
    "MultiHeadLatentAttention",
    "from_hf_latent",
    "hf_latent_settings",
    "yarn_softmax_factor",
]


def yarn_softmax_factor(factor: float, mscale_all_dim: float) -> float:
    r"""DeepSeek-V3's factor on the softmax scale under YaRN: $m^2$, with
    $m = 0.1\, \text{mscale\_all\_dim} \cdot \ln(\text{factor}) + 1$ (1 for `factor` <= 1 or
    `mscale_all_dim` = 0), as transformers' `yarn_apply_mscale` computes it.

    Examples:
        >>> round(yarn_softmax_factor(40.0, 1.0), 4)  # DeepSeek-V3's rope_scaling
        1.8739
    """
    check_positive("factor", factor)
    if factor <= 1 or not mscale_all_dim:
        return 1.0
    m = 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return m * m


class MultiHeadLatentAttention(Specified, nn.Module):
    r"""Multi-head latent attention: queries per head, keys and values from one cached latent.

    See [`attention.layer.latent`][attention.layer.latent] for the equations. `absorb` chooses
    how it is computed (naive or absorbed); both give the same outputs, weights and cache.

    Args:
        d_in: width of each input embedding (transformers' `hidden_size`).
        num_heads: query heads $h$ (each with its own keys and values, made from the latent).
        context_length: the longest sequence one call takes (and a cache's default size).
        kv_lora_rank: $r$, the latent's width: what the cache keeps per token, with the RoPE key.
        qk_nope_head_dim: $d_N$, each head's query/key width without RoPE.
        qk_rope_head_dim: $d_R$, the RoPE part's width (even), the one key shared by the heads.
        v_head_dim: $d_V$, each head's value width.
        q_lora_rank: the queries' low-rank width (`q_a_proj`, `q_a_layernorm`, `q_b_proj`); None:
            one projection `q_proj`.
        dropout: dropout probability on the attention weights, in training only.
        qkv_bias: biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj` (transformers'
            `attention_bias`).
        rope_base: RoPE's base ($\theta$, `rope_theta`).
        rope_interleave: the RoPE dimensions come in adjacent pairs $(0, 1), (2, 3), \dots$, as
            in DeepSeek's checkpoints (transformers' `rope_interleave`, default True); False:
            the halves $(i, i + d_R / 2)$, as in Llama's.
        softmax_factor: multiplies the scale $1 / \sqrt{d_N + d_R}$ (DeepSeek-V3's YaRN
            $m^2$: [`yarn_softmax_factor`][attention.layer.latent.yarn_softmax_factor]).
        norm_eps: the RMSNorms' $\epsilon$ (transformers' `rms_norm_eps`).
        causal: as in `MultiHeadAttention`: mask the future (default True without `mask`).
        window: with `causal`, the tokens each query sees, itself included.
        sinks: with a `window`, the first tokens every query keeps seeing.
        mask: a [`Mask`][attention.layer.masks.Mask] or a `mask_mod` function, instead of
            `window` and `sinks`.
        score_mods: [`ScoreMod`][attention.layer.score_mods.ScoreMod]s or `score_mod` functions,
            applied in order to the scaled scores.
        absorb: compute it absorbed (the key and value up-projections folded into the query
            and the output); False: naive (keys and values expanded per head).

    Attributes:
        q_proj: `nn.Linear(d_in, h (d_N + d_R))` without `q_lora_rank`, else None.
        q_a_proj: `nn.Linear(d_in, q_lora_rank)`, $W_{DQ}$, with `q_lora_rank`, else None.
        q_a_layernorm: `nn.RMSNorm(q_lora_rank)`, or None.
        q_b_proj: `nn.Linear(q_lora_rank, h (d_N + d_R))`, $W_{UQ}$, or None.
        kv_a_proj_with_mqa: `nn.Linear(d_in, r + d_R)`, $W_{DKV}$ and the RoPE key's.
        kv_a_layernorm: `nn.RMSNorm(r)`.
        kv_b_proj: `nn.Linear(r, h (d_N + d_V))`, no bias: per head, $W_{UK}$'s $d_N$ rows,
            then $W_{UV}$'s $d_V$ rows.
        o_proj: `nn.Linear(h d_V, d_in)`, $W_O$.
        head_dim: $d_N + d_R$, a query's (and an expanded key's) width.
        num_kv_heads: 1, the heads the cache holds.

    Raises:
        TypeError: a size not an int, a switch not a bool, or a number not a number.
        ValueError: a size below 1, an odd `qk_rope_head_dim`, `dropout` outside $[0, 1)$,
            a non-positive `softmax_factor` or `norm_eps`, or mask arguments that contradict.
    """

    def __init__(
        self,
        d_in: int,
        num_heads: int,
        context_length: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        dropout: float = 0.0,
        qkv_bias: bool = False,
        rope_base: float = 10000.0,
        rope_interleave: bool = True,
        softmax_factor: float = 1.0,
        norm_eps: float = 1e-6,
        causal: bool | None = None,
        window: int | None = None,
        sinks: int = 0,
        mask: Mask | Callable[..., Tensor] | None = None,
        score_mods: Sequence[ScoreMod | Callable[..., Tensor]] = (),
        absorb: bool = False,
    ) -> None:
        super().__init__()
        self.d_in = self.kdim = self.vdim = check_size("d_in", d_in)
        self.num_heads = check_size("num_heads", num_heads)
        self.context_length = check_size("context_length", context_length)
        self.kv_lora_rank = check_size("kv_lora_rank", kv_lora_rank)
        self.qk_nope_head_dim = check_size("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = check_size("qk_rope_head_dim", qk_rope_head_dim)
        self.v_head_dim = check_size("v_head_dim", v_head_dim)
        self.q_lora_rank = None if q_lora_rank is None else check_size("q_lora_rank", q_lora_rank)
        if qk_rope_head_dim % 2:
            raise ValueError(
                f"qk_rope_head_dim must be even (RoPE turns pairs), got {qk_rope_head_dim}"
            )
        check_dropout(dropout)
        bias = check_flag("qkv_bias", qkv_bias)
        self.rope_interleave = check_flag("rope_interleave", rope_interleave)
        self.absorb = check_flag("absorb", absorb)
        factor = check_positive("softmax_factor", softmax_factor)
        eps = check_positive("norm_eps", norm_eps)
        self.num_kv_heads, self.head_dim = 1, qk_nope_head_dim + qk_rope_head_dim
        self._trace: list[Plan | None] = [None]
        rule = arguments.layer_mask(causal, window, sinks, mask)
        rope_frequencies(2, rope_base)  # checks rope_base: a finite number above 1
        self.rotary = RotaryTable(qk_rope_head_dim, rope_base, limit=max(256, 2 * context_length))
        scale = factor / math.sqrt(self.head_dim)  # tau = softmax_factor / sqrt(d_N + d_R)
        mods = as_score_mods(score_mods)  # the spec: one key/value head (the latent), no sink
        self.spec = AttentionSpec(
            rule, mods, scale, float(rope_base), num_heads=num_heads, head_dim=self.head_dim
        )
        self._unprobed = True
        h, r, d_r = num_heads, kv_lora_rank, qk_rope_head_dim
        q_out = h * self.head_dim
        if q_lora_rank is None:
            self.q_proj: nn.Linear | None = nn.Linear(d_in, q_out, bias=False)
            self.q_a_proj = self.q_b_proj = None
            self.q_a_layernorm: nn.RMSNorm | None = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(d_in, q_lora_rank, bias=bias)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=eps)
            self.q_b_proj = nn.Linear(q_lora_rank, q_out, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_in, r + d_r, bias=bias)
        self.kv_a_layernorm = nn.RMSNorm(r, eps=eps)
        self.kv_b_proj = nn.Linear(r, h * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * v_head_dim, d_in, bias=bias)
        self.dropout = nn.Dropout(dropout)

    @Specified.spec.setter  # type: ignore[attr-defined, untyped-decorator]
    def spec(self, new: AttentionSpec) -> None:
        Specified.spec.fset(self, new)  # type: ignore[attr-defined]
        if self._layout is not None:  # its own cache layout: a latent and a RoPE key
            latent = ("latent", self.kv_lora_rank, self.qk_rope_head_dim)
            self._layout = (*latent, *self._layout[2:])

    @property
    def cache_widths(self) -> tuple[int, int, int]:
        """What its cache stores per token: `(heads, key width, value width)` =
        `(1, qk_rope_head_dim, kv_lora_rank)`: the RoPE key and the latent."""
        return 1, self.qk_rope_head_dim, self.kv_lora_rank

    def init_cache(self, batch_size: int, max_tokens: int | None = None) -> KVCache:
        """An empty cache for this layer: per token, its RoPE key (as the cache's `keys`,
        `(batch, 1, slots, d_R)`) and its latent (`values`, `(batch, 1, slots, r)`).

        Args:
            batch_size: sequences generated together.
            max_tokens: the most tokens it takes; default `context_length` (no limit with a
                window: a ring buffer of `window + sinks` slots).

        Raises:
            ValueError: `max_tokens` (without a window) beyond `context_length`, or a mask
                without bounds (no cache can take it).
        """
        window = self.window
        if max_tokens is None and window is None:
            max_tokens = self.context_length
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
            if window is None and max_tokens > self.context_length:
                raise ValueError(
                    f"max_tokens={max_tokens} is longer than context_length={self.context_length}"
                )
        weight = self.kv_a_proj_with_mqa.weight
        heads, d_k, d_v = self.cache_widths
        cache = KVCache(
            batch_size,
            max_tokens,
            heads,
            d_k,
            value_dim=d_v,
            window=window,
            sinks=self.sinks,
            device=weight.device,
            dtype=weight.dtype,
        )
        cache.layout = self.layout
        return cache

    def check_cache(self, cache: object, batch_size: int, num_tokens: int) -> None:
        """Raise an error naming `cache` unless this layer made it and the chunk fits."""
        like = self.kv_a_proj_with_mqa.weight
        arguments.check_cache(self, cache, batch_size, num_tokens, like, self.cache_widths)
        if getattr(cache, "layout", None) != self.layout:
            raise ValueError(
                f"cache was made for the layout {getattr(cache, 'layout', None)}; "
                f"this module's is {self.layout}: use its init_cache"
            )

    @overload
    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = ...,
        need_weights: Literal[False] = ...,
        *,
        cache: KVCache | None = ...,
        document_ids: Tensor | None = ...,
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
        positions: Tensor | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Latent self-attention over `x`, naive or absorbed (`absorb`), the same numbers.

        Args:
            x: `(batch, num_tokens, d_in)`, `num_tokens <= context_length`, of the parameters'
                dtype and device.
            key_padding_mask: optional bool `(batch, num_tokens)`, True marks padding: it
                takes no part, and its output is `o_proj`'s bias.
            need_weights: also return the weights `(batch, num_heads, num_tokens, num_keys)`
                (the explicit path).
            cache: a [`KVCache`][attention.layer.cache.KVCache] from
                [`init_cache`][attention.layer.latent.MultiHeadLatentAttention.init_cache]:
                it stores each token's RoPE key and latent, and `x` continues its sequence.
            document_ids: optional `(batch, num_tokens)` ids of packed documents.
            positions: optional `(batch, num_tokens)` positions, read by RoPE, the mask, the
                score modifiers and the cache; default each row's real tokens counted after
                the cache's.
            angles: RoPE's `(cos, sin)` of width `qk_rope_head_dim` at those positions, made
                by a model (another RoPE's frequencies, YaRN's); default: made here.

        Returns:
            `(batch, num_tokens, d_in)`; with `need_weights`, also the weights.

        Raises:
            TypeError: `x` not floating point or not of the parameters' dtype; a cache that is
                not a `KVCache`; ids or positions not integers.
            ValueError: a wrong shape of `x`, a mask, positions, ids or angles; a cache made
                for another layout, or full.
        """
        check_input(
            x, self.d_in, self.context_length, batched=True, like=self.kv_a_proj_with_mqa.weight
        )
        check_flag("need_weights", need_weights)
        b, num_tokens, _ = x.shape
        if key_padding_mask is not None or document_ids is not None or positions is not None:
            x = arguments.padding_zeroed(x, key_padding_mask, document_ids, positions)
        if cache is not None:
            self.check_cache(cache, b, num_tokens)
        if angles is not None:
            arguments.check_angles(angles, num_tokens, self.qk_rope_head_dim, True, b, x.device)
        if num_tokens == 0 or b == 0:  # nothing to attend: empty outputs, the cache unchanged
            empty = x.new_zeros(b, num_tokens, self.d_in)
            keys = num_tokens + (cache.length if cache is not None else 0)
            return (
                (empty, x.new_zeros(b, self.num_heads, num_tokens, keys if num_tokens else 0))
                if need_weights
                else empty
            )
        q = queries(b, num_tokens, key_padding_mask, positions, document_ids, x.device, cache)
        if cache is not None and cache.length == 0 and self._prefix:
            arguments.check_prefill(self.rule, q)
        out, weights = self._attend(x, q, cache, angles, need_weights)
        return out if weights is None else (out, weights)

    def _attend(
        self,
        x: Tensor,
        q: Tokens,
        cache: KVCache | None,
        angles: tuple[Tensor, Tensor] | None,
        need_weights: bool,
        mask: Mask | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """After the checks: project, rotate, `cache.update`, then naive or absorbed, under
        the layer's mask or, for this call, `mask` (DeepSeek-V3.2's chosen keys)."""
        spec = self._spec
        rule = spec.mask if mask is None else mask
        if self._unprobed and not torch.compiler.is_compiling():
            probe(spec.mask, spec.score_mods, self.num_heads, x)
            self._unprobed = False
        b, num_tokens, _ = x.shape
        q_nope, q_rope, latent, k_rope = self.project(x, q, angles)
        k, own = q, cache is None or cache.length == 0
        if cache is not None:  # the cache stores the RoPE key (as keys) and the latent (values)
            stored_k_rope, stored_latent, stored = cache.update(q, k_rope, latent)
            if not own:  # (b, 1, S, d_R), (b, 1, S, r), and their positions
                k_rope, latent, k = stored_k_rope, stored_latent, stored
        options = self._new_options(self.dropout.p if self.training else 0.0)
        try:
            chosen = plan_call(rule, q, k, options, own=own, need_weights=need_weights)
            self._trace[0] = chosen
            form = self._absorbed if self.absorb else self._naive
            queries_, keys, values = form(q_nope, q_rope, latent, k_rope)
            context_vec, weights = run(chosen, queries_, keys, values, rule, q, k, options)
        except Exception as error:  # as MultiHeadAttention: the cache took the chunk
            if cache is not None:
                cache.spoil(error, num_tokens)
            raise
        if self.absorb:  # W_UV sum_s a_s c_s = sum_s a_s W_UV c_s: (b, h, T, r) -> (b, h, T, d_V)
            context_vec = torch.einsum("bhtr,hvr->bhtv", context_vec, self.up_projections()[1])
        # merge heads: (b, h, T, d_V) -> (b, T, h d_V)
        assert context_vec.shape == (b, self.num_heads, num_tokens, self.v_head_dim)
        context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, -1)
        out: Tensor = self.o_proj(context_vec)  # (b, T, d_in)
        return out, weights if need_weights else None

    def project(
        self,
        x: Tensor,
        positions: Tokens | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Queries, latents and RoPE keys of `x`, rotated at the tokens' positions.

        Args:
            x: `(batch, num_tokens, d_in)`.
            positions: the tokens' positions; default `0 ... num_tokens - 1`.
            angles: RoPE's `(cos, sin)` at those positions, if a model made them.

        Returns:
            `(q_nope, q_rope, latent, k_rope)`: `(b, h, T, d_N)`, `(b, h, T, d_R)`,
            `(b, 1, T, r)` and `(b, 1, T, d_R)`.
        """
        b, num_tokens, _ = x.shape
        h, d_n, d_r = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        # q = W_UQ RMSNorm(W_DQ x), or W_Q x: (b, T, h (d_N + d_R)) -> (b, h, T, d_N + d_R)
        if self.q_proj is not None:
            q_all = self.q_proj(x)
        else:
            assert self.q_a_proj is not None and self.q_a_layernorm is not None
            assert self.q_b_proj is not None
            q_all = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_all = q_all.view(b, num_tokens, h, self.head_dim).transpose(1, 2)
        q_nope, q_rope = q_all.split((d_n, d_r), dim=-1)  # (b, h, T, d_N), (b, h, T, d_R)
        # [c; k~R] = W_DKV x: (b, T, r + d_R); c <- RMSNorm(c); one head each: (b, 1, T, .)
        c, k_rope = self.kv_a_proj_with_mqa(x).split((self.kv_lora_rank, d_r), dim=-1)
        latent = self.kv_a_layernorm(c)[:, None]  # (b, 1, T, r)
        k_rope = k_rope[:, None]  # (b, 1, T, d_R)
        if self.rope_interleave:  # pairs (0, 1), (2, 3), ... -> halves (0, 2, ..., 1, 3, ...)
            q_rope, k_rope = _halves(q_rope), _halves(k_rope)
        if angles is None:
            angles = self.rotary.of(positions or Tokens(b, num_tokens, x.device, start=0), x.dtype)
        q_rope, k_rope = rotate_with(q_rope, angles), rotate_with(k_rope, angles)
        return q_nope, q_rope, latent, k_rope

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """`kv_b_proj`'s weight per head: $W_{UK}$ `(h, d_N, r)` and $W_{UV}$ `(h, d_V, r)`."""
        w = self.kv_b_proj.weight.view(
            self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )
        w_uk, w_uv = w.split((self.qk_nope_head_dim, self.v_head_dim), dim=1)
        return w_uk, w_uv

    def _naive(
        self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """What the kernel takes with keys and values expanded per head: queries
        `(b, h, T, d_N + d_R)`, keys `(b, h, S, d_N + d_R)`, values `(b, h, S, d_V)`."""
        b, _, s, _ = latent.shape
        w_uk, w_uv = self.up_projections()  # (h, d_N, r), (h, d_V, r)
        k_nope = torch.einsum("bsr,hnr->bhsn", latent[:, 0], w_uk)  # W_UK c_s: (b, h, S, d_N)
        values = torch.einsum("bsr,hvr->bhsv", latent[:, 0], w_uv)  # W_UV c_s: (b, h, S, d_V)
        k_r = k_rope.expand(b, self.num_heads, s, self.qk_rope_head_dim)  # shared by the heads
        keys = torch.cat((k_nope, k_r), dim=-1)  # [W_UK c_s; k^R_s]: (b, h, S, d_N + d_R)
        queries_ = torch.cat((q_nope, q_rope), dim=-1)  # (b, h, T, d_N + d_R)
        return queries_, keys, values

    def _absorbed(
        self, q_nope: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """What the kernel takes with W_UK folded into the query: queries `(b, h, T, r + d_R)`,
        one head of keys `(b, 1, S, r + d_R)`, the latents as values `(b, 1, S, r)`; W_UV is
        applied after the weighted sum."""
        w_uk, _ = self.up_projections()  # (h, d_N, r)
        # q^N . (W_UK c_s) = (W_UK^T q^N) . c_s: each head's query in latent space, (b, h, T, r)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)
        queries_ = torch.cat((q_latent, q_rope), dim=-1)  # (b, h, T, r + d_R)
        keys = torch.cat((latent, k_rope), dim=-1)  # one head for all: (b, 1, S, r + d_R)
        return queries_, keys, latent  # multi-query attention whose values are the latents

    def extra_repr(self) -> str:
        sizes = (
            f"kv_lora_rank={self.kv_lora_rank}, q_lora_rank={self.q_lora_rank}, "
            f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim="
            f"{self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}"
        )
        return f"{super().extra_repr()}, {sizes}, absorb={self.absorb}"


def _halves(x: Tensor) -> Tensor:
    """Interleaved pairs to halves: `(x_0, x_2, ..., x_1, x_3, ...)`, so that rotate-half RoPE
    turns each pair $(x_{2i}, x_{2i+1})$ by $m \\theta_i$ (what transformers'
    `apply_rotary_pos_emb_interleave` returns). Every query and key is permuted alike, so no
    score changes but for the rotation."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def hf_latent_settings(module: nn.Module) -> dict[str, Any]:
    """The keyword arguments of [`MultiHeadLatentAttention`][attention.layer.latent.MultiHeadLatentAttention]
    that hold transformers' DeepSeek-V3 (or V3.2) attention module `module`, read from its
    config and its norms.

    Raises:
        TypeError: `module` is not a transformers module with a config and `kv_a_proj_with_mqa`.
        ValueError: a RoPE scaling other than none or YaRN (whose softmax factor is read;
            its angles are the model's, given to the layer as `angles`).
    """  # noqa: E501
    config: Any = getattr(module, "config", None)
    if config is None or not hasattr(module, "kv_a_proj_with_mqa"):
        raise TypeError(
            f"module must be transformers' DeepSeek-V3 attention (a module with a "
            f"config and kv_a_proj_with_mqa), got {type(module).__name__}"
        )
    rope = dict(config.rope_parameters or {})
    kind = rope.get("rope_type", "default")
    if kind not in ("default", "yarn"):
        raise ValueError(
            f"config.rope_parameters has rope_type={kind!r}; the latent layer's "
            "loader reads 'default' and 'yarn' (its softmax factor)"
        )
    factor = 1.0
    if kind == "yarn":
        factor = yarn_softmax_factor(float(rope["factor"]), float(rope.get("mscale_all_dim", 0)))
    norm: Any = module.kv_a_layernorm
    return {
        "d_in": config.hidden_size,
        "num_heads": config.num_attention_heads,
        "context_length": config.max_position_embeddings,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "q_lora_rank": config.q_lora_rank,
        "qkv_bias": bool(config.attention_bias),
        "rope_base": float(rope.get("rope_theta", 10000.0)),
        "rope_interleave": bool(getattr(config, "rope_interleave", True)),
        "softmax_factor": factor,
        "norm_eps": float(norm.variance_epsilon),
        "dropout": float(config.attention_dropout),
    }


def from_hf_latent(module: nn.Module) -> MultiHeadLatentAttention:
    """transformers' DeepSeek-V3 attention module (`DeepseekV3Attention`, a layer's
    `self_attn`) as a [`MultiHeadLatentAttention`][attention.layer.latent.MultiHeadLatentAttention]
    with the same weights (copies), dtype, device and mode.

    Raises:
        TypeError: `module` is not a transformers DeepSeek-V3 attention module.
        ValueError: a RoPE scaling other than none or YaRN.
    """
    settings = hf_latent_settings(module)
    like: Tensor = getattr(module, "kv_a_proj_with_mqa").weight  # noqa: B009
    layer = MultiHeadLatentAttention(**settings).to(device=like.device, dtype=like.dtype)
    layer.load_state_dict(module.state_dict(), strict=True)
    return layer.train(module.training)
