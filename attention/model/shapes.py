"""The attention shapes of published models, and what their keys and values cost.

A generating model keeps every layer's keys and values for every token so far (the KV
cache); each new token reads all of them. Its size per token is

$$
2 \\times n_\\text{layers} \\times h_{kv} \\times d_h \\times \\text{bytes per number},
$$

the 2 for keys and values. Fewer key/value heads ($h_{kv} < h$, grouped-query attention)
shrink it by $h / h_{kv}$; a sliding window caps the tokens a windowed layer keeps at the
window $w$. A model with latent attention
([`attention.layer.latent`][attention.layer.latent]) keeps instead one latent of
`kv_lora_rank` numbers and one RoPE key of `qk_rope_head_dim` per token and layer
([`LatentShape`][attention.model.shapes.LatentShape]).

The shapes are the models' published configurations (their `config.json`); only the
attention's numbers are kept.

Examples:
    >>> llama = PUBLISHED["Llama 3 8B"]
    >>> llama.num_heads // llama.num_kv_heads  # query heads per key/value head
    4
    >>> kv_cache_bytes(llama, num_tokens=1) // 1024  # KiB per token, bf16
    128
    >>> gemma = PUBLISHED["Gemma 2 9B"]  # a window in every other layer
    >>> gemma.windowed_layers, gemma.window
    (21, 4096)
    >>> kv_cache_bytes(gemma, 8192) == kv_cache_bytes(gemma, 4096) * (21 * 2 + 21) // 42
    True
    >>> deepseek = LATENT["DeepSeek-V3"]
    >>> cached_per_token(deepseek), cached_per_token(llama)  # numbers per token and layer
    (576, 2048)
"""

from __future__ import annotations

from dataclasses import dataclass

from attention.checks import check_size

__all__ = [
    "LARGE_GQA",
    "LATENT",
    "PUBLISHED",
    "LatentShape",
    "ModelShape",
    "cached_per_token",
    "kv_cache_bytes",
    "kv_projection_params",
]


@dataclass(frozen=True)
class ModelShape:
    """The attention-relevant shape of one model."""

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    window: int | None = None
    """The sliding window of its windowed layers, if it has one."""
    windowed_layers: int = 0
    """How many of its layers attend to (and cache) only the last `window` tokens."""

    def __post_init__(self) -> None:
        if not 0 <= self.windowed_layers <= self.num_layers:
            raise ValueError(
                f"windowed_layers must be in [0, num_layers={self.num_layers}], "
                f"got {self.windowed_layers}"
            )


PUBLISHED: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("GPT-2 small", 12, 768, 12, 12, 64),
        ModelShape("Llama 2 7B", 32, 4096, 32, 32, 128),
        ModelShape("Llama 3 8B", 32, 4096, 32, 8, 128),
        ModelShape("Mistral 7B v0.1", 32, 4096, 32, 8, 128, window=4096, windowed_layers=32),
        ModelShape("Qwen2.5 7B", 28, 3584, 28, 4, 128),
        ModelShape("Gemma 2 9B", 42, 3584, 16, 8, 256, window=4096, windowed_layers=21),
    )
}
"""Published shapes, keyed by name. Mistral 7B's window is v0.1's, in every layer (v0.2 and
later attend over their whole 32k context); Gemma 2 uses its window in every other layer."""


LARGE_GQA: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("Llama 3 70B", 80, 8192, 64, 8, 128),
        ModelShape("Qwen3 235B-A22B", 94, 4096, 64, 4, 128),
    )
}
"""Larger grouped-query models, compared with the latent ones in chapter 17 (kept apart from
`PUBLISHED`, whose models chapters 5 and 11 chart)."""


@dataclass(frozen=True)
class LatentShape:
    """The attention-relevant shape of a model with multi-head latent attention."""

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    kv_lora_rank: int
    """$r$: the latent's width, cached per token."""
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    """$d_R$: the one RoPE key's width, cached per token beside the latent."""
    v_head_dim: int
    q_lora_rank: int | None = None

    @property
    def expanded_per_token(self) -> int:
        """Numbers per token and layer of the keys and values the latent expands to:
        $h (d_N + d_R + d_V)$, what multi-head attention of these widths would cache."""
        return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)


LATENT: dict[str, LatentShape] = {
    shape.name: shape
    for shape in (
        LatentShape("DeepSeek-V3", 61, 7168, 128, 512, 128, 64, 128, q_lora_rank=1536),
        LatentShape("Kimi K2", 61, 7168, 64, 512, 128, 64, 128, q_lora_rank=1536),
    )
}
"""Published shapes with latent attention, keyed by name (their `config.json`: Kimi K2 is
DeepSeek-V3's architecture with half the heads)."""


def cached_per_token(shape: ModelShape | LatentShape) -> int:
    """Numbers one layer caches per token: $2 h_{kv} d_h$ (keys and values), or a latent
    model's $r + d_R$ (its latent and its RoPE key)."""
    if isinstance(shape, LatentShape):
        return shape.kv_lora_rank + shape.qk_rope_head_dim
    return 2 * shape.num_kv_heads * shape.head_dim


def kv_cache_bytes(
    shape: ModelShape | LatentShape, num_tokens: int, batch: int = 1, bytes_per_number: int = 2
) -> int:
    """Bytes of keys and values a model keeps for `num_tokens` tokens of `batch` sequences.

    Its windowed layers keep $\\min(T, w)$ tokens, the others all $T$.

    Args:
        shape: the model.
        num_tokens: tokens cached per sequence.
        batch: sequences.
        bytes_per_number: 2 for bfloat16 or float16, 4 for float32.

    Returns:
        [`cached_per_token`][attention.model.shapes.cached_per_token] times bytes, times the
        tokens each layer keeps, summed over layers, times `batch`.
    """
    check_size("num_tokens", num_tokens, minimum=0)
    check_size("batch", batch)
    per_layer_token = cached_per_token(shape) * bytes_per_number
    if isinstance(shape, LatentShape):
        return per_layer_token * shape.num_layers * num_tokens * batch
    windowed = shape.windowed_layers if shape.window else 0
    kept = (shape.num_layers - windowed) * num_tokens
    kept += windowed * min(num_tokens, shape.window or num_tokens)
    return per_layer_token * kept * batch


def kv_projection_params(shape: ModelShape) -> int:
    """Weights of all layers' `W_key` and `W_value`: $2 \\cdot n_\\text{layers} \\cdot
    d_\\text{model} \\cdot h_{kv} d_h$ (biases left out)."""
    return 2 * shape.num_layers * shape.d_model * shape.num_kv_heads * shape.head_dim
