"""QK-norm: queries and keys divided by their root mean square, per head or over the projection."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attention.layer.multihead import MultiHeadAttention


def rms_normed(x: Tensor, gain: Tensor, eps: float) -> Tensor:
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * gain


@pytest.mark.parametrize("kind", ["head", "projection"])
def test_queries_and_keys_are_normed_before_rope(kind: str) -> None:
    torch.manual_seed(0)
    att = MultiHeadAttention(32, 32, 16, 0.0, num_heads=4, num_kv_heads=2, rope=True,
                             qk_norm=kind, qk_norm_eps=1e-5).double()  # fmt: skip
    assert att.q_norm is not None and att.k_norm is not None
    with torch.no_grad():
        att.q_norm.weight.normal_()
        att.k_norm.weight.normal_()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    q, k, _ = att.project(x)  # (b, h, T, d_h) rotated
    plain = MultiHeadAttention(32, 32, 16, 0.0, num_heads=4, num_kv_heads=2).double()
    plain.load_state_dict(att.state_dict(), strict=False)
    q0, k0, _ = plain.project(x)  # (b, h, T, d_h), neither normed nor rotated
    if kind == "head":
        want_q, want_k = (rms_normed(t, n.weight, 1e-5) for t, n in ((q0, att.q_norm),
                                                                      (k0, att.k_norm)))  # fmt: skip
    else:  # the whole (h d_h) of a token: merge heads, norm, split again
        merge = lambda t: t.transpose(1, 2).flatten(2)  # noqa: E731
        split = lambda t, h: t.unflatten(2, (h, 8)).transpose(1, 2)  # noqa: E731
        want_q = split(rms_normed(merge(q0), att.q_norm.weight, 1e-5), 4)
        want_k = split(rms_normed(merge(k0), att.k_norm.weight, 1e-5), 2)
    assert att.rotary is not None
    want_q, want_k = att.rotary.rotate(want_q, 0), att.rotary.rotate(want_k, 0)
    torch.testing.assert_close(q, want_q, rtol=0, atol=1e-12)
    torch.testing.assert_close(k, want_k, rtol=0, atol=1e-12)
    assert att.spec.qk_norm == kind and f"qk_norm={kind!r}" in repr(att)


def test_the_cache_holds_normed_keys() -> None:
    torch.manual_seed(1)
    att = MultiHeadAttention(32, 32, 16, 0.0, num_heads=4, rope=True, qk_norm="head").eval()
    x = torch.randn(1, 6, 32)
    cache = att.init_cache(1)
    steps = torch.cat([att(x[:, :4], cache=cache), att(x[:, 4:5], cache=cache),
                       att(x[:, 5:], cache=cache)], dim=1)  # fmt: skip
    torch.testing.assert_close(steps, att(x), rtol=0, atol=1e-5)


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="qk_norm must be None, 'head' or 'projection', got 'x'"):
        MultiHeadAttention(32, 32, 16, 0.0, num_heads=4, qk_norm="x")  # type: ignore[arg-type]
