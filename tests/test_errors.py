"""Bad input gets a ValueError that names the expected and the actual."""

from __future__ import annotations

import re

import pytest
import torch

from attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    attention_scores,
)


def test_d_out_not_divisible_by_num_heads() -> None:
    with pytest.raises(ValueError, match=r"d_out must be divisible by num_heads.*d_out=10.*3"):
        MultiHeadAttention(4, 10, context_length=8, dropout=0.0, num_heads=3)


@pytest.mark.parametrize(
    "module",
    [
        CausalAttention(4, 4, context_length=6, dropout=0.0),
        MultiHeadAttentionWrapper(4, 2, context_length=6, dropout=0.0, num_heads=2),
        MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2),
    ],
    ids=type,
)
def test_sequence_longer_than_context_length(module: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match=r"7 tokens is longer than context_length=6"):
        module(torch.zeros(1, 7, 4))


@pytest.mark.parametrize(
    "module",
    [
        CausalAttention(4, 4, context_length=6, dropout=0.0),
        MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2),
    ],
    ids=type,
)
@pytest.mark.parametrize("shape", [(6, 4), (4,), (1, 1, 6, 4)])
def test_wrong_rank(module: torch.nn.Module, shape: tuple[int, ...]) -> None:
    expected = re.escape("(batch, num_tokens, d_in) with d_in=4")
    with pytest.raises(ValueError, match=expected + r".*" + re.escape(str(shape))):
        module(torch.zeros(shape))


@pytest.mark.parametrize("module", [SelfAttentionV1(4, 2), SelfAttentionV2(4, 2)], ids=type)
def test_unbatched_stages_reject_wrong_rank_and_width(module: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match=r"\(num_tokens, d_in\) with d_in=4.*1-d"):
        module(torch.zeros(4))
    with pytest.raises(ValueError, match=r"d_in=4, got last dimension 5"):
        module(torch.zeros(6, 5))


@pytest.mark.parametrize(
    "module",
    [
        CausalAttention(4, 4, context_length=6, dropout=0.0),
        MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2),
    ],
    ids=type,
)
def test_wrong_last_dimension(module: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match=r"d_in=4, got last dimension 3 \(shape \(2, 5, 3\)\)"):
        module(torch.zeros(2, 5, 3))


@pytest.mark.parametrize("shape", [(2, 4), (1, 5), (2, 1, 5)])
def test_padding_mask_of_the_wrong_shape(shape: tuple[int, ...]) -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2)
    message = re.escape(f"(batch, num_tokens) = (2, 5), got {shape}")
    with pytest.raises(ValueError, match=message):
        mha(torch.zeros(2, 5, 4), torch.zeros(shape, dtype=torch.bool))


def test_padding_mask_of_the_wrong_dtype() -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2)
    with pytest.raises(ValueError, match=r"bool tensor.*got dtype torch.float32"):
        mha(torch.zeros(2, 5, 4), torch.zeros(2, 5))


def test_queries_and_keys_must_share_d_k() -> None:
    with pytest.raises(ValueError, match=re.escape("got queries (6, 24) and keys (6, 28)")):
        attention_scores(torch.zeros(6, 24), torch.zeros(6, 28))
