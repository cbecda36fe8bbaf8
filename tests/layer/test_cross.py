"""Cross-attention in the production module: queries from `x`, keys and values from another
sequence, equal to `torch.nn.MultiheadAttention` with separate query/key/value inputs, with
and without the keys' padding, cached (the keys stored once) and uncached."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from attention import MultiHeadAttention
from attention.layer.testing import padding_mask, sdpa_calls, to_torch_mha

D, H, T, S = 16, 4, 5, 9  # query width, heads, queries, keys
WIDTHS = {"same widths": (D, D), "kdim=12, vdim=7": (12, 7)}


def layer(kdim: int, vdim: int, device: torch.device, **extra: Any) -> MultiHeadAttention:
    torch.manual_seed(0)
    options = {"causal": False, "kdim": kdim, "vdim": vdim, **extra}
    mha = MultiHeadAttention(D, D, 32, 0.0, num_heads=H, qkv_bias=True, **options)
    return mha.double().to(device).eval()


def inputs(kdim: int, vdim: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    x, key, value = (torch.randn(3, n, w, generator=g, dtype=torch.float64).to(device)
                     for n, w in ((T, D), (S, kdim), (S, vdim)))  # fmt: skip
    return x, key, value


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "padded keys"])
@pytest.mark.parametrize("widths", WIDTHS.values(), ids=WIDTHS.keys())
def test_equals_torch_multihead_attention_with_separate_inputs(
    widths: tuple[int, int], padded: bool, device: torch.device
) -> None:
    mha = layer(*widths, device)
    x, key, value = inputs(*widths, device)
    mask = padding_mask([S, 4, 1], S, device=device) if padded else None
    theirs, their_weights = to_torch_mha(mha)(x, key, value, key_padding_mask=mask,
                                              average_attn_weights=False)  # fmt: skip
    assert_close(mha(x, mask, key=key, value=value), theirs, atol=1e-12, rtol=0)
    ours, weights = mha(x, mask, need_weights=True, key=key, value=value)
    assert_close(ours, theirs, atol=1e-12, rtol=0)
    assert_close(weights, their_weights, atol=1e-12, rtol=0)
    if mask is not None:  # padding gets no weight; every query's weights sum to 1
        assert (weights.masked_select(mask[:, None, None, :]) == 0).all()
    assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]), atol=1e-12, rtol=0)


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "padded keys"])
def test_the_cache_holds_the_keys_once_and_steps_equal_the_whole_pass(
    padded: bool, device: torch.device
) -> None:
    """A decoder's cross-attention: the first call stores the encoder's keys and values, the
    steps after it read them, and each step equals the uncached call on the same query."""
    mha = layer(12, 7, device)
    x, key, value = inputs(12, 7, device)
    mask = padding_mask([S, 4, 1], S, side="left", device=device) if padded else None
    whole = mha(x, mask, key=key, value=value)  # (3, T, D)
    cache = mha.init_cache(3, max_tokens=S)
    first = mha(x[:, :2], mask, key=key, value=value, cache=cache)
    assert cache.length == S
    stored = cache.keys.clone()
    steps = [mha(x[:, t : t + 1], cache=cache) for t in range(2, T)]
    assert torch.equal(cache.keys, stored) and cache.length == S  # read, never written again
    assert_close(torch.cat([first, *steps], dim=1), whole, atol=1e-12, rtol=0)
    step, weights = mha(x[:, :1], need_weights=True, cache=cache)
    assert_close(step, whole[:, :1], atol=1e-12, rtol=0)
    assert weights.shape == (3, H, 1, S)


def test_grouped_heads_and_what_reaches_the_kernel(device: torch.device) -> None:
    """Two key/value heads for four query heads; the kernel gets no mask without padding
    and one row per sequence with it, never (T, S)."""
    mha = layer(12, 7, device, num_kv_heads=2)
    x, key, value = inputs(12, 7, device)
    mask = padding_mask([S, 4, 0], S, device=device)
    with sdpa_calls() as calls:
        out = mha(x, mask, key=key, value=value)
        mha(x, key=key, value=value)
    assert [call.mask_shape for call in calls] == [(3, 1, 1, S), None]
    explicit = mha(x, mask, need_weights=True, key=key, value=value)[0]
    assert_close(out, explicit, atol=1e-12, rtol=0)
    # a sequence whose keys are all padding gets zero context vectors: out_proj's bias
    assert_close(out[2], mha.out_proj.bias.expand(T, D), atol=1e-12, rtol=0)


def test_nan_in_padded_keys_changes_nothing(device: torch.device) -> None:
    mha = layer(12, 7, device)
    x, key, value = inputs(12, 7, device)
    mask = padding_mask([S, 4, 1], S, device=device)
    expected = mha(x, mask, key=key, value=value)
    key, value = key.masked_fill(mask[..., None], float("nan")), value.masked_fill(
        mask[..., None], float("inf"))  # fmt: skip
    for need_weights in (False, True):
        out = mha(x, mask, need_weights, key=key, value=value)
        assert_close(out[0] if need_weights else out, expected, atol=1e-12, rtol=0)


def test_cross_attention_widths_need_a_module_that_can_cross_attend() -> None:
    with pytest.raises(
        ValueError,
        match=r"kdim=6, vdim=16 \(other than d_in=16\) are for cross-attention, which needs causal=False, rope=False, no sink_logit, qk_norm, mask or score_mods; got causal=True",
    ):
        MultiHeadAttention(D, D, 32, 0.0, num_heads=H, kdim=6)
    with pytest.raises(
        ValueError, match=r"got causal=False, rope=False, sink_logit=False, qk_norm=head,"
    ):
        MultiHeadAttention(D, D, 32, 0.0, num_heads=H, kdim=6, causal=False, qk_norm="head")


@pytest.mark.parametrize(
    ("extra", "call", "error", "match"),
    [
        ({"causal": True, "kdim": D, "vdim": D}, {"key": "x"}, ValueError, r"cross-attention .* needs causal=False, rope=False, no sink logit, output gate, QK-norm, mask or score modifier; this module has causal=True"),
        ({"qk_norm": "head", "kdim": D, "vdim": D}, {"key": "x"}, ValueError, r"output_gate=False, qk_norm='head', mask="),
        ({"output_gate": True}, {"key": "k", "value": "v"}, ValueError, r"this module has causal=False, rope=False, sink_logit=False, output_gate=True"),
        ({"rope": True, "kdim": D, "vdim": D}, {"key": "x"}, ValueError, r"this module has causal=False, rope=True"),
        ({}, {"key": torch.randn(3, S, 11, dtype=torch.float64)}, ValueError, r"key must have shape \(batch, num_keys, kdim\) = \(3, num_keys, 12\), got \(3, 9, 11\)"),
        ({}, {"key": "k", "value": torch.randn(2, S, 7, dtype=torch.float64)}, ValueError, r"value must have shape \(batch, num_keys, vdim\) = \(3, num_keys, 7\), got \(2, 9, 7\)"),
        ({}, {"key": "k", "value": torch.randn(3, S - 1, 7, dtype=torch.float64)}, ValueError, r"key and value must have one length \(num_keys\), got 9 and 8"),
        ({}, {"key": "k"}, ValueError, r"value defaults to key, but values are projected from vdim=7 and keys from kdim=12: pass value="),
        ({}, {"key": torch.randn(3, S, 12, dtype=torch.float32)}, TypeError, r"key must have dtype torch.float64, got torch.float32"),
        ({}, {"key": "k", "value": "v", "key_padding_mask": torch.zeros(3, T, dtype=torch.bool)}, ValueError, r"key_padding_mask must have shape \(batch, num_tokens\) = \(3, 9\), got \(3, 5\)"),
        ({}, {"key": "k", "value": "v", "document_ids": torch.zeros(3, T, dtype=torch.long)}, ValueError, r"document_ids pack one sequence's documents"),
        ({}, {}, ValueError, r"this module projects keys from kdim=12 and values from vdim=7 wide inputs: pass key="),
        ({}, {"cache": "empty"}, ValueError, r"cache is empty: the first cross-attention call passes key="),
        ({}, {"key": "k", "value": "v", "cache": "full"}, ValueError, r"cache already holds 9 keys of the other sequence"),
        ({}, {"cache": "full", "value": "v"}, ValueError, r"value and key_padding_mask come with key"),
        ({}, {"key": "k", "value": "v", "cache": "small"}, ValueError, r"cache holds 1 to 4 keys \(max_tokens\), got key with 9"),
        ({}, {"key": torch.zeros(3, 0, 12, dtype=torch.float64), "value": torch.zeros(3, 0, 7, dtype=torch.float64), "cache": "empty"}, ValueError, r"cache holds 1 to 9 keys \(max_tokens\), got key with 0"),
    ],
)  # fmt: skip
def test_bad_cross_attention_arguments_are_named(
    extra: dict[str, Any], call: dict[str, Any], error: type[Exception], match: str
) -> None:
    cpu = torch.device("cpu")
    mha = layer(**{"kdim": 12, "vdim": 7, **extra}, device=cpu)
    x, key, value = inputs(12, 7, cpu)
    call = {name: {"k": key, "v": value, "x": x}.get(arg, arg) if isinstance(arg, str) else arg
            for name, arg in call.items()}  # fmt: skip
    if "cache" in call:
        full = mha.init_cache(3, max_tokens=S)
        mha(x, key=key, value=value, cache=full)
        caches = {"empty": mha.init_cache(3, max_tokens=S), "full": full,
                  "small": mha.init_cache(3, max_tokens=4)}  # fmt: skip
        call["cache"] = caches[call["cache"]]
    with pytest.raises(error, match=match):
        mha(x, **call)


def test_cross_check_names_the_self_attention_arguments_it_refuses() -> None:
    """`cross.check` (public in its module) takes them by keyword, as the layer passes them."""
    from attention.layer import cross

    mha = layer(kdim=12, vdim=7, device=torch.device("cpu"))
    _, key, value = inputs(12, 7, torch.device("cpu"))
    ids = torch.zeros(3, T, dtype=torch.long)
    with pytest.raises(ValueError, match=r"document_ids pack one sequence's documents"):
        cross.check(mha, 3, key, value, None, None, document_ids=ids)
    cross.check(mha, 3, key, value, None, None)  # nothing self-only: fine
