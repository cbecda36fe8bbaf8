"""Each class keeps the book's signature and creation order, so seeded models print its numbers."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    example_inputs,
)
from tests import expected as E


@pytest.fixture
def batch() -> torch.Tensor:
    inputs = example_inputs()
    return torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)


def test_self_attention_v1_seed_123() -> None:
    torch.manual_seed(123)
    sa_v1 = SelfAttentionV1(d_in=3, d_out=2)
    assert [n for n, _ in sa_v1.named_parameters()] == ["W_query", "W_key", "W_value"]
    assert sa_v1.W_query.shape == (3, 2)
    assert_close(sa_v1(example_inputs()), E.SA_V1_SEED123, atol=E.ATOL, rtol=0)


def test_self_attention_v2_seed_789() -> None:
    torch.manual_seed(789)
    sa_v2 = SelfAttentionV2(d_in=3, d_out=2)
    names = [n for n, _ in sa_v2.named_parameters()]
    assert names == ["W_query.weight", "W_key.weight", "W_value.weight"]
    assert_close(sa_v2(example_inputs()), E.SA_V2_SEED789, atol=E.ATOL, rtol=0)


def test_v1_with_v2_weights_equals_v2() -> None:
    sa_v2 = SelfAttentionV2(3, 2)
    sa_v1 = SelfAttentionV1(3, 2)
    with torch.no_grad():
        sa_v1.W_query.copy_(sa_v2.W_query.weight.T)
        sa_v1.W_key.copy_(sa_v2.W_key.weight.T)
        sa_v1.W_value.copy_(sa_v2.W_value.weight.T)
    x = torch.randn(5, 3)
    assert_close(sa_v1(x), sa_v2(x))


def test_causal_attention_seed_123(batch: torch.Tensor) -> None:
    torch.manual_seed(123)
    ca = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)
    context_vecs = ca(batch)
    assert context_vecs.shape == (2, 6, 2)
    assert_close(context_vecs[0], E.CAUSAL_SEED123, atol=E.ATOL, rtol=0)
    assert_close(context_vecs[1], E.CAUSAL_SEED123, atol=E.ATOL, rtol=0)


def test_wrapper_seed_123(batch: torch.Tensor) -> None:
    torch.manual_seed(123)
    mha = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0.0, num_heads=2)
    context_vecs = mha(batch)
    assert context_vecs.shape == (2, 6, 4)  # d_out * num_heads
    assert_close(context_vecs[0], E.WRAPPER_SEED123, atol=E.ATOL, rtol=0)


def test_multihead_seed_123(batch: torch.Tensor) -> None:
    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 2, context_length=6, dropout=0.0, num_heads=2)
    names = [n for n, _ in mha.named_parameters()]
    assert names == [
        "W_query.weight",
        "W_key.weight",
        "W_value.weight",
        "out_proj.weight",
        "out_proj.bias",
    ]
    assert_close(mha(batch)[0], E.MHA_SEED123, atol=E.ATOL, rtol=0)
    out, _ = mha(batch, need_weights=True)  # the explicit path prints the same numbers
    assert_close(out[0], E.MHA_SEED123, atol=E.ATOL, rtol=0)


def _verdict_embeddings(n: int) -> torch.Tensor:
    torch.manual_seed(123)
    embedding = torch.nn.Embedding(50257, 5)
    with torch.no_grad():
        return embedding(torch.tensor(E.VERDICT_IDS[:n]))


def test_seed_003_token_embeddings_and_causal_attention() -> None:
    inputs = _verdict_embeddings(6)
    assert_close(inputs, E.VERDICT_EMBEDDINGS_6, atol=E.ATOL, rtol=0)
    torch.manual_seed(123)
    ca = CausalAttention(5, 5, context_length=6, dropout=0.0)
    context_vecs = ca(torch.stack((inputs, inputs)))
    assert_close(context_vecs[0], E.VERDICT_CAUSAL, atol=E.ATOL, rtol=0)
    torch.manual_seed(789)
    assert_close(SelfAttentionV2(5, 5)(inputs), E.VERDICT_SA_V2, atol=E.ATOL, rtol=0)


def test_seed_003_multihead_on_two_chunks() -> None:
    inputs = _verdict_embeddings(12)
    batch = torch.stack((inputs[:6], inputs[6:12]))  # (2, 6, 5)
    torch.manual_seed(123)
    mha = MultiHeadAttention(5, 2, context_length=6, dropout=0.0, num_heads=2)
    assert_close(mha(batch), E.VERDICT_MHA, atol=E.ATOL, rtol=0)


BOOK_SIGNATURES = {
    "SelfAttention_v1": ["d_in", "d_out"],
    "SelfAttention_v2": ["d_in", "d_out", "qkv_bias"],
    "CausalAttention": ["d_in", "d_out", "context_length", "dropout", "qkv_bias"],
    "MultiHeadAttentionWrapper": ["d_in", "d_out", "context_length", "dropout", "num_heads",
                                  "qkv_bias"],
    "MultiHeadAttention": ["d_in", "d_out", "context_length", "dropout", "num_heads",
                           "qkv_bias"],
    "GPTDatasetV1": ["txt", "tokenizer", "max_length", "stride"],
    "GPTModel": ["cfg"],
    "TransformerBlock": ["cfg"],
    "FeedForward": ["cfg"],
    "LayerNorm": ["emb_dim"],
    "generate_text_simple": ["model", "idx", "max_new_tokens", "context_size"],
}  # fmt: skip


@pytest.mark.parametrize(("name", "parameters"), BOOK_SIGNATURES.items())
def test_the_books_names_import_from_the_package_with_the_books_parameters(
    name: str, parameters: list[str]
) -> None:
    """`from attention import SelfAttention_v1, ...`: the book's listings run unchanged."""
    import inspect

    import attention

    obj = getattr(attention, name)
    positional = [
        p.name for p in inspect.signature(obj).parameters.values()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]  # fmt: skip
    assert positional == parameters
    assert attention.SelfAttention_v1 is attention.SelfAttentionV1
