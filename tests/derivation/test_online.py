"""attention.derivation.core.online_attention: the online softmax of the fused kernels, block by block."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention.derivation.core import causal_mask, explicit_attention, online_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [1, 3, 7, 10, 64])
def test_equals_explicit_attention_for_every_block_size(causal: bool, block_size: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 3, 10, 4, generator=gen).unbind(0)  # (b, h, T, d_k)
    v = torch.randn(2, 3, 10, 5, generator=gen)  # d_v != d_k
    expected, _ = explicit_attention(q, k, v, causal_mask(10) if causal else None)
    out = online_attention(q, k, v, block_size=block_size, causal=causal)
    assert out.shape == (2, 3, 10, 5)
    assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_more_keys_than_queries_and_a_growing_maximum() -> None:
    """The largest score comes in the last block: every earlier partial sum is rescaled."""
    q = torch.ones(1, 2, 1)  # (b, n_q, d_k = 1): s_j = k_j
    k = torch.tensor([[[0.0], [1.0], [2.0], [500.0]]])  # (1, 4, 1), 500 would overflow exp
    v = torch.arange(4.0).reshape(1, 4, 1)  # (1, 4, 1)
    out = online_attention(q, k, v, block_size=2)
    assert torch.isfinite(out).all()
    assert_close(out, torch.full((1, 2, 1), 3.0))  # all the weight on the last key


def test_the_final_division_normalises() -> None:
    """Identical values: any weights that sum to 1 give them back exactly."""
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 6, 8, generator=gen).mul(10).unbind(0)  # spread-out scores
    v = torch.full((6, 3), 2.5)
    assert_close(online_attention(q, k, v, block_size=4), v)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"block_size": 0}, ValueError, "block_size must be >= 1, got 0"),
        ({"block_size": 2.0}, TypeError, "block_size must be an int, got 2.0"),
        ({"block_size": 2, "causal": "yes"}, TypeError, "causal must be True or False"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], error: type, message: str) -> None:
    q = torch.zeros(3, 2)
    with pytest.raises(error, match=message):
        online_attention(q, q, q, **kwargs)  # type: ignore[arg-type]


def test_bad_tensors_are_named() -> None:
    q = torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"causal needs num_queries == num_keys, got 3 and 5"):
        online_attention(q, torch.zeros(5, 2), torch.zeros(5, 2), block_size=2, causal=True)
    with pytest.raises(
        ValueError, match=r"at least one key: got queries \(3, 2\) and keys \(0, 2\)"
    ):
        online_attention(q, torch.zeros(0, 2), torch.zeros(0, 2), block_size=2)
    with pytest.raises(ValueError, match="values must be"):
        online_attention(q, q, torch.zeros(4, 2), block_size=2)
    with pytest.raises(TypeError, match="queries must be a floating-point tensor"):
        online_attention(q.long(), q.long(), q.long(), block_size=2)
