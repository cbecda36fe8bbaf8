"""Grouped-query heads, sliding windows and RoPE in the production module, against a reference.

The reference (`attention.layer.testing.reference_attention`) is written independently of the
package's paths, in float64, one head at a time: RoPE through complex numbers, the window and
padding as explicit index rules, each query head reading its key/value head by `i // group`.
Every path of the module (fused, explicit) must equal it, in outputs and gradients, in every
combination, with every padding layout.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from torch.testing import assert_close

from attention import MultiHeadAttention, prefix_lm
from attention.layer.masks import from_flags
from attention.layer.positions import apply_rope, rope_angles, rotate_half
from attention.layer.softcap import softcap
from attention.layer.testing import padding_mask, reference_attention, sdpa_calls, to_torch_mha
from tests.product import product

B, T, D_IN, H = 3, 11, 6, 4
HEAD_DIM = 4
D_OUT = H * HEAD_DIM


def layout(kind: str) -> torch.Tensor | None:
    lengths = [T, T - 4, 3]
    if kind == "none":
        return None
    if kind in ("right", "left"):
        return padding_mask(lengths, T, side=kind)  # type: ignore[arg-type]
    holes = torch.zeros(B, T, dtype=torch.bool)
    holes[1:, 1::3] = True
    return holes


def reference(
    mha: MultiHeadAttention, x: torch.Tensor, padding: torch.Tensor | None
) -> torch.Tensor:
    return reference_attention(mha, x, padding)


CASES = [
    # (num_kv_heads, window, rope, causal)
    *itertools.product([H, 2, 1], [None, 1, 3, T + 5], [False, True], [True]),
    *itertools.product([H, 1], [None], [False, True], [False]),
]


@pytest.mark.parametrize(
    ("num_kv_heads", "window", "rope", "causal", "kind"),
    product(CASES, ["none", "right", "left", "holes"], seconds=0.06),  # each case fast once
)
def test_every_combination_equals_the_reference(
    num_kv_heads: int, window: int | None, rope: bool, causal: bool, kind: str
) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(
        D_IN, D_OUT, T, 0.0, H, qkv_bias=True, causal=causal,
        num_kv_heads=num_kv_heads, window=window, rope=rope,
    ).double()  # fmt: skip
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    padding = layout(kind)
    expected, expected_grads = value_and_grads(lambda xi: reference(mha, xi, padding), mha, x)
    fused, explicit = (
        (lambda xi: mha(xi, padding)),
        (lambda xi: mha(xi, padding, need_weights=True)[0]),
    )
    for forward in (fused, explicit):
        out, grads = value_and_grads(forward, mha, x)
        assert_close(out, expected, atol=1e-10, rtol=0)
        for got, want in zip(grads, expected_grads, strict=True):  # the input's, every weight's
            assert_close(got, want, atol=1e-10, rtol=0)


def value_and_grads(
    forward: Callable[[torch.Tensor], torch.Tensor], mha: MultiHeadAttention, x: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`forward(x)`, and the gradients of a fixed weighted sum of it: of `x`, then of each of
    `mha`'s parameters."""
    xi = x.clone().requires_grad_(True)
    out = forward(xi)
    weighted = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum()
    grads = torch.autograd.grad(weighted, [xi, *mha.parameters()])
    return out.detach(), list(grads)


def test_rope_scores_depend_only_on_the_offset() -> None:
    """<R_m q, R_n k> is the same for (m, n) and (m + s, n + s)."""
    from attention.layer.positions import apply_rope, rope_angles

    q, k = torch.randn(2, 16, dtype=torch.float64)
    cos, sin = rope_angles(40, 16, dtype=torch.float64)
    rotated_q, rotated_k = (
        apply_rope(q.expand(40, 16), cos, sin),
        apply_rope(k.expand(40, 16), cos, sin),
    )
    scores = rotated_q @ rotated_k.T  # (40, 40): score of query at m, key at n
    for offset in (-7, 0, 3, 20):
        diagonal = scores.diagonal(offset)  # all pairs with n - m = offset
        assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-12, rtol=0)


def test_default_num_kv_heads_is_todays_module() -> None:
    torch.manual_seed(7)
    default = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H)
    torch.manual_seed(7)
    explicit = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, num_kv_heads=H)
    assert default.state_dict().keys() == explicit.state_dict().keys()
    for a, b in zip(default.parameters(), explicit.parameters(), strict=True):
        assert torch.equal(a, b)  # the same draws in the same order
    x = torch.randn(2, T, D_IN)
    assert torch.equal(default(x), explicit(x))


