"""One position per token: every path reads the positions it is given, and the plan is what runs.

The layer's mask, score modifiers, RoPE, cache and kernel read one `int64` position per token
(`attention.layer.tokens`). These tests give positions other than `0 .. T - 1` (an offset,
gaps, repeats, any order) and hold every path to the float64 reference evaluated at those
positions: fused, explicit, cached in chunks and static steps, and FlexAttention (unfused here
in float64, in the `slow` group since each call takes about half a second on the CPU; compiled,
in the `heavy` group). Then: the kernel calls a forward makes are the ones its plan names, for
every case of the mask-combination test.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import MultiHeadAttention
from attention.layer import flex
from attention.layer.fused import MIN_BLOCK
from attention.layer.masks import causal, sinks, window
from attention.layer.testing import reference_attention, sdpa_calls
from tests.layer.test_flex import flex_on_cpu
from tests.layer.test_masks import ATOL, D_IN, MASKS, MODS, PADDING, B, T, layer, padded

KINDS = ["offset", "gaps", "repeats", "reordered"]


def positions(kind: str, offset: int) -> torch.Tensor:
    """`(B, T)` positions of one kind; rows differ."""
    line = torch.arange(T)
    if kind == "offset":
        rows = [line + offset, line + 2 * offset + 1]
    elif kind == "gaps":
        rows = [offset + 3 * line, offset + line * line]
    elif kind == "repeats":
        rows = [offset + line // 2, offset + (line + 1) // 3]
    else:
        rows = [offset + line.flip(0), offset + torch.tensor([3, 0, 6, 1, 5, 2, 4])]
    return torch.stack(rows)


def takes_a_cache(mha: MultiHeadAttention) -> bool:
    return mha.rule.bounds.prefix == 0


PROBES = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Case = tuple[str, str, int, bool, str, int]  # mask, mods, kv heads, RoPE, positions, offset
PROBE = given(
    case=st.tuples(
        st.sampled_from(sorted(MASKS)),
        st.sampled_from(sorted(MODS)),
        st.sampled_from([4, 2]),
        st.booleans(),
        st.sampled_from(KINDS),
        st.integers(0, 70_000),
    )
)
"""A layer of the mask-combination test and positions of one kind: what both tests draw."""


def probe(case: Case) -> tuple[MultiHeadAttention, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer, its input, the positions and the float64 reference at those positions."""
    mask, mods, kv, rope, kind, offset = case
    mha = layer(MASKS[mask](), MODS[mods](), kv, rope)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    pos = positions(kind, offset)
    return mha, x, pos, reference_attention(mha, x, positions=pos)


@PROBES
@PROBE
def test_every_path_reads_the_positions_it_is_given(case: Case) -> None:
    """Fused, explicit, cached in chunks and static steps (FlexAttention: the next test)."""
    mha, x, pos, expected = probe(case)
    with torch.no_grad():
        assert_close(mha(x, positions=pos), expected, atol=ATOL, rtol=0)
        explicit, _ = mha(x, positions=pos, need_weights=True)
        assert_close(explicit, expected, atol=ATOL, rtol=0)
        if takes_a_cache(mha) and case[4] in ("offset", "gaps"):  # each row's positions grow
            assert_close(cached(mha, x, pos), expected, atol=ATOL, rtol=0)


@pytest.mark.slow(seconds=15)  # FlexAttention unfused on the CPU: about 0.5 s a call
@PROBES
@PROBE
def test_flexattention_reads_the_positions_it_is_given(case: Case) -> None:
    mha, x, pos, expected = probe(case)
    with torch.no_grad(), flex_on_cpu() as calls:
        assert_close(mha(x, positions=pos), expected, atol=ATOL, rtol=0)
    assert calls or mha.last_plan is None or mha.last_plan.kind != "flex"


def cached(mha: MultiHeadAttention, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """A prefill of 3 tokens, then one token at a time: static and dynamic steps in turn."""
    cache = mha.init_cache(B)
    outs = [mha(x[:, :3], cache=cache, positions=pos[:, :3])]
    for t in range(3, T):
        step = (x[:, t : t + 1], pos[:, t : t + 1])
        if t % 2:
            with cache.static_steps():  # every slot, as a CUDA graph's step reads them
                outs.append(mha(step[0], cache=cache, positions=step[1]))
        else:
            outs.append(mha(step[0], cache=cache, positions=step[1]))
    return torch.cat(outs, dim=1)


def test_a_prefix_lm_chunk_at_an_offset_is_read_at_its_positions() -> None:
    """The issue's case: a prefix-LM layer at positions 5 .. 8 differed from the causal layer
    with the same weights by 0.261 on the fused path (the mask read slots)."""
    from attention import prefix_lm

    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, mask=prefix_lm(3)).double()
    plain = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2).double()
    plain.load_state_dict(mha.state_dict())
    x, pos = torch.randn(1, 4, 8, dtype=torch.float64), torch.arange(5, 9)[None]
    assert_close(mha(x, positions=pos), plain(x, positions=pos), atol=ATOL, rtol=0)


