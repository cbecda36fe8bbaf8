"""Bad input gets a ValueError or TypeError that names the argument, the expected and the actual."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
import torch
from torch.testing import assert_close

from attention import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    attention_scores,
    attn_scores_for_query,
    attn_scores_loop,
    attn_scores_matrix,
    causal_mask,
    context_vector,
    context_vectors,
    example_inputs,
    explicit_attention,
    simplified_self_attention,
    softmax_stable,
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
    with pytest.raises(TypeError, match=r"bool tensor.*got dtype torch.float32"):
        mha(torch.zeros(2, 5, 4), torch.zeros(2, 5))


def test_queries_and_keys_must_share_d_k() -> None:
    with pytest.raises(ValueError, match=re.escape("got queries (6, 24) and keys (6, 28)")):
        attention_scores(torch.zeros(6, 24), torch.zeros(6, 28))


# --------------------------------------------------------------------------------------------
# Hostile and careless input: each is answered by a clear error naming the argument, what was
# expected and what arrived (never a matmul dtype error, an IndexError or a NaN).
# --------------------------------------------------------------------------------------------

MHA_ARGS = {"d_in": 4, "d_out": 4, "context_length": 8, "dropout": 0.0, "num_heads": 2}


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"num_heads": 2.0}, TypeError, r"num_heads must be an int, got 2.0 \(float\)"),
        ({"num_heads": 0}, ValueError, r"num_heads must be >= 1, got 0"),
        ({"num_heads": True}, TypeError, r"num_heads must be an int, got True \(bool\)"),
        ({"context_length": 16.0}, TypeError, r"context_length must be an int, got 16.0"),
        ({"context_length": 0}, ValueError, r"context_length must be >= 1, got 0"),
        ({"d_in": -3}, ValueError, r"d_in must be >= 1, got -3"),
        ({"d_out": "4"}, TypeError, r"d_out must be an int, got '4' \(str\)"),
        ({"dropout": None}, TypeError, r"dropout must be a float in \[0, 1\), got None"),
        ({"dropout": 1.5}, ValueError, r"dropout must be a probability in \[0, 1\), got 1.5"),
        ({"dropout": 1.0}, ValueError, r"in \[0, 1\), got 1.0"),
        ({"dropout": float("nan")}, ValueError, r"in \[0, 1\), got nan"),
        ({"dropout": -0.1}, ValueError, r"in \[0, 1\), got -0.1"),
    ],
)
@pytest.mark.parametrize("cls", [MultiHeadAttention, MultiHeadAttentionWrapper, CausalAttention])
def test_constructor_arguments(
    cls: type[torch.nn.Module], changes: dict[str, object], error: type[Exception], match: str
) -> None:
    kwargs = {**MHA_ARGS, **changes}
    if cls is CausalAttention:
        if "num_heads" in changes:
            pytest.skip("CausalAttention has no num_heads")
        del kwargs["num_heads"]
    with pytest.raises(error, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("cls", [SelfAttentionV1, SelfAttentionV2])
def test_stage_constructor_arguments(cls: type[torch.nn.Module]) -> None:
    with pytest.raises(TypeError, match=r"d_in must be an int, got 3.0"):
        cls(3.0, 2)
    with pytest.raises(ValueError, match=r"d_out must be >= 1, got 0"):
        cls(3, 0)


@pytest.mark.parametrize(
    "module",
    [
        SelfAttentionV1(4, 2),
        SelfAttentionV2(4, 2),
        CausalAttention(4, 4, context_length=6, dropout=0.0),
        MultiHeadAttentionWrapper(4, 2, context_length=6, dropout=0.0, num_heads=2),
        MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2),
    ],
    ids=type,
)
@pytest.mark.parametrize(
    ("dtype", "error", "match"),
    [
        (
            torch.long,
            TypeError,
            r"floating-point input \(embeddings, not ids\), got dtype torch.int64",
        ),
        (torch.bool, TypeError, r"floating-point input.*got dtype torch.bool"),
        (
            torch.float64,
            TypeError,
            r"dtype torch.float32 \(the module's parameters\), got "
            r"torch.float64: convert the input with x.to",
        ),
        (torch.float16, TypeError, r"dtype torch.float32 .* got torch.float16"),
    ],
)
def test_input_of_another_dtype(
    module: torch.nn.Module, dtype: torch.dtype, error: type[Exception], match: str
) -> None:
    shape = (6, 4) if isinstance(module, SelfAttentionV1 | SelfAttentionV2) else (2, 6, 4)
    with pytest.raises(error, match=match):
        module(torch.zeros(shape, dtype=dtype))


def test_input_of_another_dtype_is_fine_under_autocast() -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(torch.randn(2, 6, 4, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_not_a_tensor() -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2)
    with pytest.raises(TypeError, match=r"input x to be a torch.Tensor, got list"):
        mha([[0.0] * 4])  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"key_padding_mask must be a torch.Tensor, got list"):
        mha(torch.zeros(1, 2, 4), [[False, True]])  # type: ignore[call-overload]


def test_from_wrapper_keeps_the_wrappers_mode_and_rejects_other_modules() -> None:
    wrapper = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0.5, num_heads=2).eval()
    fused = MultiHeadAttention.from_wrapper(wrapper)
    assert not fused.training
    x = torch.randn(2, 6, 3)
    assert_close(fused(x), wrapper(x), atol=1e-6, rtol=0)  # no dropout in either: eval mode
    assert MultiHeadAttention.from_wrapper(wrapper.train()).training
    with pytest.raises(TypeError, match="expected a MultiHeadAttentionWrapper, got Linear"):
        MultiHeadAttention.from_wrapper(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_softmax_stable_of_empty_rows_is_empty_like_torch() -> None:
    for shape in [(0,), (3, 0), (0, 4)]:
        x = torch.empty(shape)
        assert softmax_stable(x).shape == torch.softmax(x, dim=-1).shape == shape


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda x: context_vector(x, torch.ones(8) / 8), ValueError,
         r"one weight per token, shape \(num_tokens,\) = \(6,\), got \(8,\)"),
        (lambda x: context_vectors(x, torch.ones(6, 5)), ValueError,
         r"attn_weights of shape \(num_tokens, num_tokens\) = \(6, 6\), got \(6, 5\)"),
        (lambda x: attn_scores_for_query(x, x[:2]), ValueError,
         r"query of shape \(d_in,\) = \(3,\), got \(2, 3\)"),
        (lambda x: attn_scores_loop(x[0]), ValueError,
         r"inputs of shape \(num_tokens, d_in\).*got a 1-d"),
    ],
)  # fmt: skip
def test_stage_one_helpers_check_their_shapes(
    call: Callable[[torch.Tensor], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call(example_inputs())


def test_stage_one_loops_keep_the_inputs_dtype() -> None:
    x = example_inputs().double()
    weights = torch.softmax(attn_scores_matrix(x), dim=-1)
    for out in (
        attn_scores_for_query(x, x[1]),
        attn_scores_loop(x),
        context_vector(x, weights[1]),
    ):
        assert out.dtype == torch.float64
    assert_close(attn_scores_loop(x), attn_scores_matrix(x))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: MultiHeadAttention(4, 4, 6, 0.0, 2, causal="False"),
         r"causal must be True or False, got 'False' \(str\)"),
        (lambda: MultiHeadAttention(4, 4, 6, 0.0, 2, qkv_bias=None),
         r"qkv_bias must be True or False, got None"),
        (lambda: CausalAttention(4, 4, 6, 0.0, qkv_bias="no"), r"qkv_bias must be True or False"),
        (lambda: SelfAttentionV2(4, 2, qkv_bias="False"), r"qkv_bias must be True or False"),
    ],
)  # fmt: skip
def test_switches_must_be_bools(build: Callable[[], object], match: str) -> None:
    """A string such as "False" is truthy: accepted, it would switch the option on."""
    with pytest.raises(TypeError, match=match):
        build()


def test_need_weights_must_be_a_bool() -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2)
    with pytest.raises(TypeError, match=r"need_weights must be True or False, got 'False'"):
        mha(torch.zeros(1, 3, 4), need_weights="False")  # type: ignore[call-overload]


def test_float64_input_under_bfloat16_autocast_names_both_dtypes() -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2)
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(
            TypeError,
            match=r"dtype torch.float32 or torch.float16 or torch.bfloat16 .* got torch.float64",
        ),
    ):
        mha(torch.zeros(1, 3, 4, dtype=torch.float64))


@pytest.mark.parametrize("causal", [True, False])
def test_zero_tokens_with_a_padding_mask_is_empty_not_an_error(causal: bool) -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2, causal=causal)
    x, padding = torch.zeros(2, 0, 4), torch.zeros(2, 0, dtype=torch.bool)
    assert mha(x, padding).shape == mha(x).shape == (2, 0, 4)


def test_a_padding_mask_on_the_meta_device_gives_shapes_without_values() -> None:
    """On `meta` there are no values to inspect: the general path gives the right shape."""
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2).to("meta")
    x = torch.empty(2, 5, 4, device="meta")
    padding = torch.zeros(2, 5, dtype=torch.bool, device="meta")
    assert mha(x, padding).shape == (2, 5, 4)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: attention_scores(torch.zeros(3), torch.zeros(3)), ValueError, r"at least 2-d"),
        (lambda: attention_scores(torch.zeros(4, 3), torch.zeros(5, 3).double()), TypeError,
         r"keys must have dtype torch.float32, got torch.float64"),
        (lambda: attention_scores([[1.0]], [[1.0]]), TypeError,
         r"queries must be a torch.Tensor, got list"),
        (lambda: softmax_stable(torch.zeros(3, 4), dim=2), ValueError, r"dim must be in -2 .. 1"),
        (lambda: causal_mask(-1), ValueError, r"num_tokens must be >= 0, got -1"),
        (lambda: causal_mask(2.5), TypeError, r"num_tokens must be an int, got 2.5"),
        (lambda: explicit_attention(torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(6, 5)),
         ValueError, r"values must be \(..., num_keys, d_v\) with the keys' num_keys"),
        (lambda: explicit_attention(torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(4, 5),
                                    mask=causal_mask(4).float()),
         TypeError, r"mask must be a bool tensor"),
        (lambda: explicit_attention(torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(4, 5),
                                    mask=causal_mask(5)),
         ValueError, r"does not broadcast to the scores' shape"),
        (lambda: attn_scores_for_query(example_inputs(), torch.tensor([1, 0, 0])), TypeError,
         r"query must have dtype torch.float32, got torch.int64"),
    ],
)  # fmt: skip
def test_core_functions_name_their_arguments(
    call: Callable[[], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()


def test_softmax_stable_of_one_number_is_one_like_torch() -> None:
    assert softmax_stable(torch.tensor(3.0)) == torch.softmax(torch.tensor(3.0), dim=-1) == 1.0


def test_float16_input_under_bfloat16_autocast_is_accepted_as_nn_linear_accepts_it() -> None:
    mha = MultiHeadAttention(4, 4, context_length=6, dropout=0.0, num_heads=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(torch.randn(2, 5, 4, dtype=torch.float16))
    assert out.shape == (2, 5, 4) and torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: MultiHeadAttention(4, 4, 6, 0.0, 2, rope_base="abc"), ValueError,
         r"rope_base must be a finite number > 1, got 'abc'"),
        (lambda: MultiHeadAttention(4, 4, 6, 0.0, 2, window=2)(torch.zeros(0, 5, 4)), None, None),
        (lambda: attn_scores_matrix(torch.randn(6)), ValueError, r"expected inputs of shape \(num_tokens, d_in\)"),
        (lambda: simplified_self_attention(example_inputs().long()), ValueError, r"expected inputs of shape"),
    ],
)  # fmt: skip
def test_more_arguments_are_named(
    call: Callable[[], object], error: type[Exception] | None, match: str | None
) -> None:
    if error is None:  # valid: an empty batch with a window is an empty result
        out = call()
        assert isinstance(out, torch.Tensor) and out.shape == (0, 5, 4)
        return
    with pytest.raises(error, match=match):
        call()


def test_the_issue_35_inputs_are_named_or_work() -> None:
    """A hostile user's inputs from the positions-first issue: each works as it should or is
    refused by name, and nothing is left half-updated."""
    import numpy as np

    from attention.layer.fused import sliding_window_attention
    from attention.layer.masks import causal

    mha = MultiHeadAttention(8, 8, 16, 0.0, num_heads=np.int64(2))  # NumPy's int: an int
    assert type(mha.num_heads) is int and mha(torch.randn(1, 3, 8)).shape == (1, 3, 8)
    x = torch.randn(2, 3, 8)
    for bad, error, match in (
        (
            torch.zeros(2, 3, dtype=torch.bool),
            TypeError,
            "positions must be integers, got dtype torch.bool",
        ),
        (torch.zeros(2, 3, dtype=torch.complex64), TypeError, "positions must be integers"),
        (torch.tensor([[0, 1, -2], [0, 1, 2]]), ValueError, "positions must be >= 0"),
    ):
        with pytest.raises(error, match=match):
            mha(x, positions=bad)
    cache = mha.init_cache(2)
    assert mha(x[:, :0], cache=cache).shape == (2, 0, 8)  # zero tokens: nothing, not a crash
    out, weights = mha(x[:, :0], cache=cache, need_weights=True)
    assert out.shape == (2, 0, 8) and weights.shape == (2, 2, 0, 0) and cache.length == 0
    with pytest.raises(ValueError, match=r"needs a rule that is causal with a bounded reach"):
        sliding_window_attention(*torch.randn(3, 1, 2, 4, 4).unbind(0), causal())
    with pytest.raises(AttributeError, match=r"layer.replace\(mask=...\)"):
        mha.rule = causal()  # type: ignore[misc]
    with pytest.raises(AttributeError, match=r"layer.replace\(score_mods=...\)"):
        mha.score_mods = ()  # type: ignore[misc]


def test_a_spec_is_swapped_whole_and_a_stale_cache_is_refused() -> None:
    """The issue's case: `att.rule = everything()` then a cached call ran cached non-causal
    attention; a swap now re-derives everything and a cache made for the old mask is named."""
    from attention.layer.masks import Mask, causal, everything, window
    from attention.layer.softcap import softcap

    mha = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, window=4)
    ring = mha.init_cache(1)
    mha.replace(mask=everything())  # a cache now holds another sequence: cross-attention's
    with pytest.raises(ValueError, match=r"cross-attention call passes key="):
        mha(torch.randn(1, 2, 8), cache=ring)
    mha.replace(mask=Mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx))  # no bounds declared
    with pytest.raises(ValueError, match=r"cache needs a mask that hides the future"):
        mha(torch.randn(1, 2, 8), cache=ring)
    mha.replace(mask=causal())
    with pytest.raises(
        ValueError, match=r"cache keeps window=4, sinks=0; this module has window=None"
    ):
        mha(torch.randn(1, 2, 8), cache=ring)
    mha.replace(mask=causal() & window(4), score_mods=[softcap(2.0)])
    assert mha.spec.explicit_only and mha(torch.randn(1, 3, 8), cache=ring).shape == (1, 3, 8)
    with pytest.raises(ValueError, match=r"num_heads shapes the layer's parameters"):
        mha.spec = dataclasses.replace(mha.spec, num_heads=4)


def test_a_call_that_fails_after_the_cache_took_its_chunk_spoils_it_until_reset() -> None:
    from attention.layer.masks import causal, documents

    ids = torch.tensor([[0, 0, 1, 1]])  # documents of 4 positions: the 5th reads past them
    mha = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, mask=causal() & documents(ids)).eval()
    cache = mha.init_cache(1, 16)
    x = torch.randn(1, 5, 8)
    first = mha(x[:, :4], cache=cache)
    with pytest.raises(TypeError, match=r"mask 'causal\(\) & documents\(ids\)' failed"):
        mha(x[:, 4:], cache=cache)
    assert cache.length == 5  # it took the chunk before the mask failed at position 4
    with pytest.raises(ValueError, match=r"cache: a call raised TypeError after the cache took "
                                         r"its chunk of 1 tokens, .* reset\(\) it"):  # fmt: skip
        mha(x[:, 4:], cache=cache)  # not read twice
    cache.reset()
    assert torch.equal(mha(x[:, :4], cache=cache), first) and cache.length == 4
