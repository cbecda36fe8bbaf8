"""Masks and score modifiers as functions: every combination against the float64 definition.

One property test draws a mask (built-in, combined, or a `mask_mod` taken unchanged from
attention-gym), score modifiers (attention-gym's ALiBi and soft cap, with and without a
declared additive form), grouped heads, RoPE, padding anywhere, documents, and a way to run
it (whole, in chunks through a cache, one token at a time). Fused, explicit and cached runs
must all equal `reference_attention`, which calls the functions on one pair of scalars at a
time, to 1e-10 in float64. Then the planner's table, what reaches the kernel, the bounds'
algebra, and a hostile user's inputs.
"""

from __future__ import annotations

import math

import pytest
import torch
from attn_gym.masks import causal_mask, generate_prefix_lm_mask, generate_sliding_window
from attn_gym.mods import generate_alibi_bias, generate_tanh_softcap
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import MultiHeadAttention
from attention.layer.fused import plan
from attention.layer.masks import Bounds, Mask, causal, documents, everything, sinks, window
from attention.layer.score_mods import ScoreMod
from attention.layer.testing import padding_mask, reference_attention, sdpa_calls

B, T, D_IN, H, HEAD_DIM = 2, 7, 6, 4, 4
ATOL = 1e-10


def gym_alibi(declared: bool) -> ScoreMod:
    """attention-gym's ALiBi, unchanged; `declared`: with its additive form, so it is fused."""
    fn = generate_alibi_bias(H)

    def bias(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return fn(torch.zeros((), dtype=torch.float64), b, h, q, kv)

    return ScoreMod(fn, bias=bias if declared else None)


MASKS = {
    "causal": lambda: causal(),
    "window": lambda: window(3),
    "streaming": lambda: causal() & (window(3) | sinks(1)),
    "gym window": lambda: Mask(generate_sliding_window(2)),  # no bounds: dense, not cached
    "causal & gym window": lambda: causal() & generate_sliding_window(2),
    "gym prefix-LM": lambda: Mask(generate_prefix_lm_mask(3)),
    "checkerboard": lambda: causal() & Mask(lambda b, h, q, kv: (q + kv + h) % 3 != 1),
    "causal & not window": lambda: causal() & ~window(2),  # a negation: no bounds of its own
}
MODS = {
    "none": lambda: [],
    "alibi (fused)": lambda: [gym_alibi(True)],
    "alibi (explicit)": lambda: [gym_alibi(False)],
    "softcap": lambda: [ScoreMod(generate_tanh_softcap(2))],
    "alibi, softcap": lambda: [gym_alibi(True), ScoreMod(generate_tanh_softcap(2))],
}
PADDING = ["none", "left", "right", "middle"]


def padded(kind: str) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "middle":
        mask = torch.zeros(B, T, dtype=torch.bool)
        mask[1, 2:4] = True  # a span between real tokens
        return mask
    return padding_mask([T, T - 3], T, side=kind)  # type: ignore[arg-type]


def layer(mask: Mask, mods: list[ScoreMod], kv: int, rope: bool) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(D_IN, H * HEAD_DIM, T, 0.0, H, qkv_bias=True, num_kv_heads=kv,
                              rope=rope, mask=mask, score_mods=mods).double().eval()  # fmt: skip


def run_in_chunks(mha: MultiHeadAttention, x: torch.Tensor, pad: torch.Tensor | None,
                  docs: torch.Tensor | None, sizes: list[int]) -> torch.Tensor:  # fmt: skip
    cache, outs, start = mha.init_cache(B), [], 0
    for size in sizes:
        part = slice(start, start + size)
        outs.append(mha(x[:, part], None if pad is None else pad[:, part], cache=cache,
                        document_ids=None if docs is None else docs[:, part]))  # fmt: skip
        start += size
    return torch.cat(outs, dim=1)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mask=st.sampled_from(sorted(MASKS)),
    mods=st.sampled_from(sorted(MODS)),
    kv=st.sampled_from([H, 2]),
    rope=st.booleans(),
    pad=st.sampled_from(PADDING),
    docs=st.booleans(),
    sizes=st.sampled_from([[T], [3, 4], [1] * T, [5, 1, 1]]),
)
@pytest.mark.slow(seconds=6)
def test_every_combination_equals_the_definition(
    mask: str, mods: str, kv: int, rope: bool, pad: str, docs: bool, sizes: list[int]
) -> None:
    mha = layer(MASKS[mask](), MODS[mods](), kv, rope)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    padding = padded(pad)
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 2, 2, 2]]) if docs else None
    expected = reference_attention(mha, x, padding, ids)
    with torch.no_grad():
        assert_close(mha(x, padding, document_ids=ids), expected, atol=ATOL, rtol=0)
        explicit, _ = mha(x, padding, need_weights=True, document_ids=ids)
        assert_close(explicit, expected, atol=ATOL, rtol=0)
        if mha.causal:  # a cache needs a mask that certainly hides the future
            chunked = run_in_chunks(mha, x, padding, ids, sizes)
            assert_close(chunked, expected, atol=ATOL, rtol=0)