def test_multi_query_equals_heads_that_share_one_copied_key_and_value() -> None:
    """MQA (one key/value head) is MHA whose key/value heads are all the same copy."""
    torch.manual_seed(0)
    mqa = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, num_kv_heads=1, qkv_bias=True)
    mha = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, qkv_bias=True)
    with torch.no_grad():
        for name in ("W_query", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(mqa, name).state_dict())
        for name in ("W_key", "W_value"):
            getattr(mha, name).weight.copy_(getattr(mqa, name).weight.repeat(H, 1))
            getattr(mha, name).bias.copy_(getattr(mqa, name).bias.repeat(H))
    x = torch.randn(2, T, D_IN)
    assert_close(mqa(x), mha(x), atol=1e-6, rtol=0)
    assert mqa.W_key.weight.numel() * H == mha.W_key.weight.numel()


def test_window_of_one_sees_only_itself_and_a_wide_window_is_no_window() -> None:
    torch.manual_seed(0)
    alone = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, window=1)
    x = torch.randn(2, T, D_IN)
    with torch.no_grad():
        values_only = alone.out_proj(alone.W_value(x))  # weight 1 on itself: Z = V
    assert_close(alone(x), values_only, atol=1e-6, rtol=0)
    wide = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, window=T)
    full = MultiHeadAttention(D_IN, D_OUT, T, 0.0, H)
    full.load_state_dict(wide.state_dict())
    assert_close(wide(x), full(x), atol=1e-6, rtol=0)


