"""The attention shapes of published models, and what their keys and values cost.

A generating model keeps every layer's keys and values for every token so far (the KV
cache); each new token reads all of them. Its size per token is

$$
2 \\times n_\\text{layers} \\times h_{kv} \\times d_h \\times \\text{bytes per number},
$$

the 2 for keys and values. Fewer key/value heads ($h_{kv} < h$, grouped-query attention)
shrink it by $h / h_{kv}$; a sliding window caps the tokens a windowed layer keeps at the
window $w$.

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
    windowed_layers: int = 0
    """How many of its layers attend to (and cache) only the last `window` tokens."""

    def __post_init__(self) -> None:
        if not 0 <= self.windowed_layers <= self.num_layers:
            raise ValueError(f"windowed_layers must be in [0, num_layers={self.num_layers}], "
                             f"got {self.windowed_layers}")  # fmt: skip


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


def kv_cache_bytes(
    shape: ModelShape, num_tokens: int, batch: int = 1, bytes_per_number: int = 2
) -> int:
    """Bytes of keys and values a model keeps for `num_tokens` tokens of `batch` sequences.

    Its windowed layers keep $\\min(T, w)$ tokens, the others all $T$.

    Args:
        shape: the model.
        num_tokens: tokens cached per sequence.
        batch: sequences.
        bytes_per_number: 2 for bfloat16 or float16, 4 for float32.

    Returns:
        $2 \\cdot h_{kv} \\cdot d_h \\cdot$ bytes, times the tokens each layer keeps, summed
        over layers, times `batch`.
    """
    check_size("num_tokens", num_tokens, minimum=0)
    check_size("batch", batch)
    per_layer_token = 2 * shape.num_kv_heads * shape.head_dim * bytes_per_number
    windowed = shape.windowed_layers if shape.window else 0
    kept = (shape.num_layers - windowed) * num_tokens
    kept += windowed * min(num_tokens, shape.window or num_tokens)
    return per_layer_token * kept * batch


def kv_projection_params(shape: ModelShape) -> int:
    """Weights of all layers' `W_key` and `W_value`: $2 \\cdot n_\\text{layers} \\cdot
    d_\\text{model} \\cdot h_{kv} d_h$ (biases left out)."""
    return 2 * shape.num_layers * shape.d_model * shape.num_kv_heads * shape.head_dim
