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
from tests.book import BookMultiHeadAttention

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
    left=st.booleans(),
    causal=st.booleans(),
    need_weights=st.booleans(),
)
def test_padding_equals_truncation(
    lengths: list[int], left: bool, causal: bool, need_weights: bool
) -> None:
    """Each sequence's real tokens get what they get alone; padded ones get out_proj's bias."""
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=causal)
    num_tokens = max(lengths)
    x = torch.randn(len(lengths), num_tokens, D_IN)
    n_real = torch.tensor(lengths)[:, None]  # (b, 1)
    positions = torch.arange(num_tokens)[None, :]  # (1, T)
    padding = positions < num_tokens - n_real if left else positions >= n_real  # (b, T)
    x = x.masked_fill(padding[..., None], 1e4)  # garbage in the padding must not matter
    with torch.no_grad():
        out = mha(x, padding, need_weights=True)[0] if need_weights else mha(x, padding)
        for i, n in enumerate(lengths):
            real = slice(num_tokens - n, None) if left else slice(None, n)
            alone = mha(x[i : i + 1, real])  # (1, n, d_out)
            assert_close(out[i : i + 1, real], alone, atol=1e-5, rtol=0)
    bias = mha.out_proj.bias.detach()
    assert_close(out[padding], bias.expand(int(padding.sum()), D_OUT))


@pytest.mark.parametrize("need_weights", [False, True])
def test_left_padding_and_all_padding_never_give_nan(need_weights: bool) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=True)
    x = torch.randn(2, 5, D_IN, requires_grad=True)
    padding = torch.tensor([[True, True, False, False, False], [False] * 5])
    out = mha(x, padding, need_weights=True)[0] if need_weights else mha(x, padding)
    out.sum().backward()
    assert torch.isfinite(out).all()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # Queries 0 and 1 of sequence 0 are padding: they attend to nothing (they would have no
    # key under the causal mask anyway), so their output is out_proj's bias alone.
    assert_close(out[0, :2], mha.out_proj.bias.detach().expand(2, D_OUT))
    # An all-padding sequence too, causal or not.
    encoder = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=False)
    encoder.load_state_dict(mha.state_dict())
    for module in (mha, encoder):  # causal or not
        all_padding = torch.tensor([[True] * 5, [False] * 4 + [True]])
        out = (
            module(x, all_padding, need_weights=True)[0] if need_weights else module(x, all_padding)
        )
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


def test_no_state_grows_with_context_length() -> None:
    """No (context_length, context_length) mask: the state is the parameters, at any length."""
    short = MultiHeadAttention(D_IN, D_OUT, 8, 0.0, H)
    long = MultiHeadAttention(D_IN, D_OUT, 131_072, 0.0, H)  # a mask would be 16 GiB
    assert list(long.buffers()) == []
    assert long.state_dict().keys() == short.state_dict().keys()
    assert [n for n in long.state_dict()] == [n for n, _ in long.named_parameters()]


def test_state_dict_round_trip_through_a_file() -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H)
    buffer = io.BytesIO()
    torch.save(mha.state_dict(), buffer)
    buffer.seek(0)
    fresh = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H)
    fresh.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    x = torch.randn(2, 7, D_IN)
    assert torch.equal(fresh(x), mha(x))  # the same parameters, the same computation


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool])
def test_book_checkpoints_load_strictly_and_give_the_books_outputs(
    mask_dtype: torch.dtype,
) -> None:
    """The book's state_dict holds a `mask` buffer (float in the book, bool later): it loads
    with strict=True and every path computes what the book's module computes."""
    torch.manual_seed(123)
    book = BookMultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, qkv_bias=True,
                                  mask_dtype=mask_dtype)  # fmt: skip
    state = book.state_dict()
    assert state["mask"].dtype == mask_dtype
    ours = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, qkv_bias=True)
    ours.load_state_dict(state, strict=True)
    assert "mask" in state  # the caller's dict is left as it was
    x = torch.randn(2, CONTEXT, D_IN)
    padding = torch.arange(CONTEXT)[None, :] >= torch.tensor([CONTEXT, 5])[:, None]  # (2, T)
    with torch.no_grad():
        expected = book(x)  # (2, T, d_out)
        assert_close(ours(x), expected, atol=1e-5, rtol=0)  # fused
        assert_close(ours(x, need_weights=True)[0], expected, atol=1e-5, rtol=0)  # explicit
        padded = ours(x, padding)  # padded: its real tokens see what the book's prefix sees
        assert_close(padded[0], expected[0], atol=1e-5, rtol=0)
        assert_close(padded[1, :5], book(x[1:, :5])[0], atol=1e-5, rtol=0)


