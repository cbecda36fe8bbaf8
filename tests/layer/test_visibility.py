"""One definition of what a query sees: every path and configuration against the definition.

`attention.layer.testing.reference_attention` decides each (query, key) pair by the rule's own words,
one query at a time. The module must equal it in float64 for every combination of grouped
heads, window, sinks, RoPE, a learned sink logit, padding and documents: uncached (fused and
explicit), cached in chunks, and one token at a time, across a ring buffer's wrap too.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from attention import MultiHeadAttention
from attention.layer.cache import KVCache
from attention.layer.masks import chunk_mask, everything, from_flags, window
from attention.layer.testing import padding_mask, reference_attention, sdpa_calls
from attention.layer.tokens import Tokens, queries, visible
from tests.product import product

B, T, D_IN, H, HEAD_DIM = 2, 11, 6, 4, 4
ATOL = 1e-10

# (num_kv_heads, window, sinks, rope)
CONFIGS = [
    (kv, window, sinks, rope)
    for kv, (window, sinks), rope in itertools.product(
        [H, 1], [(None, 0), (3, 0), (3, 2), (5, 1)], [False, True]
    )
]
DATA = ["none", "right", "left", "holes", "documents", "documents+left"]


def inputs(kind: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(key_padding_mask, document_ids) of a batch of two rows of T tokens."""
    padding = documents = None
    if "right" in kind:
        padding = padding_mask([T, T - 4], T)
    if "left" in kind:
        padding = padding_mask([T - 2, T - 5], T, side="left")
    if kind == "holes":
        padding = torch.zeros(B, T, dtype=torch.bool)
        padding[1, 1::3] = True
    if "documents" in kind:
        documents = torch.tensor([[0] * 4 + [1] * 7, [0] * 2 + [1] * 5 + [2] * 4])
    return padding, documents


def module(kv: int, window: int | None, sinks: int, rope: bool, sink: bool = False,
           causal: bool = True) -> MultiHeadAttention:  # fmt: skip
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, H * HEAD_DIM, T, 0.0, H, qkv_bias=True, causal=causal,
                             num_kv_heads=kv, window=window, rope=rope, sinks=sinks,
                             sink_logit=sink).double().eval()  # fmt: skip
    if mha.sink_logits is not None:
        with torch.no_grad():
            mha.sink_logits.copy_(torch.linspace(-1.0, 2.0, H))
    return mha


def chunks(mha: MultiHeadAttention, x: torch.Tensor, padding: torch.Tensor | None,
           documents: torch.Tensor | None, sizes: list[int]) -> torch.Tensor:  # fmt: skip
    """The module over `x` in chunks of `sizes`, through one cache."""
    cache = mha.init_cache(B)
    outs, start = [], 0
    for size in sizes:
        part = slice(start, start + size)
        outs.append(
            mha(
                x[:, part],
                None if padding is None else padding[:, part],
                cache=cache,
                document_ids=None if documents is None else documents[:, part],
            )
        )
        start += size
    assert start == x.shape[1]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize(
    ("kv", "window", "sinks", "rope", "kind"), product(CONFIGS, DATA, seconds=0.05)
)  # each configuration fast once, the data kinds in turn
def test_every_configuration_equals_the_definition(
    kv: int, window: int | None, sinks: int, rope: bool, kind: str
) -> None:
    sink = (kv + (window or 0) + sinks + rope + DATA.index(kind)) % 2 == 1  # half the cases
    mha = module(kv, window, sinks, rope, sink)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    padding, documents = inputs(kind)
    expected = reference_attention(mha, x, padding, documents)
    fused = mha(x, padding, document_ids=documents)
    explicit, _ = mha(x, padding, need_weights=True, document_ids=documents)
    assert_close(fused, expected, atol=ATOL, rtol=0)
    assert_close(explicit, expected, atol=ATOL, rtol=0)
    for sizes in ([4, 3, 4], [1] * T, [5] + [1] * 6, [2, 9]):
        assert_close(chunks(mha, x, padding, documents, sizes), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", DATA)
@pytest.mark.parametrize("kv", [H, 2])
def test_encoder_attention_equals_the_definition(kind: str, kv: int) -> None:
    mha = module(kv, None, 0, rope=True, sink=kv == 2, causal=False)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    padding, documents = inputs(kind)
    expected = reference_attention(mha, x, padding, documents)
    assert_close(mha(x, padding, document_ids=documents), expected, atol=ATOL, rtol=0)
    weights_path, _ = mha(x, padding, need_weights=True, document_ids=documents)
    assert_close(weights_path, expected, atol=ATOL, rtol=0)


def test_the_rule_is_its_definition_at_every_pair() -> None:
    for is_causal, w, sinks in [(True, None, 0), (False, None, 0), (True, 1, 0), (True, 3, 2)]:
        rule = from_flags(is_causal, w, sinks)
        got = rule.grid(torch.arange(9), torch.arange(-1, 9))  # key -1: an empty slot
        for i, j in itertools.product(range(9), range(-1, 9)):
            want = j >= 0 and (not is_causal or j <= i)
            if w is not None:
                want = want and (i - j < w or j < sinks)
            assert bool(got[i, j + 1]) == want, (is_causal, w, sinks, i, j)


def test_positions_documents_and_the_chunk_mask() -> None:
    tokens = queries(1, 3, torch.tensor([[False, True, False]]), None, torch.tensor([[3, 3, 4]]),
                     torch.device("cpu"))  # fmt: skip
    assert tokens.pos.tolist() == [[0, -1, 1]]  # padding is "no token"; documents a mask
    mask = visible(everything(), tokens, tokens)
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [False, False, False],
                                   [False, False, True]]  # fmt: skip
    assert torch.equal(
        chunk_mask(2, 2, window(2)),
        torch.tensor([[False, True, True, False], [False, False, True, True]]),
    )