def test_attention_gyms_masks_equal_ours() -> None:
    """attention-gym's window counts `q - kv <= w` (w + 1 keys), ours `q - kv < w` (w keys)."""
    pos = torch.arange(9)
    assert torch.equal(Mask(generate_sliding_window(2)).grid(pos, pos), window(3).grid(pos, pos))
    assert torch.equal(Mask(causal_mask).grid(pos, pos), causal().grid(pos, pos))
    prefix_lm = Mask(generate_prefix_lm_mask(3)).grid(pos, pos)
    assert prefix_lm[:3, :3].all() and torch.equal(prefix_lm[3:], causal().grid(pos, pos)[3:])


@pytest.mark.parametrize(
    ("rule", "args", "kind"),
    [
        (causal(), (64, 64), "is_causal"),
        (causal(), (1, 65, 64), "none"),  # decode: one query sees every key
        (causal(), (3, 67, 64), "mask"),  # a chunk after a cache: the bottom-right triangle
        (everything(), (64, 64), "none"),
        (window(16), (64, 64), "blocked"),
        (window(16), (16, 16), "is_causal"),  # the window covers every earlier key
        (causal() & (window(16) | sinks(2)), (64, 64), "blocked"),
        (window(16), (1, 18, 500, False), "none"),  # decode over a ring: exactly its keys
        (causal() & (window(16) | sinks(2)), (1, 18, 500, False), "none"),
        (causal() & Mask(causal_mask), (64, 64), "mask"),  # a user's function: evaluated
        (Mask(causal_mask, bounds=Bounds(causal_from=0, near=math.inf, first=math.inf)),
         (64, 64), "is_causal"),  # ... unless it declares what it is
        (causal() | Mask(generate_prefix_lm_mask(8)), (64, 64), "mask"),
    ],
)  # fmt: skip
def test_the_planner_reads_bounds(rule: Mask, args: tuple[int, ...], kind: str) -> None:
    num_tokens, num_keys, *rest = args
    start = rest[0] if rest else num_keys - num_tokens
    in_order = rest[1] if len(rest) > 1 else True
    assert plan(rule, num_tokens, num_keys, start=start, in_order=in_order).kind == kind


def test_score_modifiers_choose_the_path() -> None:
    assert plan(causal(), 64, 64, score_mods=[gym_alibi(True)]).kind == "mask"  # a float mask
    assert plan(causal(), 64, 64, score_mods=[gym_alibi(False)]).kind == "explicit"
    mha = layer(causal(), [gym_alibi(True)], H, False)
    with torch.no_grad(), sdpa_calls() as calls:
        mha(torch.randn(1, T, D_IN, dtype=torch.float64))
    assert [str(c) for c in calls] == [f"is_causal=False, attn_mask=torch.float64 (1, {H}, 7, 7)"]


