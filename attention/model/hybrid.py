r"""A GPT whose layers mix softmax and linear attention, chosen per layer by its config.

Qwen3-Next (2025) interleaves three linear-attention layers with one softmax layer; its
config names each layer's kind in `layer_types`.
[`HybridGPTModel`][attention.model.hybrid.HybridGPTModel] reads the same key:
`cfg["layer_types"]`, one of `"full_attention"` (the book's
[`TransformerBlock`][attention.model.gpt.TransformerBlock], softmax attention) or
`"linear_attention"` per layer, all `"full_attention"` by default, which is then the plain
[`GPTModel`][attention.model.gpt.GPTModel].

A linear-attention layer ([`LinearAttention`][attention.model.hybrid.LinearAttention]) replaces
the softmax's $\exp(q_t \cdot k_s / \sqrt{d_h})$ by $\phi(q_t) \cdot \phi(k_s)$, with the
feature map $\phi(x) = \operatorname{elu}(x) + 1 > 0$ (Katharopoulos et al., 2020):

$$
\begin{aligned}
o_t &= \frac{\sum_{s \le t} \left(\phi(q_t) \cdot \phi(k_s)\right) v_s}
            {\sum_{s \le t} \phi(q_t) \cdot \phi(k_s)}
     = \frac{\phi(q_t)^\top S_t}{\phi(q_t)^\top z_t}, \\
S_t &= \sum_{s \le t} \phi(k_s)\, v_s^\top \in \mathbb{R}^{d_h \times d_h}, \\
z_t &= \sum_{s \le t} \phi(k_s) .
\end{aligned}
$$

The right-hand form is a recurrence over a state $S_t$ of fixed size: what the layer knows of
the past is a $d_h \times d_h$ matrix per head, however long the sequence; a softmax layer
keeps every earlier key and value. The layer computes the left-hand (parallel) form over a
whole sequence, and the state's when it decodes with a cache: its
[`LinearCache`][attention.layer.linear.LinearCache] holds $(S_t, z_t)$, the same bytes
after 1 token as after 1,000.

Examples:
    >>> import torch
    >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
    ...        "n_layers": 4, "drop_rate": 0.0, "qkv_bias": False,
    ...        "layer_types": ["linear_attention"] * 3 + ["full_attention"]}  # Qwen3-Next's 3:1
    >>> model = HybridGPTModel(cfg).eval()
    >>> [type(block.att).__name__ for block in model.trf_blocks]
    ['LinearAttention', 'LinearAttention', 'LinearAttention', 'MultiHeadAttention']
    >>> model(torch.tensor([[1, 2, 3]])).shape  # (batch, num_tokens, vocab_size)
    torch.Size([1, 3, 50])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attention.checks import check_flag, check_size
from attention.layer.linear import LinearCache, LinearState, linear_chunked, linear_parallel
from attention.model.gpt import FeedForward, GPTModel, LayerNorm

__all__ = ["LAYER_TYPES", "HybridGPTModel", "LinearAttention", "LinearBlock", "layer_types"]

LAYER_TYPES = ("full_attention", "linear_attention")
"""The kinds of layer a `layer_types` list may name (Qwen3-Next's config's words)."""


class LinearAttention(nn.Module):
    r"""Causal multi-head linear attention, with the book's `MultiHeadAttention` names.

    $q_t = W_q x_t$, $k_t = W_k x_t$, $v_t = W_v x_t$, split into `num_heads` heads of
    `head_dim = d_out // num_heads`; each head computes the module's equation
    ($\phi = \operatorname{elu} + 1$; no $1/\sqrt{d_h}$: a constant factor on every
    $\phi(q_t) \cdot \phi(k_s)$ cancels in the ratio), and `out_proj` mixes the heads.
    No positions enter it (like Qwen3-Next's linear layers, it takes no rotary angles): the
    model's position embedding, or a softmax layer, supplies them. With a `cache` (from
    `init_cache`) it continues from the state there, chunk by chunk
    ([`linear_chunked`][attention.layer.linear.linear_chunked]), and leaves the state after
    `x` in it.

    Args:
        d_in: the width of each input token.
        d_out: the width of the output, a multiple of `num_heads`.
        num_heads: heads.
        qkv_bias: biases in `W_query`, `W_key`, `W_value`.

    Raises:
        TypeError: a size that is not an int, `qkv_bias` not a bool.
        ValueError: a size below 1, or `d_out` not a multiple of `num_heads`.

    Examples:
        >>> import torch
        >>> layer = LinearAttention(d_in=8, d_out=8, num_heads=2)
        >>> layer(torch.randn(3, 5, 8)).shape  # (batch, num_tokens, d_out)
        torch.Size([3, 5, 8])
        >>> x, cache = torch.randn(1, 5, 8), layer.init_cache(batch_size=1)
        >>> steps = torch.cat([layer(x[:, :3], cache), layer(x[:, 3:4], cache),
        ...                    layer(x[:, 4:], cache)], dim=1)
        >>> torch.allclose(steps, layer(x), atol=1e-6), cache.length
        (True, 5)
    """

    window = None  # no window: a model's caches ask (`GPTModel.init_caches`)

    def __init__(self, d_in: int, d_out: int, num_heads: int, qkv_bias: bool = False) -> None:
        super().__init__()
        d_in, d_out = check_size("d_in", d_in), check_size("d_out", d_out)
        num_heads = check_size("num_heads", num_heads)
        check_flag("qkv_bias", qkv_bias)
        if d_out % num_heads:
            raise ValueError(f"d_out must be a multiple of num_heads={num_heads}, got {d_out}")
        self.d_in, self.d_out, self.num_heads = d_in, d_out, num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)

    def init_cache(self, batch_size: int, max_tokens: int | None = None) -> LinearCache:
        """An empty [`LinearCache`][attention.layer.linear.LinearCache] (zeros) for decoding
        `batch_size` sequences; `max_tokens` (checked) sizes nothing: the state never grows."""
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
        heads = self.out_proj.weight.new_zeros(
            check_size("batch_size", batch_size), self.num_heads, 1, self.head_dim
        )
        return LinearCache(LinearState.zeros(heads, heads))

    def check_cache(self, cache: object, batch_size: int, num_tokens: int = 0) -> None:
        """Raise an error naming `cache` unless it is a state of this layer for `batch_size`
        rows, in its dtype and on its device (`num_tokens`: any, the state has no slots)."""
        if not isinstance(cache, LinearCache):
            raise TypeError(
                f"cache must be this LinearAttention layer's LinearCache (from "
                f"init_cache), got {type(cache).__name__}"
            )
        want = self.init_cache(batch_size).state.S
        got = cache.state.S
        if (got.shape, got.dtype, got.device) != (want.shape, want.dtype, want.device):
            raise ValueError(
                f"cache must hold a state {tuple(want.shape)} {want.dtype} on "
                f"{want.device} (batch, heads, d_h, d_h), got {tuple(got.shape)} "
                f"{got.dtype} on {got.device}"
            )

    def forward(self, x: Tensor, cache: LinearCache | None = None) -> Tensor:
        """`(b, T, d_in)` -> `(b, T, d_out)`; each output reads only its own and earlier
        tokens, and those `cache` read before (its state then moves past `x`).

        Raises:
            ValueError: `x` is not `(batch, num_tokens, d_in)`; a cache of another shape.
            TypeError: a cache that is not a `LinearCache`.
        """
        if x.ndim != 3 or x.shape[-1] != self.d_in:
            raise ValueError(
                f"x must be (batch, num_tokens, d_in={self.d_in}), got {tuple(x.shape)}"
            )
        b, num_tokens, _ = x.shape
        if cache is not None:
            self.check_cache(cache, b)
        heads = (b, num_tokens, self.num_heads, self.head_dim)
        q = self.W_query(x).view(heads).transpose(1, 2)  # (b, h, T, d_h)
        k = self.W_key(x).view(heads).transpose(1, 2)  # (b, h, T, d_h)
        v = self.W_value(x).view(heads).transpose(1, 2)  # (b, h, T, d_h)
        if cache is None:
            context = linear_parallel(q, k, v)  # phi = elu + 1, normalised: (b, h, T, d_h)
        else:  # from the state (S, z) of the tokens before
            context, state = linear_chunked(q, k, v, state=cache.state)
            cache.update(state, num_tokens)  # computed: nothing is left half-updated
        assert context.shape == (b, self.num_heads, num_tokens, self.head_dim)
        context = context.transpose(1, 2).reshape(b, num_tokens, self.d_out)  # (b, T, d_out)
        out: Tensor = self.out_proj(context)
        return out


class LinearBlock(nn.Module):
    """The book's pre-norm block with [`LinearAttention`][attention.model.hybrid.LinearAttention]
    for its attention: the same `att`, `ff`, `norm1`, `norm2`, `drop_shortcut`.

    Its forward takes what [`GPTModel`][attention.model.gpt.GPTModel] gives every block, its
    cache a [`LinearCache`][attention.layer.linear.LinearCache], and refuses what a linear
    layer here does not do (padding, packed documents); RoPE's angles are not used (the layer
    takes no positions).
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.att = LinearAttention(cfg["emb_dim"], cfg["emb_dim"], cfg["n_heads"], cfg["qkv_bias"])
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(
        self,
        x: Tensor,
        cache: LinearCache | None = None,
        *,
        padded: Tensor | None = None,
        documents: Tensor | None = None,
        positions: Tensor | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """`(b, T, emb_dim)` -> `(b, T, emb_dim)`: `x + att(norm1(x))`, then `+ ff(norm2(.))`.

        Raises:
            NotImplementedError: a padding mask or document ids.
        """
        _refuse_masks(padded, documents)
        x = x + self.drop_shortcut(self.att(self.norm1(x), cache))  # (b, T, emb_dim)
        out: Tensor = x + self.drop_shortcut(self.ff(self.norm2(x)))  # (b, T, emb_dim)
        return out


def _refuse_masks(padded: Tensor | None, documents: Tensor | None) -> None:
    """No padding (`padded` True anywhere, or an attention mask's 0), no documents."""
    padding = padded is not None and bool(
        (padded if padded.dtype == torch.bool else padded == 0).any()
    )
    if padding or documents is not None:
        raise NotImplementedError(
            "a linear-attention layer here takes no attention_mask or document_ids: "
            "its sum over s <= t has no mask"
        )


def layer_types(cfg: Mapping[str, Any]) -> list[str]:
    """`cfg["layer_types"]`, checked against `cfg["n_layers"]`; all `"full_attention"` without it.

    Raises:
        TypeError: `layer_types` is not a list or tuple of strings.
        ValueError: its length is not `n_layers`, or it names a kind not in `LAYER_TYPES`.

    Examples:
        >>> layer_types({"n_layers": 2})
        ['full_attention', 'full_attention']
        >>> layer_types({"n_layers": 2, "layer_types": ["full_attention"]})
        Traceback (most recent call last):
        ...
        ValueError: layer_types must have n_layers=2 entries, got 1: ['full_attention']
    """
    n_layers = cfg["n_layers"]
    kinds = cfg.get("layer_types", ["full_attention"] * n_layers)
    if not isinstance(kinds, Sequence) or isinstance(kinds, str):
        raise TypeError(
            f"layer_types must be a list of {LAYER_TYPES}, got {type(kinds).__name__} {kinds!r:.60}"
        )
    if len(kinds) != n_layers:
        raise ValueError(
            f"layer_types must have n_layers={n_layers} entries, got "
            f"{len(kinds)}: {list(kinds)!r:.80}"
        )
    unknown = [kind for kind in kinds if kind not in LAYER_TYPES]
    if unknown:
        raise ValueError(f"layer_types must name only {LAYER_TYPES}, got {unknown[0]!r}")
    return list(kinds)


class HybridGPTModel(GPTModel):
    """A [`GPTModel`][attention.model.gpt.GPTModel] whose blocks' attention is chosen per layer.

    Built as the plain model of the same config (so, under one seed, an all-softmax hybrid
    holds exactly `GPTModel`'s weights), then each `"linear_attention"` layer's block is
    replaced by a new [`LinearBlock`][attention.model.hybrid.LinearBlock]. The forward is
    `GPTModel`'s, and so are cached decoding and `generate`: `init_caches` gives each linear
    layer a [`LinearCache`][attention.layer.linear.LinearCache] (its state, which does not
    grow) and each softmax layer a `KVCache`. `attention_weights`, and padding or packed
    documents, raise `NotImplementedError` when a layer is linear.

    Args:
        cfg: `GPTModel`'s keys, and `layer_types`: a list of `n_layers` entries of
            `"full_attention"` and `"linear_attention"`, block 0 first.

    Attributes:
        layer_types: the kind of each layer, block 0 first.

    Raises:
        TypeError: `cfg` is not a mapping, or a value of the wrong type.
        ValueError: what `GPTModel` refuses, or a bad `layer_types`
            ([`layer_types`][attention.model.hybrid.layer_types]).
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        if not isinstance(cfg, Mapping):
            raise TypeError(f"cfg must be a dict of the book's keys, got {type(cfg).__name__}")
        super().__init__({key: value for key, value in cfg.items() if key != "layer_types"})
        self.layer_types = layer_types(cfg)
        for i, kind in enumerate(self.layer_types):
            if kind == "linear_attention":
                self.trf_blocks[i] = LinearBlock(cfg)

    @property
    def linear(self) -> bool:
        """Whether any layer is linear attention."""
        return "linear_attention" in self.layer_types

    def logits(
        self,
        in_idx: Tensor,
        caches: list[Any] | None = None,
        *,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
        **options: Any,
    ) -> Tensor:
        """`GPTModel`'s, after refusing what a linear layer does not take (padding, documents)
        before any layer runs: no cache is left half-updated."""
        if self.linear:
            _refuse_masks(attention_mask, document_ids)
        return super().logits(
            in_idx, caches, attention_mask=attention_mask, document_ids=document_ids, **options
        )

    def attention_weights(
        self,
        in_idx: Tensor,
        *,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """`GPTModel`'s softmax weights, for an all-softmax model.

        Raises:
            NotImplementedError: a layer is linear attention (it has no softmax weights).
        """
        if self.linear:
            raise NotImplementedError(
                "a linear-attention layer has no softmax weights to "
                f"return; layer_types={self.layer_types}"
            )
        return super().attention_weights(
            in_idx, attention_mask=attention_mask, document_ids=document_ids
        )