@pytest.mark.parametrize(("window", "sinks"), [(3, 0), (3, 2), (1, 1)])
def test_a_windowed_cache_is_a_ring_of_the_window_and_wraps(window: int, sinks: int) -> None:
    mha = module(2, window, sinks, rope=True)
    long = MultiHeadAttention(D_IN, H * HEAD_DIM, 64, 0.0, H, qkv_bias=True, num_kv_heads=2,
                              window=window, rope=True, sinks=sinks).double().eval()  # fmt: skip
    long.load_state_dict(mha.state_dict())
    x = torch.randn(1, 4 * T, D_IN, dtype=torch.float64)  # 4 x context_length
    cache = mha.init_cache(1)
    assert cache.ring and cache.slots == window + sinks and cache.max_tokens is None
    keys = cache.keys
    with torch.no_grad():
        outs = [mha(x[:, :T], cache=cache)]
        outs += [mha(x[:, i : i + 1], cache=cache) for i in range(T, 4 * T)]
    assert cache.keys.data_ptr() == keys.data_ptr()  # stored in place: no allocation
    assert cache.length == 4 * T and sorted(cache.positions[0, : cache.slots].tolist()) == sorted(
        [*range(sinks), *range(4 * T - window, 4 * T)]
    )
    expected = reference_attention(long, x)
    assert_close(torch.cat(outs, dim=1), expected, atol=ATOL, rtol=0)


def test_kernel_calls_are_the_least_the_rule_needs() -> None:
    x = torch.randn(2, 64, 16)
    plain = MultiHeadAttention(16, 16, 64, 0.0, 2).eval()
    windowed = MultiHeadAttention(16, 16, 256, 0.0, 2, window=16, sinks=2).eval()
    with torch.no_grad(), sdpa_calls() as calls:
        plain(x)  # causal from position 0: is_causal
        plain(x, padding_mask([64, 40], 64))  # right padding: is_causal, padded rows zeroed
        cache = plain.init_cache(2)
        plain(x[:, :10], cache=cache)  # prefill: is_causal
        plain(x[:, 10:11], cache=cache)  # decode sees every key: no mask
        plain(x[:, 11:14], cache=cache)  # a chunk after a cache: the bottom-right mask
    assert [str(c) for c in calls] == [
        "is_causal=True, attn_mask=None",
        "is_causal=True, attn_mask=None",
        "is_causal=True, attn_mask=None",
        "is_causal=False, attn_mask=None",
        "is_causal=False, attn_mask=torch.bool (3, 14)",
    ]
    long = torch.randn(2, 256, 16)
    with torch.no_grad(), sdpa_calls() as calls:
        windowed(long)  # 4 blocks of 64 queries, each over its own <= 64 + w - 1 + sinks keys
        cache = windowed.init_cache(2)
        windowed(long[:, :40], cache=cache)  # a prefill: one block, its own keys
        windowed(long[:, 40:41], cache=cache)  # decode over the ring: exactly the window
    shapes = [c.mask_shape for c in calls]
    assert shapes == [(64, 64), (64, 81), (64, 81), (64, 81), (40, 40), None]
    assert cache.slots == 18


def test_documents_equal_each_document_alone() -> None:
    mha = module(2, 3, 0, rope=True)
    lengths = [4, 2, 5]
    x = torch.randn(1, T, D_IN, dtype=torch.float64)
    documents = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))[None]
    packed = mha(x, document_ids=documents)
    alone = torch.cat([mha(part) for part in x.split(lengths, dim=1)], dim=1)
    assert_close(packed, alone, atol=ATOL, rtol=0)  # RoPE is relative: positions may differ


def test_a_learned_sink_takes_weight_and_learns() -> None:
    mha = module(H, None, 0, rope=False, sink=True)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    _, weights = mha(x, need_weights=True)
    sums = weights.sum(-1)  # (b, h, T): less than 1, more so for a larger sink logit
    assert bool((sums < 1).all()) and bool((sums[:, -1] < sums[:, 0]).all())
    fused = mha(x)
    fused.sum().backward()
    grad = mha.sink_logits.grad
    assert grad is not None and bool(torch.isfinite(grad).all()) and bool((grad != 0).all())