def test_bounds_of_combinations() -> None:
    streaming = causal() & (window(8) | sinks(2))
    assert (streaming.bounds.causal, streaming.bounds.reach, streaming.bounds.anchor) == (
        True,
        8,
        2,
    )
    assert streaming.bounds.sees_kept() and streaming == causal() & (window(8) | sinks(2))
    loose = causal() & Mask(causal_mask)  # the user's part has no bounds: only causal()'s
    assert loose.bounds.causal and loose.bounds.reach is None and loose.bounds.near == 0
    assert (window(4) | Mask(causal_mask)).bounds.reach is None  # | with the unknown: unbounded
    assert repr(streaming) == "causal() & (window(8) | sinks(2))"


def test_a_cache_keeps_what_the_mask_bounds() -> None:
    mha = layer(causal() & (window(3) | sinks(1)), [], 2, True)
    cache = mha.init_cache(B)
    assert cache.ring and cache.slots == 4
    plain = layer(causal() & Mask(causal_mask), [], 2, True).init_cache(B, max_tokens=T)
    assert not plain.ring and plain.slots == T  # no reach bound: keep everything


def test_documents_mask_equals_document_ids() -> None:
    ids = torch.tensor([[0, 0, 1, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1, 2]])
    packed = layer(causal() & documents(ids), [], 2, True)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    with torch.no_grad():
        assert_close(packed(x), layer(causal(), [], 2, True)(x, document_ids=ids), atol=ATOL,
                     rtol=0)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mask": 3}, TypeError, r"mask must be a Mask or a function fn\(b, h, q_idx, kv_idx\)"),
        ({"mask": lambda b, h, q: q}, TypeError, r"mask '<lambda>' failed on \(b, h, q_idx, kv_idx\)"),
        ({"mask": lambda b, h, q, kv: q - kv}, TypeError, r"must return a bool tensor, got torch.int64"),
        ({"mask": lambda b, h, q, kv: True}, TypeError, r"must return a bool tensor, got bool"),
        ({"mask": lambda b, h, q, kv: torch.ones(5, 5, dtype=torch.bool)}, ValueError,
         r"returned shape \(5, 5\), which does not broadcast to \(batch, heads, queries, keys\)"),
        ({"mask": window(3), "window": 3}, ValueError, r"pass mask= or window=/sinks=, not both"),
        ({"score_mods": 3}, TypeError, r"score_mods must be a list of ScoreMod"),
        ({"score_mods": [3]}, TypeError, r"score_mods\[0\] must be a ScoreMod or a function"),
        ({"score_mods": [lambda s, b, h: s]}, TypeError, r"score_mods\[0\] \(<lambda>\) failed"),
        ({"score_mods": [lambda s, b, h, q, kv: s > 0]}, TypeError, r"must return floating-point scores, got torch.bool"),
        ({"score_mods": [lambda s, b, h, q, kv: s[..., :1]]}, ValueError, r"must return the scores' shape"),
        ({"score_mods": [lambda s, b, h, q, kv: s * 0 * math.inf]}, ValueError, r"turned finite scores into NaN"),
        ({"score_mods": [ScoreMod(lambda s, b, h, q, kv: 2 * s, bias=lambda b, h, q, kv: q * 0.0)]},
         ValueError, r"its bias is not fn\(score\) - score"),
    ],
)  # fmt: skip
def test_a_hostile_user_gets_named_errors(
    kwargs: dict[str, object], error: type, match: str
) -> None:
    """At construction, or at the first call, where the functions are tried on its device."""
    with pytest.raises(error, match=match):
        mha = MultiHeadAttention(D_IN, H * HEAD_DIM, T, 0.0, H, **kwargs)  # type: ignore[arg-type]
        mha(torch.randn(1, T, D_IN))


def test_a_mask_of_another_batch_or_length_is_named_at_the_call() -> None:
    mha = layer(causal() & documents(torch.zeros(1, 4, dtype=torch.long)), [], H, False)
    with pytest.raises(TypeError, match=r"mask 'causal\(\) & documents\(ids\)' failed"):
        mha(torch.randn(B, T, D_IN, dtype=torch.float64))  # 7 tokens, ids for 4


def test_a_cache_needs_a_mask_that_hides_the_future() -> None:
    mha = layer(Mask(generate_sliding_window(2)), [], H, False)  # causal, but undeclared
    with pytest.raises(ValueError, match=r"cache needs a mask that hides the future"):
        mha(torch.randn(B, 2, D_IN, dtype=torch.float64), cache=mha.init_cache(B))


