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


def test_the_planner_knows_it_is_not_causal_and_a_short_prefill_is_refused() -> None:
    assert plan(prefix_lm(4), 64, 64).kind == "mask"
    assert prefix_lm(4).bounds.prefix == 4 and not prefix_lm(4).bounds.causal
    mha = MultiHeadAttention(D_IN, 8, 32, 0.0, H, mask=prefix_lm(4))
    with pytest.raises(ValueError, match=r"the first call with a cache must hold that whole"):
        mha(torch.randn(1, 2, D_IN), cache=mha.init_cache(1))
    short = padding_mask([6, 3], 6, side="left")  # row 1 holds 3 tokens of a prefix of 4
    with pytest.raises(ValueError, match=r"row 1 lacks positions \[3\]"):
        mha(torch.randn(2, 6, D_IN), short, cache=mha.init_cache(2))
    everything_ = MultiHeadAttention(D_IN, 8, 32, 0.0, H, causal=False, mask=Mask(
        lambda b, h, q_idx, kv_idx: q_idx >= 0))  # fmt: skip
    with pytest.raises(ValueError, match=r"cache needs a mask that hides the future"):
        everything_(torch.randn(1, 2, D_IN), cache=everything_.init_cache(1))


@pytest.mark.parametrize("padded", [False, True])
def test_a_prefill_then_twenty_cached_tokens_equal_uncached(padded: bool) -> None:
    """PaliGemma's generation: the prompt reads itself both ways, then cached causal decoding."""
    torch.manual_seed(0)
    prompt, n = 7, 5
    mha = MultiHeadAttention(D_IN, 8, 32, 0.0, H, num_kv_heads=1, rope=True,
                             mask=prefix_lm(n)).double().eval()  # fmt: skip
    x = torch.randn(B, prompt + 20, D_IN, dtype=torch.float64)
    pad = padding_mask([prompt, prompt - 2], prompt, side="left") if padded else None
    whole = None if pad is None else torch.cat((pad, torch.zeros(B, 20, dtype=torch.bool)), 1)
    expected = mha(x, whole)
    cache = mha.init_cache(B)
    with torch.no_grad():
        outs = [mha(x[:, :prompt], pad, cache=cache)]
        outs += [mha(x[:, t : t + 1], cache=cache) for t in range(prompt, prompt + 20)]
    assert_close(torch.cat(outs, dim=1), expected, atol=1e-10, rtol=0)
    assert_close(expected, reference_attention(mha, x, whole), atol=1e-10, rtol=0)


def test_gpt_generation_with_a_prefix_lm_equals_uncached_greedy() -> None:
    from attention.model.generation import generate
    from attention.model.gpt import GPTModel

    torch.manual_seed(0)
    cfg = {"vocab_size": 40, "context_length": 32, "emb_dim": 16, "n_heads": 2, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
    model = GPTModel(cfg).double().eval()
    for block in model.trf_blocks:
        block.att.replace(mask=prefix_lm(6))
    ids = torch.randint(0, 40, (2, 6))
    cached = generate(model, ids, max_new_tokens=12)
    greedy = ids
    with torch.no_grad():
        for _ in range(12):  # uncached: the whole sequence again at every step
            greedy = torch.cat((greedy, model(greedy)[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(cached, greedy)
