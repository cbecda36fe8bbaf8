"""ALiBi, one function: the paper's slopes, attention-gym's modifier, fused and cached."""

from __future__ import annotations

import pytest
import torch
from attn_gym.mods import generate_alibi_bias
from torch.testing import assert_close

from attention import MultiHeadAttention, alibi, alibi_slopes
from attention.layer.score_mods import ScoreMod
from attention.layer.testing import padding_mask, reference_attention, sdpa_calls

B, T, D_IN, H = 2, 9, 6, 4


def test_the_papers_slopes() -> None:
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    twelve = alibi_slopes(12)  # 8 of 8 heads' slopes, then every other of 16 heads'
    assert twelve[:8].tolist() == alibi_slopes(8).tolist()
    assert twelve[8:].tolist() == alibi_slopes(16)[0::2][:4].tolist()


def test_it_is_attention_gyms_alibi() -> None:
    s = torch.randn(1, H, T, T, dtype=torch.float64)
    idx = (torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.arange(H).view(1, H, 1, 1),
           torch.arange(T).view(1, 1, T, 1), torch.arange(T).view(1, 1, 1, T))  # fmt: skip
    assert_close(alibi(H)(s, *idx), generate_alibi_bias(H)(s, *idx), atol=1e-12, rtol=0)


@pytest.mark.parametrize("window", [None, 3])
def test_an_alibi_layer_is_fused_and_equals_the_definition(window: int | None) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, 8, T, 0.0, H, num_kv_heads=2, window=window,
                             score_mods=[alibi(H)]).double()  # fmt: skip
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    pad = padding_mask([T, T - 4], T, side="left")
    expected = reference_attention(mha, x, pad)
    with sdpa_calls() as calls:
        fused = mha(x, pad)
    assert calls and all(c.mask_dtype == torch.float64 for c in calls)  # a float mask
    assert_close(fused, expected, atol=1e-10, rtol=0)
    assert_close(mha(x, pad, need_weights=True)[0], expected, atol=1e-10, rtol=0)
    cache, outs = mha.init_cache(B), []
    for part in ((0, 5), (5, 6), (6, 9)):
        chunk = slice(*part)
        outs.append(mha(x[:, chunk], pad[:, chunk], cache=cache))
    assert_close(torch.cat(outs, dim=1), expected, atol=1e-10, rtol=0)


def test_the_additive_form_is_its_function() -> None:
    mod = alibi(H)
    assert isinstance(mod, ScoreMod) and mod.bias is not None
