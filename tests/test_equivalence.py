"""Every faster path equals the explicit one, and the production module equals PyTorch's own.

All of these run on each available device (see the `device` fixture in conftest.py), in fp32,
on inputs where d_in != d_out unless PyTorch's module requires otherwise.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attention import MultiHeadAttention, MultiHeadAttentionWrapper, causal_mask

ATOL = 1e-5

B, T, D_IN, D_OUT, H = 3, 10, 12, 16, 4


def right_padding(lengths: list[int], num_tokens: int, device: torch.device) -> torch.Tensor:
    """`(batch, num_tokens)` bool mask, True after each sequence's length."""
    positions = torch.arange(num_tokens, device=device)
    return positions[None, :] >= torch.tensor(lengths, device=device)[:, None]


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_wrapper_equals_fused_with_the_same_per_head_weights(
    device: torch.device, qkv_bias: bool
) -> None:
    wrapper = MultiHeadAttentionWrapper(
        D_IN, D_OUT // H, context_length=T, dropout=0.0, num_heads=H, qkv_bias=qkv_bias
    ).to(device)
    fused = MultiHeadAttention.from_wrapper(wrapper)
    assert fused.d_out == D_OUT and fused.num_heads == H
    x = torch.randn(B, T, D_IN, device=device)
    expected = wrapper(x)  # (B, T, d_out * num_heads)
    assert_close(fused(x), expected, atol=ATOL, rtol=0)
    out, weights = fused(x, need_weights=True)
    assert_close(out, expected, atol=ATOL, rtol=0)
    assert weights.shape == (B, H, T, T)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_path_equals_explicit_path_outputs_and_gradients(
    device: torch.device, causal: bool, padded: bool
) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, qkv_bias=True, causal=causal).to(device)
    x = torch.randn(B, T, D_IN, device=device)
    mask = right_padding([T, 7, 3], T, device) if padded else None

    def run(need_weights: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        mha.zero_grad()
        xi = x.clone().requires_grad_(True)
        out = mha(xi, mask, need_weights=True)[0] if need_weights else mha(xi, mask)
        out.square().sum().backward()
        assert xi.grad is not None
        return out, xi.grad, [p.grad.clone() for p in mha.parameters() if p.grad is not None]

    out_fused, dx_fused, dp_fused = run(need_weights=False)
    out_explicit, dx_explicit, dp_explicit = run(need_weights=True)
    assert_close(out_fused, out_explicit, atol=ATOL, rtol=0)
    assert_close(dx_fused, dx_explicit, atol=ATOL, rtol=0)
    assert len(dp_fused) == len(dp_explicit) == 8  # 3 x (weight, bias) + out_proj
    for g_fused, g_explicit in zip(dp_fused, dp_explicit, strict=True):
        assert_close(g_fused, g_explicit, atol=ATOL, rtol=1e-5)


def torch_mha_like(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """`nn.MultiheadAttention` with our weights copied in (needs d_in == d_out)."""
    ref = nn.MultiheadAttention(
        mha.d_out, mha.num_heads, dropout=0.0, bias=True, batch_first=True
    ).to(mha.out_proj.weight.device)
    with torch.no_grad():
        ref.in_proj_weight.copy_(
            torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight], dim=0)
        )
        biases = [m.bias for m in (mha.W_query, mha.W_key, mha.W_value)]
        ref.in_proj_bias.copy_(
            torch.cat(biases) if biases[0] is not None else torch.zeros(3 * mha.d_out)
        )
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        ref.out_proj.bias.copy_(mha.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_equals_torch_multihead_attention(
    device: torch.device, qkv_bias: bool, causal: bool, padded: bool
) -> None:
    d = 16  # nn.MultiheadAttention projects queries from embed_dim, so d_in == d_out here
    mha = MultiHeadAttention(d, d, T, 0.0, H, qkv_bias=qkv_bias, causal=causal).to(device).eval()
    ref = torch_mha_like(mha)
    x = torch.randn(B, T, d, device=device)
    key_padding_mask = right_padding([T, 6, 2], T, device) if padded else None
    attn_mask = causal_mask(T, device=device) if causal else None
    expected, ref_weights = ref(
        x,
        x,
        x,
        key_padding_mask=key_padding_mask,
        attn_mask=attn_mask,
        need_weights=True,
        average_attn_weights=False,
    )
    assert_close(mha(x, key_padding_mask), expected, atol=ATOL, rtol=0)
    out, weights = mha(x, key_padding_mask, need_weights=True)
    assert_close(out, expected, atol=ATOL, rtol=0)
    assert_close(weights, ref_weights, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("causal", "padded", "expected"),
    [
        (True, False, "is_causal, no mask"),
        (False, False, "no mask"),
        (False, True, "bool (b, 1, 1, T)"),
        (True, True, "float (b, 1, T, T)"),
    ],
)
def test_what_reaches_the_fused_kernel(
    monkeypatch: pytest.MonkeyPatch, causal: bool, padded: bool, expected: str
) -> None:
    """No T x T mask unless causal attention over a padded batch needs one (and then one)."""
    calls: list[str] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args: torch.Tensor, attn_mask: torch.Tensor | None = None, **kwargs: object):  # type: ignore[no-untyped-def]
        if attn_mask is None:
            calls.append("is_causal, no mask" if kwargs.get("is_causal") else "no mask")
        else:
            kind = "bool" if attn_mask.dtype == torch.bool else "float"
            dims = "(b, 1, 1, T)" if attn_mask.shape[-2] == 1 else "(b, 1, T, T)"
            calls.append(f"{kind} {dims}")
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    mha = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, causal=causal)
    x = torch.randn(B, T, D_IN)
    mask = right_padding([T, 7, 3], T, torch.device("cpu")) if padded else None
    mha(x, mask)
    assert calls == [expected]
