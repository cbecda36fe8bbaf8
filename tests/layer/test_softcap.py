"""Soft-capping, one function: attention-gym's modifier, the explicit path, cached runs."""

from __future__ import annotations

import math

import pytest
import torch
from attn_gym.mods import generate_tanh_softcap
from torch.testing import assert_close

from attention import MultiHeadAttention, softcap
from attention.layer.fused import plan
from attention.layer.masks import causal
from attention.layer.testing import padding_mask, reference_attention, sdpa_calls

B, T, D_IN, H = 2, 9, 6, 2


def test_it_is_attention_gyms_soft_cap() -> None:
    s = torch.randn(1, H, T, T, dtype=torch.float64) * 100
    idx = torch.zeros(4, dtype=torch.long)
    assert_close(softcap(30.0)(s, *idx), generate_tanh_softcap(30)(s, *idx), atol=1e-12, rtol=0)
    assert bool((softcap(30.0)(s, *idx).abs() < 30).all())


def test_a_capped_layer_runs_the_explicit_path_and_equals_the_definition() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, 8, T, 0.0, H, rope=True, score_mods=[softcap(0.5)]).double()
    x = torch.randn(B, T, D_IN, dtype=torch.float64) * 10  # scores far past the cap
    pad = padding_mask([T, T - 2], T)
    expected = reference_attention(mha, x, pad)
    with sdpa_calls() as calls:
        out = mha(x, pad)
    assert not calls and plan(causal(), T, T, score_mods=mha.score_mods).kind == "explicit"
    assert_close(out, expected, atol=1e-10, rtol=0)
    cache = mha.init_cache(B)
    chunked = torch.cat(
        [mha(x[:, i : i + 3], pad[:, i : i + 3], cache=cache) for i in (0, 3, 6)], 1
    )
    assert_close(chunked, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("cap", [0, -1.0, math.inf, math.nan, True, "50"])
def test_a_bad_cap_is_named(cap: object) -> None:
    with pytest.raises(ValueError, match=r"softcap: cap must be a finite number > 0"):
        softcap(cap)  # type: ignore[arg-type]