def test_a_long_window_builds_no_t_by_t_mask() -> None:
    """At T = 2,048 with a window of 64, the kernel gets one (64, <= 127) mask per block."""
    mha = MultiHeadAttention(16, 16, 4096, 0.0, 2, window=64, num_kv_heads=1, rope=True)
    with torch.no_grad(), sdpa_calls() as calls:
        mha(torch.randn(1, 2048, 16))
        mha(torch.randn(1, 2048, 16), padding_mask([1500], 2048, side="left"))
    assert len(calls) == 2 * 2048 // 64
    shapes = [call.mask_shape for call in calls]
    assert shapes[:3] == [(64, 64), (64, 127), (64, 127)]  # block 0 sees only itself
    assert shapes[32:35] == shapes[:3]  # left padding: each row rolled, then the same blocks


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_kv_heads": 3}, ValueError,
         r"num_heads must be divisible by num_kv_heads .* num_heads=4, num_kv_heads=3"),
        ({"num_kv_heads": 0}, ValueError, r"num_kv_heads must be >= 1, got 0"),
        ({"num_kv_heads": 2.0}, TypeError, r"num_kv_heads must be an int"),
        ({"window": 0}, ValueError, r"window must be >= 1, got 0"),
        ({"window": 4, "causal": False}, ValueError, r"a sliding window needs causal=True"),
        ({"rope": "yes"}, TypeError, r"rope must be True or False"),
        ({"rope": True, "rope_base": 1.0}, ValueError, r"rope_base must be a finite number > 1, got 1.0"),
        ({"rope": True, "rope_base": float("inf")}, ValueError, r"rope_base must be a finite number > 1, got inf"),
        ({"sinks": 2}, ValueError, r"sinks=2 needs a window"),
        ({"sink_logit": 1}, TypeError, r"sink_logit must be True or False"),
    ],
)  # fmt: skip
def test_bad_combinations_name_themselves(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        MultiHeadAttention(D_IN, D_OUT, T, 0.0, H, **kwargs)  # type: ignore[arg-type]


def test_rope_needs_an_even_head_dim() -> None:
    with pytest.raises(
        ValueError, match=r"head_dim = d_out // num_heads must be even, got head_dim=3"
    ):
        MultiHeadAttention(D_IN, 12, T, 0.0, 4, rope=True)


@pytest.mark.inductor
@pytest.mark.heavy
@pytest.mark.xdist_group("inductor")  # on the worker that compiles the others
def test_compiled_modern_module_matches_eager() -> None:
    torch._dynamo.reset()
    mha = MultiHeadAttention(16, 32, 64, 0.0, 4, num_kv_heads=2, rope=True, window=8)
    x = torch.randn(2, 20, 16)  # three blocks of the window (each a kernel call to compile)
    assert_close(torch.compile(mha)(x), mha(x), atol=1e-5, rtol=1e-5)


def test_rope_angles_continue_from_an_offset_and_refuse_odd_widths() -> None:
    from attention.layer.positions import rope_angles

    cos, sin = rope_angles(10, 8)
    later_cos, later_sin = rope_angles(4, 8, offset=6)
    assert_close(later_cos, cos[6:]) and assert_close(later_sin, sin[6:])  # type: ignore[func-returns-value]
    with pytest.raises(ValueError, match=r"head_dim must be even, got 7"):
        rope_angles(4, 7)


def test_published_shapes_and_their_cache() -> None:
    from attention.model.shapes import PUBLISHED, kv_cache_bytes

    for shape in PUBLISHED.values():
        assert shape.num_heads % shape.num_kv_heads == 0
        # 2 (K and V) x layers x kv heads x head_dim x 2 bytes (bfloat16), per token
        expected = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 2
        assert kv_cache_bytes(shape, num_tokens=1) == expected
        assert kv_cache_bytes(shape, num_tokens=100, batch=3) == 300 * expected
    assert PUBLISHED["Llama 3 8B"].num_kv_heads * 4 == PUBLISHED["Llama 2 7B"].num_kv_heads


def test_windowed_layers_cache_at_most_the_window() -> None:
    from attention.model.shapes import PUBLISHED, ModelShape, kv_cache_bytes

    mistral, gemma = PUBLISHED["Mistral 7B v0.1"], PUBLISHED["Gemma 2 9B"]
    per_layer_token = {s.name: kv_cache_bytes(s, 1) // s.num_layers for s in (mistral, gemma)}
    # every layer of Mistral v0.1 is windowed: 8,192 or 100,000 tokens cost what 4,096 do
    assert kv_cache_bytes(mistral, 100_000) == kv_cache_bytes(mistral, 4096)
    assert kv_cache_bytes(mistral, 4096) == 32 * 4096 * per_layer_token[mistral.name]
    # Gemma 2: 21 layers keep 4,096 tokens, the other 21 all of them
    assert kv_cache_bytes(gemma, 10_000) == (21 * 4096 + 21 * 10_000) * per_layer_token[gemma.name]
    with pytest.raises(ValueError, match=r"windowed_layers must be in \[0, num_layers=2\], got 3"):
        ModelShape("bad", 2, 8, 2, 2, 4, window=4, windowed_layers=3)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: rope_angles(2.5, 4), TypeError, r"num_tokens must be an int"),
        (lambda: rope_angles(3, 4, offset=-2), ValueError, r"offset must be >= 0, got -2"),
        (lambda: rotate_half(torch.tensor([1.0, 2.0, 3.0])), ValueError, r"even last dimension"),
        (lambda: apply_rope(torch.zeros(3, 8), torch.ones(3, 8), None), TypeError, r"sin must be a torch.Tensor"),
        (lambda: from_flags(False, 2, 0), ValueError, r"a sliding window needs causal=True"),
        (lambda: from_flags(True, None, 2), ValueError, r"sinks=2 needs a window"),
        (lambda: from_flags(True, 4, -1), ValueError, r"sinks must be >= 0, got -1"),
        (lambda: padding_mask([1.5], 3), TypeError, r"lengths must be a sequence of ints"),
        (lambda: to_torch_mha(MultiHeadAttention(8, 8, 4, 0.0, 2, num_kv_heads=1)), ValueError, r"has no num_kv_heads=1 of num_heads=2"),
        (lambda: to_torch_mha(MultiHeadAttention(8, 8, 4, 0.0, 2, scale=2.0)), ValueError, r"scale=2"),
        (lambda: to_torch_mha(MultiHeadAttention(8, 8, 4, 0.0, 2, mask=prefix_lm(3))), ValueError, r"mask=causal\(\) \| prefix\(3\)"),
        (lambda: to_torch_mha(MultiHeadAttention(8, 8, 4, 0.0, 2, score_mods=[softcap(0.5)])), ValueError, r"score_mods=\[softcap"),
        (lambda: to_torch_mha(MultiHeadAttention(8, 8, 4, 0.0, 2, window=2, sink_logit=True)), ValueError, r"mask=window\(2\), sink_logit"),
    ],
)  # fmt: skip
def test_the_new_helpers_name_their_arguments(
    call: Callable[[], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()


def test_rope_at_positions_past_the_slots_is_the_offset_property() -> None:
    """`positions=` may place a chunk anywhere (a reader's `arange(2, 6)` once raised an
    IndexError from the angle table): RoPE sees only offsets, so the outputs stay the same."""
    torch.manual_seed(123)
    mha = MultiHeadAttention(8, 8, 6, 0.0, num_heads=2, rope=True)
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        later = mha(x, positions=torch.arange(2, 6)[None])
        far = mha(x, positions=torch.arange(70_000, 70_004)[None])  # past the table, too
        torch.testing.assert_close(later, mha(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(far, mha(x), atol=1e-4, rtol=0)
