"""The FlexAttention path: the planner's choices with it, and its answers against the oracle.

On CUDA the planner sends FlexAttention what SDPA could take only with a mask, in blocks or
not at all (windows, documents, user masks, score modifiers without an additive form). The
CPU never takes the path on its own (`flex.DEVICES`), so these tests turn it on for the CPU,
where FlexAttention runs unfused in float64, and hold it to `reference_attention` (1e-10),
the same bar as every other path. The CUDA test checks the path is taken where it should be.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import MultiHeadAttention
from attention.layer import flex, fused
from attention.layer.fused import plan
from attention.layer.masks import Mask, causal, everything, sinks, window
from attention.layer.score_mods import ScoreMod
from attention.layer.testing import reference_attention
from attention.layer.tokens import Tokens
from tests.layer.test_masks import (
    ATOL,
    D_IN,
    MASKS,
    MODS,
    PADDING,
    B,
    T,
    layer,
    padded,
    run_in_chunks,
)


@contextmanager
def flex_on_cpu() -> Iterator[list[int]]:
    """FlexAttention for CPU calls too; yields a list that grows by one per flex call."""
    calls: list[int] = []
    real = flex.attend

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    with flex.use("cpu", compiled=False), mock.patch.object(flex, "attend", counted):
        yield calls


@pytest.mark.parametrize(
    ("rule", "num_tokens", "num_keys", "where", "kind"),
    [
        (causal(), 64, 64, {}, "is_causal"),  # the flash kernel's own causal call stays
        (causal(), 1, 65, {"start": 64}, "none"),  # decode
        (everything(), 64, 64, {}, "none"),
        (window(16), 64, 64, {}, "flex"),  # SDPA would take it in blocks, each with a mask
        (causal() & (window(16) | sinks(2)), 64, 64, {}, "flex"),
        (window(16), 1, 18, {"start": 500, "in_order": False}, "none"),  # decode over a ring
        (causal(), 3, 67, {"start": 64}, "flex"),  # a chunk after a cache
        (causal() & Mask(lambda b, h, q, kv: q >= kv), 64, 64, {}, "flex"),  # a user's mask
    ],
)
def test_the_plan_with_flex(
    rule: Mask, num_tokens: int, num_keys: int, where: dict[str, object], kind: str
) -> None:
    got = plan(rule, num_tokens, num_keys, flex=True, **where)  # type: ignore[arg-type]
    assert got.kind == kind


def test_documents_and_a_modifier_without_an_additive_form_go_to_flex() -> None:
    cap = ScoreMod(lambda s, b, h, q, kv: 5.0 * torch.tanh(s / 5.0))
    assert plan(causal(), 64, 64, score_mods=[cap]).kind == "explicit"
    assert plan(causal(), 64, 64, score_mods=[cap], flex=True).kind == "flex"
    assert plan(causal(), 64, 64, per_row=True).kind == "mask"
    assert plan(causal(), 64, 64, per_row=True, flex=True).kind == "flex"


def test_the_cpu_and_dropout_never_take_flex() -> None:
    assert not flex.usable(torch.device("cpu"), 0.0)
    with flex.use("cpu", compiled=False):
        assert flex.usable(torch.device("cpu"), 0.0)
        assert not flex.usable(torch.device("cpu"), 0.1)  # FlexAttention has no dropout


@pytest.mark.heavy(seconds=10)  # FlexAttention unfused, a block mask per call
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mask=st.sampled_from(sorted(MASKS)),
    mods=st.sampled_from(sorted(MODS)),
    kv=st.sampled_from([4, 2]),
    rope=st.booleans(),
    pad=st.sampled_from(PADDING),
    docs=st.booleans(),
    sizes=st.sampled_from([[T], [3, 4], [5, 1, 1]]),
)
def test_every_combination_on_flex_equals_the_definition(
    mask: str, mods: str, kv: int, rope: bool, pad: str, docs: bool, sizes: list[int]
) -> None:
    mha = layer(MASKS[mask](), MODS[mods](), kv, rope)
    x = torch.randn(B, T, D_IN, dtype=torch.float64)
    padding = padded(pad)
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 2, 2, 2]]) if docs else None
    expected = reference_attention(mha, x, padding, ids)
    with torch.no_grad(), flex_on_cpu():
        assert_close(mha(x, padding, document_ids=ids), expected, atol=ATOL, rtol=0)
        if mha.causal:
            chunked = run_in_chunks(mha, x, padding, ids, sizes)
            assert_close(chunked, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("rule", [causal() & window(3), causal() & (window(2) | sinks(1))])
@pytest.mark.slow(seconds=2)
def test_flex_takes_windows_sinks_logits_and_grouped_heads(rule: Mask) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_IN, 16, 32, 0.0, num_heads=4, num_kv_heads=2, rope=True,
                             mask=rule, sink_logit=True).double().eval()  # fmt: skip
    with torch.no_grad():
        mha.sink_logits.copy_(torch.tensor([-1.0, 0.0, 1.0, 2.0]))
        x = torch.randn(2, 20, D_IN, dtype=torch.float64)
        expected = reference_attention(mha, x)
        with flex_on_cpu() as calls:
            got = mha(x)
    assert calls  # the window went to FlexAttention, not to SDPA's blocks
    assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.slow(seconds=1)
def test_a_query_that_sees_nothing_gets_zeros_on_flex() -> None:
    q, k, v = torch.randn(3, 1, 2, 4, 8, dtype=torch.float64).unbind(0)
    cpu, docs = torch.device("cpu"), torch.tensor([[0, 0, 1, 1]])
    queries = Tokens(1, 4, cpu, start=0, docs=docs)
    keys = Tokens(1, 4, cpu, given=torch.tensor([[0, 1, -1, -1]]), docs=docs)  # 2, 3: none
    out = flex.attend(q, k, v, causal(), queries, keys)  # document 1 sees nothing
    assert torch.equal(out[:, :, 2:], torch.zeros_like(out[:, :, 2:]))
    assert out[:, :, :2].abs().sum() > 0


def test_a_block_mask_is_kept_only_where_provably_the_same() -> None:
    cpu = torch.device("cpu")
    line = Tokens(1, 64, cpu, start=0)
    first = flex.block_mask(causal() & window(8), line, line, 2)
    assert flex.block_mask(causal() & window(8), line, line, 2) is first  # every layer, step
    assert flex.block_mask(causal() & window(9), line, line, 2) is not first
    pos = torch.arange(64)[None]  # one model call's positions, every layer
    mine = flex.block_mask(
        causal(), Tokens(1, 64, cpu, given=pos), Tokens(1, 64, cpu, given=pos), 2
    )
    assert flex.block_mask(causal(), Tokens(1, 64, cpu, given=pos),
                           Tokens(1, 64, cpu, given=pos), 2) is mine  # fmt: skip
    pos.add_(1)  # refilled in place: its version moved on, built again
    assert flex.block_mask(causal(), Tokens(1, 64, cpu, given=pos),
                           Tokens(1, 64, cpu, given=pos), 2) is not mine  # fmt: skip
    ids = torch.zeros(1, 64, dtype=torch.long)
    docs = Tokens(1, 64, cpu, start=0, docs=ids)
    kept = flex.block_mask(causal(), docs, docs, 2)
    assert flex.block_mask(causal(), docs, docs, 2) is kept
    ids[0, 32:] = 1  # documents refilled in place (the bug: the old tile table was reused)
    assert flex.block_mask(causal(), docs, docs, 2) is not kept
    user = Mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx)  # it may read anything: never kept
    assert flex.block_mask(user, line, line, 2) is not flex.block_mask(user, line, line, 2)


@pytest.mark.cuda
def test_on_cuda_a_window_takes_flex_and_equals_the_explicit_path() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 64, 4096, 0.0, num_heads=4, window=128).cuda().eval()
    x = torch.randn(2, 1024, 64, device="cuda")
    with torch.no_grad(), mock.patch.object(fused.flex_attention, "attend",
                                            wraps=flex.attend) as spy:  # fmt: skip
        got = mha(x)
        explicit, _ = mha(x, need_weights=True)
    assert spy.called
    assert_close(got, explicit, atol=2e-5, rtol=2e-5)


def test_one_query_keeps_sdpas_mask_row_where_flex_may_take_the_call() -> None:
    """A decode step over per-row positions: SDPA with `(b, 1, 1, S)`, a step one CUDA graph
    can hold; more queries, or a modifier without an additive form, go to FlexAttention."""
    from attention.layer.softcap import softcap

    rule = causal() & window(8)
    assert plan(rule, 1, 40, start=39, per_row=True, flex=True).kind == "mask"
    assert plan(rule, 2, 40, start=38, per_row=True, flex=True).kind == "flex"
    assert plan(rule, 1, 40, start=39, score_mods=[softcap(30.0)], flex=True).kind == "flex"
