"""Every faster path equals the explicit one, and the production module equals PyTorch's own.

All of these run on each available device (see the `device` fixture in conftest.py), in fp32,
on inputs where d_in != d_out unless PyTorch's module requires otherwise. Padding comes in
every layout the fused path treats differently: right (real tokens, then padding), left and
middle (one run of real tokens elsewhere, rotated to the front first), and holes (padding
between real tokens).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention import MultiHeadAttention, MultiHeadAttentionWrapper, causal_mask
from attention.layer.testing import padding_mask, sdpa_calls, to_torch_mha

ATOL = 1e-5

B, T, D_IN, D_OUT, H = 3, 10, 12, 16, 4
PADDINGS = ["none", "right", "left", "middle", "holes"]


def padding(kind: str, num_tokens: int = T, device: torch.device | str = "cpu") -> torch.Tensor:
    """`(3, num_tokens)` bool, True = padding: one full row, one a little padded, one mostly."""
    lengths = [num_tokens, num_tokens - 3, 2]
    if kind in ("right", "left"):
        return padding_mask(lengths, num_tokens, side=kind, device=device)  # type: ignore[arg-type]
    positions = torch.arange(num_tokens, device=device)[None, :]  # (1, T)
    if kind == "middle":  # a run of real tokens starting at position 1 (or 0)
        start = torch.tensor([0, 1, 1], device=device)[:, None]
        n = torch.tensor(lengths, device=device)[:, None]
        return (positions < start) | (positions >= start + n)
    if kind == "holes":
        return (positions % 3 == 1) & (torch.arange(3, device=device)[:, None] > 0)
    raise ValueError(kind)


def masks(kind: str, device: torch.device) -> torch.Tensor | None:
    return None if kind == "none" else padding(kind, T, device)


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


def outputs_and_gradients(
    mha: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor | None, need_weights: bool
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Output, input gradient and every parameter gradient of one call and a fixed loss."""
    mha.zero_grad()
    xi = x.clone().requires_grad_(True)
    out = mha(xi, mask, need_weights=True)[0] if need_weights else mha(xi, mask)
    out.square().sum().backward()
    assert xi.grad is not None
    return out, xi.grad, [p.grad.clone() for p in mha.parameters() if p.grad is not None]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", PADDINGS)
def test_sdpa_path_equals_explicit_path_outputs_and_gradients(
    device: torch.device, causal: bool, kind: str
) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, qkv_bias=True, causal=causal).to(device)
    x = torch.randn(B, T, D_IN, device=device)
    mask = masks(kind, device)
    out_fused, dx_fused, dp_fused = outputs_and_gradients(mha, x, mask, need_weights=False)
    out_explicit, dx_explicit, dp_explicit = outputs_and_gradients(mha, x, mask, True)
    assert_close(out_fused, out_explicit, atol=ATOL, rtol=0)
    assert_close(dx_fused, dx_explicit, atol=ATOL, rtol=0)
    assert len(dp_fused) == len(dp_explicit) == 8  # 3 x (weight, bias) + out_proj
    for g_fused, g_explicit in zip(dp_fused, dp_explicit, strict=True):
        assert_close(g_fused, g_explicit, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", PADDINGS)
def test_equals_torch_multihead_attention(
    device: torch.device, qkv_bias: bool, causal: bool, kind: str
) -> None:
    """Equal at every real position; at padded ones ours is defined (out_proj's bias, zero
    weights) where PyTorch's attends to the real keys, or returns NaN if there are none."""
    d = 16  # nn.MultiheadAttention projects queries from embed_dim, so d_in == d_out here
    mha = MultiHeadAttention(d, d, T, 0.0, H, qkv_bias=qkv_bias, causal=causal).to(device).eval()
    ref = to_torch_mha(mha)
    x = torch.randn(B, T, d, device=device)
    key_padding_mask = masks(kind, device)
    expected, ref_weights = ref(
        x,
        x,
        x,
        key_padding_mask=key_padding_mask,
        attn_mask=~causal_mask(T, device=device) if causal else None,  # True = hidden there
        need_weights=True,
        average_attn_weights=False,
    )
    real = torch.ones(B, T, dtype=torch.bool, device=device)
    if key_padding_mask is not None:
        real = ~key_padding_mask
    fused = mha(x, key_padding_mask)
    out, weights = mha(x, key_padding_mask, need_weights=True)
    for ours in (fused, out):
        assert_close(ours[real], expected[real], atol=ATOL, rtol=0)
        assert_close(ours[~real], mha.out_proj.bias.detach().expand_as(ours[~real]))
    real_rows = real[:, None, :].expand(B, H, T)  # (B, H, T): the rows of real queries
    assert_close(weights[real_rows], ref_weights[real_rows], atol=ATOL, rtol=0)
    assert (weights[~real_rows] == 0).all()


@pytest.mark.parametrize(
    ("causal", "kind", "expected"),
    [
        (True, "none", "is_causal, no mask"),
        (False, "none", "no mask"),
        (True, "right", "is_causal, no mask"),  # the causal mask already hides right padding
        (False, "right", "bool (b, 1, 1, T)"),
        (False, "left", "bool (b, 1, 1, T)"),
        (True, "left", "is_causal, no mask"),  # each row rolled into right padding first
        (True, "middle", "is_causal, no mask"),
        (True, "holes", "is_causal, no mask"),  # holes too: real tokens moved first
    ],
)
def test_what_reaches_the_fused_kernel(causal: bool, kind: str, expected: str) -> None:
    """No T x T mask for padding anywhere: each row's real tokens are moved to its front
    first; a non-causal layer gets one row of keys per sequence; never a float one."""
    mha = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, causal=causal)
    with sdpa_calls() as calls:
        mha(torch.randn(B, T, D_IN), masks(kind, torch.device("cpu")))
    seen = []
    for call in calls:
        if call.mask_shape is None:
            seen.append("is_causal, no mask" if call.is_causal else "no mask")
        else:
            kind = "bool" if call.mask_dtype == torch.bool else "float"
            seen.append(f"{kind} {'(b, 1, 1, T)' if call.mask_shape[-2] == 1 else '(b, 1, T, T)'}")
    assert seen == [expected]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["right", "left", "middle", "holes"])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -float("inf"), 1e30])
def test_padded_values_do_not_matter_at_all(
    device: torch.device, causal: bool, kind: str, need_weights: bool, garbage: float
) -> None:
    """NaN, inf or huge values at padded positions change no output and no gradient, where
    `nn.MultiheadAttention` turns every output into NaN."""
    mha = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, qkv_bias=True, causal=causal).to(device)
    mask = padding(kind, T, device)
    clean = torch.randn(B, T, D_IN, device=device).masked_fill(mask[..., None], 0.0)
    dirty = clean.masked_fill(mask[..., None], garbage)
    out_clean, dx_clean, dp_clean = outputs_and_gradients(mha, clean, mask, need_weights)
    out_dirty, dx_dirty, dp_dirty = outputs_and_gradients(mha, dirty, mask, need_weights)
    assert torch.isfinite(out_dirty).all() and torch.isfinite(dx_dirty).all()
    # The padded inputs are zeroed before anything reads them: the same computation follows.
    assert torch.equal(out_dirty, out_clean) and torch.equal(dx_dirty, dx_clean)
    assert (dx_dirty[mask] == 0).all()
    for g_dirty, g_clean in zip(dp_dirty, dp_clean, strict=True):
        assert torch.equal(g_dirty, g_clean)
