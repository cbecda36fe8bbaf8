"""What a hybrid keeps per token: the package's cache and state objects against the formulas."""

from __future__ import annotations

import pytest
import torch

from attention.model.hybrid_shapes import (
    HYBRID,
    cache_bytes,
    kv_bytes_per_token,
    linear_state_bytes,
)

QWEN = HYBRID["Qwen3-Next-80B-A3B"]


def test_qwen3_next_has_one_softmax_layer_in_four() -> None:
    assert (QWEN.full_layers, QWEN.linear_layers) == (12, 36)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_objects_hold_what_the_formulas_say(dtype: torch.dtype) -> None:
    size = torch.finfo(dtype).bits // 8
    assert kv_bytes_per_token(QWEN, dtype) == 2 * QWEN.num_kv_heads * QWEN.head_dim * size
    H_k, H_v = QWEN.linear_num_key_heads, QWEN.linear_num_value_heads
    d_k, d_v, K = QWEN.linear_key_head_dim, QWEN.linear_value_head_dim, QWEN.linear_conv_kernel_dim
    expected = H_v * d_k * d_v + (K - 1) * (2 * H_k * d_k + H_v * d_v)
    assert linear_state_bytes(QWEN, dtype) == expected * size


def test_only_the_softmax_layers_grow() -> None:
    fixed = cache_bytes(QWEN, 0)
    assert fixed == QWEN.linear_layers * linear_state_bytes(QWEN)
    for T in (1, 4096, 262144):
        assert cache_bytes(QWEN, T) == fixed + 12 * T * kv_bytes_per_token(QWEN)
        assert cache_bytes(QWEN, T, all_softmax=True) == 48 * T * kv_bytes_per_token(QWEN)
    with pytest.raises(ValueError, match="num_tokens must be >= 0, got -1"):
        cache_bytes(QWEN, -1)