def test_a_mask_that_is_not_causal_is_refused_not_ignored() -> None:
    state = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).state_dict()
    state["mask"] = torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).tril()  # not the book's
    with pytest.raises(ValueError, match=r"'mask' is not the causal mask triu"):
        MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).load_state_dict(state)
    state["mask"] = torch.ones(CONTEXT, CONTEXT - 1)
    with pytest.raises(
        ValueError, match=r"'mask' must be a square \(n, n\) tensor, got \(12, 11\)"
    ):
        MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).load_state_dict(state)
    state["mask"] = torch.ones(CONTEXT, CONTEXT).triu(1).tolist()  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"'mask' must be a square \(n, n\) tensor, got list"):
        MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).load_state_dict(state)


def test_a_causal_book_checkpoint_is_refused_by_a_non_causal_module() -> None:
    """The mask says the checkpoint's model was causal: loading it silently into an encoder
    would compute something else."""
    state = BookMultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).state_dict()
    encoder = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H, causal=False)
    with pytest.raises(ValueError, match=r"causal mask, but this module has causal=False"):
        encoder.load_state_dict(state)
    del state["mask"]  # reusing the weights without the mask is a choice, made explicitly
    encoder.load_state_dict(state, strict=True)


def test_the_module_moves_to_the_device(device: torch.device) -> None:
    mha = MultiHeadAttention(D_IN, D_OUT, CONTEXT, 0.0, H).to(device)
    x = torch.randn(2, 4, D_IN, device=device)
    padding = torch.tensor([[True, False, False, False], [False] * 4], device=device)
    for out in (mha(x), mha(x, padding), mha(x, need_weights=True)[0]):
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
    mask = torch.tensor([[False] * 4, [True, False, False, False], [True] * 4, [False] * 4])
    z, w = explicit_attention(q, k, v, mask)
    assert torch.equal(w[0], torch.zeros(4)) and torch.equal(z[0], torch.zeros(3))
    assert torch.equal(w[1], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert_close(w[2].sum(), torch.tensor(1.0))


def test_float16_explicit_path_stays_finite_where_raw_scores_overflow() -> None:
    """Q K^T beyond float16's 65504 is finite once scaled by 1/sqrt(d_k): the explicit path
    scales Q first (as the fused kernels do), so it stays finite where the kernel does."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 64, 16, 0.0, num_heads=1)
    with torch.no_grad():
        mha.W_query.weight.mul_(100)
        mha.W_key.weight.mul_(100)
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        expected, expected_weights = mha(x, need_weights=True)  # float32 reference
        half = mha.half()
        q, k = half.W_query(x.half()), half.W_key(x.half())
        assert torch.isinf(q @ k.transpose(-2, -1)).any()  # the unscaled scores overflow
        fused = half(x.half())
        explicit, weights = half(x.half(), need_weights=True)
    assert torch.isfinite(fused).all() and torch.isfinite(explicit).all()
    assert_close(explicit.float(), expected, atol=2e-2, rtol=0)
    assert_close(fused.float(), expected, atol=2e-2, rtol=0)
    assert_close(weights.float(), expected_weights, atol=2e-2, rtol=0)
