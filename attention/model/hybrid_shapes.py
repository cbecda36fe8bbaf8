"""The shapes of published hybrid models (linear-attention and softmax layers) and what their
caches hold, measured on the package's own cache and state objects.

A hybrid such as Qwen3-Next interleaves softmax layers, whose
[`KVCache`][attention.layer.cache.KVCache] grows by $2 h_{kv} d_h$ numbers per token, with
Gated DeltaNet layers ([`attention.layer.gated_delta`][attention.layer.gated_delta]), whose
[`GatedDeltaState`][attention.layer.gated_delta.GatedDeltaState] is the same size after one
token or a million: $H_v d_k d_v$ numbers of the delta rule's state and $(K - 1)$ inputs of
the short convolution, $2 H_k d_k + H_v d_v$ wide. The objects are made on PyTorch's `meta`
device: shapes and dtypes, no memory.

Examples:
    >>> qwen = HYBRID["Qwen3-Next-80B-A3B"]
    >>> qwen.full_layers, qwen.linear_layers
    (12, 36)
    >>> cache_bytes(qwen, 1000) - cache_bytes(qwen, 0) == 12 * 1000 * kv_bytes_per_token(qwen)
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attention.checks import check_size
from attention.layer.cache import KVCache
from attention.layer.gated_delta import GatedDeltaNet

__all__ = ["HYBRID", "HybridShape", "cache_bytes", "kv_bytes_per_token", "linear_state_bytes"]


@dataclass(frozen=True)
class HybridShape:
    """The attention-relevant shape of a hybrid model: every `full_attention_interval`-th
    layer is softmax attention, the others Gated DeltaNet."""

    name: str
    num_layers: int
    d_model: int
    full_attention_interval: int
    num_kv_heads: int
    """Softmax layers: key/value heads $h_{kv}$."""
    head_dim: int
    """Softmax layers: $d_h$."""
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int

    @property
    def full_layers(self) -> int:
        """Softmax layers: layers $i$ with $(i + 1)$ a multiple of the interval."""
        return self.num_layers // self.full_attention_interval

    @property
    def linear_layers(self) -> int:
        return self.num_layers - self.full_layers


HYBRID: dict[str, HybridShape] = {
    shape.name: shape
    for shape in (HybridShape("Qwen3-Next-80B-A3B", 48, 2048, 4, 2, 256, 16, 32, 128, 128, 4),)
}
"""Published hybrid shapes (their `config.json`), keyed by name."""


def kv_bytes_per_token(shape: HybridShape, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes one token adds to one softmax layer's key/value cache: a one-token
    [`KVCache`][attention.layer.cache.KVCache]'s `nbytes`."""
    cache = KVCache(1, 1, shape.num_kv_heads, shape.head_dim, device="meta", dtype=dtype)
    return cache.nbytes


def linear_state_bytes(shape: HybridShape, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of one Gated DeltaNet layer's decode state, whatever the length: its
    [`GatedDeltaState`][attention.layer.gated_delta.GatedDeltaState]'s `nbytes`."""
    with torch.device("meta"):
        layer = GatedDeltaNet(
            shape.d_model,
            num_k_heads=shape.linear_num_key_heads,
            num_v_heads=shape.linear_num_value_heads,
            head_k_dim=shape.linear_key_head_dim,
            head_v_dim=shape.linear_value_head_dim,
            conv_kernel_size=shape.linear_conv_kernel_dim,
        ).to(dtype)
    return layer.init_state(batch_size=1).nbytes


def cache_bytes(
    shape: HybridShape,
    num_tokens: int,
    *,
    all_softmax: bool = False,
    dtype: torch.dtype = torch.bfloat16,
) -> int:
    """Bytes a model keeps to decode after `num_tokens` tokens of one sequence: its softmax
    layers' keys and values, plus its linear layers' fixed states; with `all_softmax`, the
    same model with every layer softmax attention."""
    check_size("num_tokens", num_tokens, minimum=0)
    if all_softmax:
        return shape.num_layers * num_tokens * kv_bytes_per_token(shape, dtype)
    kv = shape.full_layers * num_tokens * kv_bytes_per_token(shape, dtype)
    return kv + shape.linear_layers * linear_state_bytes(shape, dtype)