def test_a_window_cache_prefilled_at_an_offset_keeps_its_keys() -> None:
    """The issue's case: a window-2 layer prefilled at 20..22, then stepped at 23 with
    need_weights, gave weights [0, 0] (the cache held slots, the query a position)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, window=2).double()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    cache = mha.init_cache(1)
    mha(x[:, :3], cache=cache, positions=torch.arange(20, 23)[None])
    out, weights = mha(x[:, 3:], cache=cache, positions=torch.tensor([[23]]), need_weights=True)
    assert_close(weights.sum(-1), torch.ones(1, 2, 1, dtype=torch.float64), atol=ATOL, rtol=0)
    expected = reference_attention(mha, x, positions=torch.arange(20, 24)[None])[:, 3:]
    assert_close(out, expected, atol=ATOL, rtol=0)


def expected_calls(mha: MultiHeadAttention, num_tokens: int) -> tuple[int, int]:
    """`(sdpa calls, flex calls)` the layer's last plan names for a call of `num_tokens`."""
    plan = mha.last_plan
    assert plan is not None
    if plan.kind in ("explicit", "flex"):
        return 0, int(plan.kind == "flex")
    if plan.kind == "blocked":
        reach = mha.rule.bounds.reach
        assert reach is not None
        return math.ceil(num_tokens / max(reach, MIN_BLOCK)), 0
    return 1, 0


CASES = [
    pytest.param(
        mask, mods, PADDING[(i + j) % len(PADDING)], on_flex,
        marks=[pytest.mark.slow(seconds=2)] if on_flex else [],  # unfused FlexAttention
    )
    for i, mask in enumerate(sorted(MASKS))
    for j, mods in enumerate(sorted(MODS))
    for on_flex in [bool((i + j) % 2)]
]  # fmt: skip


@pytest.mark.parametrize(("mask", "mods", "pad", "on_flex"), CASES)
def test_the_kernel_calls_are_the_plans(mask: str, mods: str, pad: str, on_flex: bool) -> None:
    """Every mask and modifier of the mask-combination test (each with one padding and one
    device rule in turn), whole and in chunks: the SDPA and FlexAttention calls observed
    equal what the plan said (and is_causal, and a mask or none, as it said)."""
    mha = layer(MASKS[mask](), MODS[mods](), 2, True)
    x, padding = torch.randn(B, T, D_IN, dtype=torch.float64), padded(pad)
    calls_ = [(x, padding, None)]
    if takes_a_cache(mha):
        cache = mha.init_cache(B)
        calls_ = [(x[:, :4], None if padding is None else padding[:, :4], cache),
                  (x[:, 4:5], None, cache), (x[:, 5:], None, cache)]  # fmt: skip
    for chunk, chunk_pad, cache in calls_:
        with torch.no_grad(), sdpa_calls() as calls, flex_on_cpu() as flexed:
            if not on_flex:
                flex.ON.discard("cpu")
            mha(chunk, chunk_pad, cache=cache)
        plan = mha.last_plan
        assert plan is not None
        assert (len(calls), len(flexed)) == expected_calls(mha, chunk.shape[1]), plan
        if plan.kind in ("none", "is_causal"):
            assert calls[0].is_causal == (plan.kind == "is_causal") and calls[0].mask_shape is None
        if plan.kind in ("mask", "blocked"):
            assert all(call.mask_shape is not None for call in calls)


@pytest.mark.inductor
@pytest.mark.heavy(seconds=150)
@pytest.mark.parametrize(
    "rule",
    [causal() & window(130), causal() & (window(100) | sinks(4)), None],
    ids=["window", "window+sinks", "documents"],
)
def test_compiled_flex_on_the_cpu_skips_tiles_and_equals_the_reference(rule: object) -> None:
    """Compiled FlexAttention runs on the CPU and skips the tiles its block mask marks empty
    (as on CUDA): per-row documents refilled in place, windows, sinks, at positions other
    than 0 .. T - 1, with Qwen3-Next's output gate, against the explicit path (float32:
    compiled FlexAttention on the CPU takes no float64, torch 2.13; the explicit path is held
    to the float64 reference by the tests above and tests/layer/test_output_gate.py)."""
    torch.manual_seed(0)
    n = 300  # tiles of 128: three query blocks, some of them skipped
    ids = torch.zeros(2, n, dtype=torch.long)
    ids[0, 100:], ids[1, 200:] = 1, 1
    mha = MultiHeadAttention(16, 16, 512, 0.0, 2, num_kv_heads=1, rope=True, output_gate=True,
                             mask=causal() if rule is None else rule).eval()  # fmt: skip
    docs = ids if rule is None else None  # by token, refilled in place below
    x = torch.randn(2, n, 16)
    pos = torch.arange(n).expand(2, n) + torch.tensor([[0], [1000]])
    with torch.no_grad(), flex.use("cpu"):
        for _ in range(2):
            got = mha(x, positions=pos, document_ids=docs)
            assert mha.last_plan is not None and mha.last_plan.kind == "flex"
            flex.ON.discard("cpu")
            explicit, _ = mha(x, positions=pos, document_ids=docs, need_weights=True)
            flex.ON.add("cpu")
            assert_close(got, explicit, atol=2e-5, rtol=2e-5)
            ids[1, 150:] = 1  # refilled in place: the next call's block mask is built again


