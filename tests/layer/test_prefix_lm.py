"""Prefix-LM, one function: equal to attention-gym's, to the definition, fused and explicit."""

from __future__ import annotations

import pytest
import torch
from attn_gym.masks import generate_prefix_lm_mask
from torch.testing import assert_close

from attention import MultiHeadAttention, prefix_lm
from attention.layer.fused import plan
from attention.layer.masks import Mask
from attention.layer.testing import padding_mask, reference_attention

B, T, D_IN, H = 2, 9, 6, 2


def test_it_is_attention_gyms_prefix_lm() -> None:
    pos = torch.arange(T)
    for n in (1, 4, T):
        assert torch.equal(
            prefix_lm(n).grid(pos, pos), Mask(generate_prefix_lm_mask(n)).grid(pos, pos)
        )


@pytest.mark.parametrize("padded", [False, True])
def test_a_prefix_lm_layer_equals_the_definition(padded: bool) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, 8, T, 0.0, H, num_kv_heads=1, rope=True,
                             mask=prefix_lm(4)).double()  # fmt: skip
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    pad = padding_mask([T, T - 3], T, side="left") if padded else None
    expected = reference_attention(mha, x, pad)
    assert_close(mha(x, pad), expected, atol=1e-10, rtol=0)
    explicit, weights = mha(x, pad, need_weights=True)
    assert_close(explicit, expected, atol=1e-10, rtol=0)
    assert bool((weights[0, :, 0, 3] > 0).all())  # the first token reads the prefix's last


def test_the_planner_and_the_cache_know_it_is_not_causal() -> None:
    assert plan(prefix_lm(4), 64, 64).kind == "mask"
    mha = MultiHeadAttention(D_IN, 8, T, 0.0, H, mask=prefix_lm(4))
    with pytest.raises(ValueError, match=r"cache needs a mask that hides the future"):
        mha(torch.randn(1, 2, D_IN), cache=mha.init_cache(1))