def test_backward_through_several_cached_chunks_equals_uncached() -> None:
    mha = module(2, 3, 1, rope=True)
    x = torch.randn(B, T, D_IN, dtype=torch.float64, requires_grad=True)
    chunked = chunks(mha, x, None, None, [4, 3, 1, 3])
    (chunked.square().sum()).backward()
    got = [x.grad, *(p.grad for p in mha.parameters())]
    x.grad = None
    mha.zero_grad()
    mha(x).square().sum().backward()
    for a, b in zip(got, [x.grad, *(p.grad for p in mha.parameters())], strict=True):
        assert a is not None and b is not None
        assert_close(a, b, atol=ATOL, rtol=0)


def test_cache_update_returns_views_of_its_storage() -> None:
    cache = KVCache(1, 8, 2, 4)
    tokens = Tokens(1, 3, torch.device("cpu"), start=0)
    keys, _, stored = cache.update(tokens, torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
    assert keys.shape == (1, 2, 3, 4) and stored.start == 0 and stored.pos.tolist() == [[0, 1, 2]]
    assert keys.data_ptr() == cache.keys.data_ptr()  # a view, not a copy


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_weights_in_half_precision_stay_finite_where_float16_scores_would_overflow(
    dtype: torch.dtype,
) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 64, 32, 0.0, 4).to(dtype)
    x = (torch.randn(2, 8, 64) * 1000).to(dtype)  # scores far beyond float16's 65,504
    out, weights = mha(x, need_weights=True)
    assert bool(torch.isfinite(weights).all()) and bool(torch.isfinite(out).all())
    assert_close(weights.float().sum(-1), torch.ones(2, 4, 8), atol=1e-2, rtol=0)
    assert_close(out.float(), mha(x).float(), atol=0.1, rtol=0.05)


def test_a_chunk_without_a_mask_after_a_padded_prompt_is_real_tokens() -> None:
    mha = module(2, None, 0, rope=True)
    x = torch.randn(1, 6, D_IN, dtype=torch.float64)
    padding = torch.tensor([[True, True, False, False, False, False]])
    cache = mha.init_cache(1)
    out = torch.cat((mha(x[:, :4], padding[:, :4], cache=cache),
                     mha(x[:, 4:5], cache=cache), mha(x[:, 5:6], cache=cache)), dim=1)  # fmt: skip
    assert_close(out, reference_attention(mha, x, padding), atol=ATOL, rtol=0)


def test_a_reset_cache_forgets_the_graph_too() -> None:
    mha = module(H, None, 0, rope=False)
    x = torch.randn(1, 3, D_IN, dtype=torch.float64)
    cache = mha.init_cache(1)
    first = mha(x, cache=cache)
    first.sum().backward()
    cache.reset()
    again = mha(x, cache=cache)
    again.sum().backward()  # no "backward through the graph a second time"
    assert_close(again, first)


def test_a_cache_under_autocast_gives_weights_too() -> None:
    mha = MultiHeadAttention(8, 8, 16, 0.0, 2).eval()
    cache = mha.init_cache(1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mha(torch.randn(1, 4, 8), cache=cache)
        out, weights = mha(torch.randn(1, 1, 8), cache=cache, need_weights=True)
    assert weights.shape == (1, 2, 1, 5) and bool(torch.isfinite(out).all())


def test_the_rope_table_stays_bounded_however_far_positions_go() -> None:
    mha = MultiHeadAttention(16, 16, 16, 0.0, 1, rope=True, window=4).eval()
    cache = mha.init_cache(1)
    with torch.no_grad():
        mha(torch.randn(1, 16, 16), cache=cache)
        for _ in range(300):
            mha(torch.randn(1, 1, 16), cache=cache)
    assert mha.rotary is not None and cache.length == 316
    assert max(cos.shape[0] for cos, _ in mha.rotary._tables.values()) <= 256


def test_the_reference_rotates_in_double_precision_for_float32_modules() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, 16, T, 0.0, 4, rope=True).eval()
    x = torch.randn(2, T, D_IN)
    with torch.no_grad():
        assert_close(reference_attention(mha, x), mha(x), atol=1e-5, rtol=0)


def test_a_padded_ring_under_autocast_and_after_resets() -> None:
    """bfloat16 keys into a float32 ring that has taken padding; reset keeps its memory."""
    mha = MultiHeadAttention(8, 8, 16, 0.0, 2, window=2).eval()
    cache = mha.init_cache(2)
    pad = torch.tensor([[True, False, False], [False, False, False]])
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        for _ in range(3):
            cache.reset()
            mha(torch.randn(2, 3, 8), pad, cache=cache)
            out = mha(torch.randn(2, 1, 8), cache=cache)
    assert out.shape == (2, 1, 8) and cache.keys.shape[2] == cache.slots  # the spare: unseen


def test_training_through_a_cache_when_only_the_queries_learn() -> None:
    mha = module(2, 3, 0, rope=True)
    for linear in (mha.W_key, mha.W_value):
        linear.requires_grad_(False)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    chunks(mha, x, None, None, [3, 1, 1, 6]).square().sum().backward()
    assert mha.W_query.weight.grad is not None and mha.W_key.weight.grad is None
