"""The attention shapes of published models, and what their keys and values cost.

A generating model keeps every layer's keys and values for every token so far (the KV
cache); each new token reads all of them. Its size per token is

$$
2 \\times n_\\text{layers} \\times h_{kv} \\times d_h \\times \\text{bytes per number},
$$

the 2 for keys and values. Fewer key/value heads ($h_{kv} < h$, grouped-query attention)
shrink it by $h / h_{kv}$; a sliding window caps the tokens kept at the window.

The shapes are the models' published configurations (their `config.json`); only the
attention's numbers are kept.

Examples:
    >>> llama = PUBLISHED["Llama 3 8B"]
    >>> llama.num_heads // llama.num_kv_heads  # query heads per key/value head
    4
    >>> kv_cache_bytes(llama, num_tokens=1) // 1024  # KiB per token, bf16
    128
"""

from __future__ import annotations

from dataclasses import dataclass

from attention.checks import check_size

__all__ = ["PUBLISHED", "ModelShape", "kv_cache_bytes", "kv_projection_params"]


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


PUBLISHED: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("GPT-2 small", 12, 768, 12, 12, 64),
        ModelShape("Llama 2 7B", 32, 4096, 32, 32, 128),
        ModelShape("Llama 3 8B", 32, 4096, 32, 8, 128),
        ModelShape("Mistral 7B", 32, 4096, 32, 8, 128, window=4096),
        ModelShape("Qwen2.5 7B", 28, 3584, 28, 4, 128),
        ModelShape("Gemma 2 9B", 42, 3584, 16, 8, 256, window=4096),
    )
}
"""Published shapes, keyed by name. Gemma 2 uses its window in every other layer."""


def kv_cache_bytes(
    shape: ModelShape, num_tokens: int, batch: int = 1, bytes_per_number: int = 2
) -> int:
    """Bytes of keys and values a model keeps for `num_tokens` tokens of `batch` sequences.

    Args:
        shape: the model.
        num_tokens: tokens cached per sequence.
        batch: sequences.
        bytes_per_number: 2 for bfloat16 or float16, 4 for float32.

    Returns:
        $2 \\cdot n_\\text{layers} \\cdot h_{kv} \\cdot d_h \\cdot$ bytes, times tokens and batch.
    """
    check_size("num_tokens", num_tokens, minimum=0)
    check_size("batch", batch)
    per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * bytes_per_number
    return per_token * num_tokens * batch


def kv_projection_params(shape: ModelShape) -> int:
    """Weights of all layers' `W_key` and `W_value`: $2 \\cdot n_\\text{layers} \\cdot
    d_\\text{model} \\cdot h_{kv} d_h$ (biases left out)."""
    return 2 * shape.num_layers * shape.d_model * shape.num_kv_heads * shape.head_dim
