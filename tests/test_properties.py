"""Properties that must hold for any input: causality, normalisation, equivariance, padding."""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    explicit_attention,
)

CONTEXT = 12
D_IN, D_OUT, H = 6, 8, 2
SETTINGS = settings(max_examples=25, deadline=None)


def modules() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "causal": CausalAttention(D_IN, D_OUT, CONTEXT, 0.0),
        "wrapper": MultiHeadAttentionWrapper(D_IN, D_OUT // H, CONTEXT, 0.0, H),
        "mha": MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H),
    }


MODULES = modules()


def run(name: str, x: torch.Tensor, need_weights: bool = False) -> torch.Tensor:
    module = MODULES[name]
    if name == "mha" and need_weights:
        return module(x, need_weights=True)[0]
    return module(x)


@SETTINGS
@given(
    name=st.sampled_from(["causal", "wrapper", "mha", "mha-explicit"]),
    num_tokens=st.integers(2, CONTEXT),
    data=st.data(),
)
def test_causality_future_tokens_do_not_change_the_past(
    name: str, num_tokens: int, data: st.DataObject
) -> None:
    t = data.draw(st.integers(0, num_tokens - 2), label="t")
    x = torch.randn(2, num_tokens, D_IN)
    changed = x.clone()
    changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :]) * 10
    explicit = name.endswith("-explicit")
    key = name.removesuffix("-explicit")
    with torch.no_grad():
        before, after = run(key, x, explicit), run(key, changed, explicit)
    assert torch.equal(before[:, : t + 1], after[:, : t + 1])
    assert not torch.equal(before[:, t + 1 :], after[:, t + 1 :])  # the future did change


@SETTINGS
@given(num_tokens=st.integers(1, CONTEXT), causal=st.booleans(), scale=st.sampled_from([1, 1e3]))
def test_weight_rows_sum_to_one(num_tokens: int, causal: bool, scale: float) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=causal)
    x = torch.randn(3, num_tokens, D_IN) * scale
    with torch.no_grad():
        _, weights = mha(x, need_weights=True)
    assert weights.shape == (3, H, num_tokens, num_tokens)
    assert (weights >= 0).all()
    assert_close(weights.sum(-1), torch.ones(3, H, num_tokens))
    if causal:
        assert (weights.triu(diagonal=1) == 0).all()


@SETTINGS
@given(num_tokens=st.integers(2, CONTEXT), need_weights=st.booleans(), seed=st.integers(0, 99))
def test_permutation_equivariance_without_causal_mask(
    num_tokens: int, need_weights: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=False)
    x = torch.randn(2, num_tokens, D_IN)
    perm = torch.randperm(num_tokens)
    with torch.no_grad():
        out = mha(x, need_weights=True)[0] if need_weights else mha(x)
        out_perm = mha(x[:, perm], need_weights=True)[0] if need_weights else mha(x[:, perm])
    assert_close(out_perm, out[:, perm], atol=1e-5, rtol=0)


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, CONTEXT), min_size=1, max_size=4),
    causal=st.booleans(),
    need_weights=st.booleans(),
)
def test_padding_equals_truncation(lengths: list[int], causal: bool, need_weights: bool) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=causal)
    num_tokens = max(lengths)
    x = torch.randn(len(lengths), num_tokens, D_IN)
    padding = torch.arange(num_tokens)[None, :] >= torch.tensor(lengths)[:, None]
    x = x.masked_fill(padding[..., None], 1e4)  # garbage in the padding must not matter
    with torch.no_grad():
        out = mha(x, padding, need_weights=True)[0] if need_weights else mha(x, padding)
        for i, n in enumerate(lengths):
            alone = mha(x[i : i + 1, :n])
            assert_close(out[i : i + 1, :n], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_left_padding_never_gives_nan(need_weights: bool) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=True)
    x = torch.randn(2, 5, D_IN, requires_grad=True)
    padding = torch.tensor([[True, True, False, False, False], [False] * 5])
    out = mha(x, padding, need_weights=True)[0] if need_weights else mha(x, padding)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # Queries 0 and 1 of sequence 0 have no key to attend to (keys 0-1 are padding, later keys
    # are future): their context vector is zero, so the output is out_proj's bias alone.
    assert_close(out[0, :2], mha.out_proj.bias.detach().expand(2, D_OUT))
    # An all-padding sequence too, causal or not.
    for causal in (True, False):
        mha.causal = causal
        out = mha(x, torch.tensor([[True] * 5, [False] * 4 + [True]]))
        assert torch.isfinite(out).all()
        assert_close(out[0], mha.out_proj.bias.detach().expand(5, D_OUT))


def test_dropout_only_in_training() -> None:
    torch.manual_seed(1)
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.5, H)
    no_dropout = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H)
    no_dropout.load_state_dict(mha.state_dict())
    x = torch.randn(2, CONTEXT, D_IN)
    mha.eval()
    assert torch.equal(mha(x), mha(x))
    assert_close(mha(x), no_dropout(x))
    mha.train()
    assert not torch.allclose(mha(x), mha(x))
    _, weights = mha(x, need_weights=True)
    assert (weights == 0).any()
    # Kept weights are scaled by 1/(1-p): compare with the eval-mode weights where kept.
    mha.eval()
    _, eval_weights = mha(x, need_weights=True)
    kept = weights != 0
    assert_close(weights[kept], eval_weights[kept] / (1 - 0.5))


def test_dropout_in_causal_attention_only_in_training() -> None:
    ca = CausalAttention(D_IN, D_OUT, CONTEXT, 0.5)
    x = torch.randn(2, CONTEXT, D_IN)
    ca.eval()
    assert torch.equal(ca(x), ca(x))
    ca.train()
    assert not torch.allclose(ca(x), ca(x))


def test_mask_buffer_follows_to_and_round_trips_through_state_dict() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H)
    assert mha.mask.dtype == torch.bool and mha.mask.shape == (CONTEXT, CONTEXT)
    assert "mask" in mha.state_dict()
    assert mha.to(torch.float64).mask.dtype == torch.bool  # a dtype cast leaves the mask alone
    assert MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).to("meta").mask.device.type == "meta"
    mha = mha.float()
    buffer = io.BytesIO()
    torch.save(mha.state_dict(), buffer)
    buffer.seek(0)
    fresh = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H)
    fresh.load_state_dict(torch.load(buffer))
    x = torch.randn(2, 7, D_IN)
    assert torch.equal(fresh(x), mha(x))
    assert torch.equal(fresh.mask, mha.mask)


def test_mask_buffer_moves_with_the_module(device: torch.device) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).to(device)
    assert mha.mask.device.type == device.type
    out, _ = mha(torch.randn(1, 4, D_IN, device=device), need_weights=True)
    assert out.device.type == device.type


@pytest.mark.parametrize("need_weights", [False, True])
def test_huge_inputs_stay_finite(need_weights: bool) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H)
    x = torch.randn(2, CONTEXT, D_IN) * 1e6  # scores ~1e12: a naive softmax would overflow
    with torch.no_grad():
        out = mha(x, need_weights=True)[0] if need_weights else mha(x)
    assert torch.isfinite(out).all()


def test_explicit_attention_rows_with_everything_masked_are_zero() -> None:
    q = k = v = torch.randn(4, 3)
    mask = torch.tensor([[True] * 4, [False, True, True, True], [False] * 4, [True] * 4])
    z, w = explicit_attention(q, k, v, mask)
    assert torch.equal(w[0], torch.zeros(4)) and torch.equal(z[0], torch.zeros(3))
    assert torch.equal(w[1], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert_close(w[2].sum(), torch.tensor(1.0))