def test_a_layer_with_built_in_masks_pickles() -> None:
    """The site trains models in another process: a layer's mask must travel with it."""
    import pickle

    mha = MultiHeadAttention(D_IN, H * HEAD_DIM, T, 0.0, H, window=3, sinks=1)
    again = pickle.loads(pickle.dumps(mha))
    assert again.rule == mha.rule and repr(again.rule) == "causal() & (window(3) | sinks(1))"
    x = torch.randn(1, T, D_IN)
    assert_close(again(x), mha(x), atol=0, rtol=0)


def test_a_score_mod_that_hides_every_key_of_a_row_gives_zero_on_every_path() -> None:
    """FlexAttention's habit: -inf from a score_mod hides a key, as a mask would."""

    def first_only(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                   kv: torch.Tensor) -> torch.Tensor:  # fmt: skip
        return torch.where(kv == 0, s, float("-inf"))

    mha = layer(window(2), [ScoreMod(first_only)], H, False)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    with torch.no_grad():
        out, weights = mha(x, need_weights=True)  # rows 2.. see no key but key 0: nothing
    assert not out.isnan().any() and (weights[:, :, 2:] == 0).all()
    assert_close(out, reference_attention(mha, x), atol=ATOL, rtol=0)


def test_the_first_call_check_tries_only_what_the_call_uses() -> None:
    """Three tokens of documents, and a modifier that is NaN only where the mask hides."""
    ids = torch.tensor([[0, 0, 1]])
    few = layer(causal() & documents(ids), [], H, False)
    assert few(torch.randn(1, 3, D_IN, dtype=torch.float64)).shape == (1, 3, H * HEAD_DIM)
    with pytest.raises(TypeError, match=r"documents: ids hold 2 rows, the batch has 3"):
        layer(causal() & documents(torch.zeros(2, T, dtype=torch.long)), [], H, False)(
            torch.randn(3, T, D_IN, dtype=torch.float64)
        )
    log_distance = ScoreMod(lambda s, b, h, q, kv: s - torch.log1p(q - kv))  # NaN for kv > q
    mha = layer(causal(), [log_distance], H, False)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    assert_close(mha(x), reference_attention(mha, x), atol=ATOL, rtol=0)


def test_what_cross_attention_and_causal_false_cannot_honour_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"are for cross-attention, which needs .* mask or score_mods"
    ):
        MultiHeadAttention(8, 8, 16, 0.0, 2, causal=False, kdim=6, vdim=6, mask=sinks(2))
    with pytest.raises(ValueError, match=r"causal=False, but mask=window\(3\) hides the future"):
        MultiHeadAttention(8, 8, 16, 0.0, 2, causal=False, mask=window(3))
    both = causal_mask & causal()  # a plain mask_mod on the left: a Mask
    assert isinstance(both, Mask) and both.bounds.causal


def test_a_padded_prefill_into_a_cache_builds_no_t_by_t_mask() -> None:
    mha = MultiHeadAttention(16, 16, 512, 0.0, 2, window=16).eval()
    pad = padding_mask([512, 500], 512, side="left")
    with torch.no_grad(), sdpa_calls() as calls:
        mha(torch.randn(2, 512, 16), pad, cache=mha.init_cache(2))
    assert all(call.mask_shape is None or call.mask_shape[-1] <= 64 + 16 for call in calls)


def test_a_negation_is_the_complement_and_certain_of_nothing() -> None:
    q, k = torch.arange(5), torch.arange(5)
    for rule in (window(2), causal() | sinks(1), Mask(lambda b, h, qi, kv: (qi + kv) % 2 == 0)):
        assert torch.equal((~rule).grid(q, k), ~rule.grid(q, k))
        assert (~rule).bounds == Bounds()  # nothing certain: no tile skipped on its account
    assert str(causal() & ~window(2)) == "causal() & ~window(2)"
    assert str(~(causal() | window(2))) == "~(causal() | window(2))"
    assert ~window(2) == ~window(2) and ~window(2) != window(2)