@pytest.mark.inductor
@pytest.mark.heavy(seconds=60)
def test_a_decode_of_many_steps_compiles_flex_once() -> None:
    """A prefill through compiled FlexAttention, then 30 decode steps (one query each: SDPA's
    mask row, never FlexAttention): the prefill's compiles only; and past dynamo's recompile limit
    the kernel raises instead of falling back to the unfused kernel."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 16, 512, 0.0, 2, window=40).eval()
    cache = mha.init_cache(1)
    x = torch.randn(1, 130, 16)
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad(), flex.use("cpu"):
        outs = [mha(x[:, :100], cache=cache)]
        assert mha.last_plan is not None and mha.last_plan.kind == "flex"
        prefill = counters["stats"]["unique_graphs"] - before  # the kernel and its block mask
        outs += [mha(x[:, t : t + 1], cache=cache) for t in range(100, 130)]
        assert prefill <= 2 and counters["stats"]["unique_graphs"] - before == prefill
        with torch._dynamo.config.patch(recompile_limit=1), pytest.raises(Exception, match="limit"):
            mha(x[:, :90])  # another shape, a second graph: past a limit of 1
    assert_close(torch.cat(outs, dim=1), mha(x), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("pad", ["left", "middle"])
@pytest.mark.parametrize("mask", ["streaming", "checkerboard", "gym prefix-LM"])
def test_padding_and_given_positions_together(mask: str, pad: str) -> None:
    """Padding (positions -1) with offset positions for the real tokens: uncached, and for a
    mask that takes a cache, a padded prefill then steps."""
    mha = layer(MASKS[mask](), MODS["alibi (fused)"](), 2, True)
    x, padding = torch.randn(B, T, D_IN, dtype=torch.float64), padded(pad)
    assert padding is not None
    pos = ((~padding).long().cumsum(1) - 1).clamp(min=0) + torch.tensor([[40], [7]])
    expected = reference_attention(mha, x, padding, positions=pos)
    real = ~padding[..., None]
    with torch.no_grad():
        assert_close(mha(x, padding, positions=pos) * real, expected * real, atol=ATOL, rtol=0)
        if takes_a_cache(mha):
            cache = mha.init_cache(B)
            outs = [mha(x[:, :4], padding[:, :4], cache=cache, positions=pos[:, :4])]
            outs += [mha(x[:, t : t + 1], padding[:, t : t + 1], cache=cache,
                         positions=pos[:, t : t + 1]) for t in range(4, T)]  # fmt: skip
            assert_close(torch.cat(outs, 1) * real, expected * real, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "extra", [{"window": 3}, {"window": 3, "sinks": 2}], ids=["window", "sinks"]
)
@pytest.mark.parametrize("line", [[7, 8, 9, 10, 11], [0, 2, 3, 6, 7], [100, 101, 103, 104, 108]])
def test_a_ring_cache_at_offsets_and_gaps_is_the_uncached_layer(extra: dict, line: list) -> None:
    """A ring keeps position p at slot k + (p - k) mod w: with an offset or a gap, past the
    count of tokens, where a query must still find it (it read only the first `length`)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 16, 0.0, 2, **extra).double().eval()
    x, pos = torch.randn(1, 5, 8, dtype=torch.float64), torch.tensor([line])
    whole = mha(x, positions=pos)
    cache = mha.init_cache(1)
    parts = [mha(x[:, i : i + 1], cache=cache, positions=pos[:, i : i + 1]) for i in range(5)]
    assert_close(torch.cat(parts, dim=1), whole, atol=1e-12, rtol=0)


def test_a_ring_cache_refuses_positions_that_do_not_grow_and_keeps_its_keys() -> None:
    mha = MultiHeadAttention(8, 8, 16, 0.0, 2, window=3).double().eval()
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    cache = mha.init_cache(1)
    mha(x[:, :2], cache=cache, positions=torch.tensor([[10, 11]]))
    kept = (cache.keys.clone(), cache.positions.clone(), cache.length)
    with pytest.raises(ValueError, match=r"each row's positions must grow from call to call: "
                                         r"row 0 holds positions up to 11, got \[5\]"):  # fmt: skip
        mha(x[:, 2:], cache=cache, positions=torch.tensor([[5]]))  # would take 11's slot
    assert torch.equal(cache.keys, kept[0]) and torch.equal(cache.positions, kept[1])
    assert cache.length == kept[2]
