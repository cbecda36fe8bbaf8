"""FlashAttention in tiles and split-KV decoding, against autograd through the explicit formula.

Every case runs in float64 and is held to 1e-10: the output and the gradients of `q`, `k` and
`v` of [`flash_attention`][attention.layer.tiled.flash_attention] against autograd through
[`explicit_attention`][attention.derivation.core.explicit_attention] with the same mask (as
`visible` evaluates it) and the same modifiers (bound as the layer binds them).
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import Tensor

from attention.derivation.core import explicit_attention
from attention.layer.alibi import alibi
from attention.layer.fused import bind
from attention.layer.masks import Mask, causal, documents, padding, sinks, window
from attention.layer.softcap import softcap
from attention.layer.split_kv import merge, split_kv_attention
from attention.layer.testing import saved_bytes
from attention.layer.tiled import (
    FULL,
    PARTIAL,
    SKIPPED,
    counting_tiles,
    flash_attention,
    tile_grid,
)
from attention.layer.tokens import Tokens, visible

ATOL = 1e-10
B, H, H_KV, D = 2, 4, 2, 8


def qkv(num_queries: int, num_keys: int, seed: int = 0, h_kv: int = H_KV) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, num_queries, D), (B, h_kv, num_keys, D), (B, h_kv, num_keys, D)]
    return [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]


def explicit(q: Tensor, k: Tensor, v: Tensor, mask: Mask, mods: tuple, q_pos: Tokens,
             k_pos: Tokens) -> Tensor:  # fmt: skip
    """The formula, all at once: keys repeated per group, the mask at every pair."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    seen = visible(mask, q_pos, k_pos, num_heads=q.shape[1])
    score_mod = bind(mods, q_pos.line, k_pos.line, q.shape[0], q.shape[1]) if mods else None
    out, _ = explicit_attention(q, k, v, seen, score_mod=score_mod)
    return out


def tokens(line: Tensor, docs: Tensor | None = None) -> Tokens:
    return Tokens(B, line.shape[-1], line.device, given=line, docs=docs)


def assert_same(mask: Mask, mods: tuple, q_line: Tensor, k_line: Tensor,
                docs: tuple[Tensor, Tensor] | None = None, block: tuple[int, int] = (4, 4),
                ) -> None:  # fmt: skip
    """Output and gradients of the tiled pass and of the formula, 1e-10 apart."""
    q, k, v = qkv(q_line.shape[-1], k_line.shape[-1])
    q_tok = tokens(q_line, None if docs is None else docs[0])
    k_tok = tokens(k_line, None if docs is None else docs[1])
    ours = flash_attention(q, k, v, mask=mask, score_mods=mods, q_positions=q_tok,
                           k_positions=k_tok, block_q=block[0], block_k=block[1])  # fmt: skip
    theirs = explicit(q, k, v, mask, mods, q_tok, k_tok)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
    grad = torch.randn_like(ours)
    mine = torch.autograd.grad(ours, (q, k, v), grad)
    ref = torch.autograd.grad(theirs, (q, k, v), grad)
    for name, a, b in zip("qkv", mine, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"d{name}")


CASES = {
    "causal": (causal(), ()),
    "window": (window(5), ()),
    "sinks": (causal() & (window(4) | sinks(2)), ()),
    "alibi": (causal(), (alibi(H),)),
    "softcap": (window(6), (softcap(2.0),)),
    "user": (causal() & Mask(lambda b, h, q, kv: (q + kv) % 3 != 1), ()),
    "everything": (None, ()),
}


@pytest.mark.parametrize("num_tokens", [16, 19])  # a multiple of the tiles, and not
@pytest.mark.parametrize("case", CASES)
def test_equals_explicit(case: str, num_tokens: int) -> None:
    mask, mods = CASES[case]
    line = torch.arange(num_tokens)
    assert_same(mask if mask is not None else Mask(lambda b, h, q, kv: q >= 0), mods, line, line)


@pytest.mark.parametrize("case", ["causal", "sinks", "alibi"])
def test_positions_other_than_zero_to_t(case: str) -> None:
    """A chunk at 30 .. 36 over keys 20 .. 36 (a cache's), and rows with their own positions."""
    mask, mods = CASES[case]
    assert_same(mask, mods, torch.arange(30, 37), torch.arange(20, 37), block=(3, 5))
    rows = torch.stack([torch.arange(5, 18), torch.arange(40, 53)])  # (B, 13)
    assert_same(mask, mods, rows, rows, block=(4, 3))


def test_padding_as_positions_and_as_a_mask() -> None:
    """Left padding as position -1 (a padded query gets zeros), and `padding(kpm)` by slot."""
    line = torch.stack([torch.arange(12), torch.cat((torch.full((5,), -1), torch.arange(7)))])
    assert_same(causal(), (), line, line, block=(4, 4))
    kpm = torch.zeros(B, 12, dtype=torch.bool)
    kpm[1, 9:] = True  # right padding of row 1
    assert_same(causal() & padding(kpm), (alibi(H),), torch.arange(12), torch.arange(12))


def test_documents_as_a_mask_and_as_tokens() -> None:
    ids = torch.tensor([[0] * 6 + [1] * 7, [0] * 3 + [1] * 3 + [2] * 7])
    line = torch.arange(13)
    assert_same(causal() & documents(ids), (), line, line, block=(4, 5))
    assert_same(causal(), (), line, line, docs=(ids, ids), block=(5, 4))


def test_gradcheck_tiny() -> None:
    """torch's finite differences, on 5 tokens in tiles of 2, two query heads reading one
    key/value head, with ALiBi (the soft cap's derivative: `test_equals_explicit`)."""
    q = torch.randn(1, 2, 5, 2, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 5, 2, dtype=torch.float64, requires_grad=True) for _ in "kv")

    def f(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return flash_attention(q, k, v, mask=causal(), score_mods=[alibi(2)], block_q=2, block_k=2)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_causal_tiles_skipped_and_full() -> None:
    """16 tokens in tiles of 4: 6 tiles above the diagonal skipped, 6 below it computed
    without a mask, the 4 on it masked; forward and backward alike."""
    q, k, v = qkv(16, 16)
    with counting_tiles() as counts:
        flash_attention(q, k, v, mask=causal(), block_q=4, block_k=4).sum().backward()
    for which in ("forward", "backward"):
        tally = counts[which]
        assert (tally.skipped, tally.computed, tally.full) == (6, 10, 6), which
    grid = tile_grid(causal(), torch.arange(16), torch.arange(16), block_q=4, block_k=4)
    above = torch.ones(4, 4, dtype=torch.bool).triu(1)  # key tile after the query tile
    assert grid.diagonal().eq(PARTIAL).all()
    assert grid[above].eq(SKIPPED).all() and grid[above.T].eq(FULL).all()


def test_window_skips_what_lies_beyond_its_reach() -> None:
    """window(4), 32 tokens, tiles of 4: query tile n sees key tiles n - 1 and n only."""
    pos = torch.arange(32)
    grid = tile_grid(window(4), pos, pos, block_q=4, block_k=4)
    computed = grid != SKIPPED
    assert computed.sum() == 8 + 7
    assert computed.diagonal().all() and computed.diagonal(-1).all()
    with_sinks = tile_grid(causal() & (window(4) | sinks(2)), pos, pos, block_q=4, block_k=4)
    assert (with_sinks[:, 0] != SKIPPED).all()  # the sinks' tile: seen by every query tile
    assert (with_sinks != SKIPPED).sum() == 8 + 7 + 6


def test_a_user_mask_has_no_bounds_so_nothing_is_skipped() -> None:
    pos = torch.arange(8)
    grid = tile_grid(Mask(lambda b, h, q, kv: kv <= q), pos, pos, block_q=4, block_k=4)
    assert grid.eq(PARTIAL).all()


@pytest.mark.parametrize("num_tokens", [64, 128, 256])
def test_backward_saves_no_t_by_t_matrix(num_tokens: int) -> None:
    """What autograd keeps: the tiled pass Q, K, V, O, L and the positions, exactly; the
    explicit one at least the T x T weights per head."""
    q, k, v = qkv(num_tokens, num_tokens)
    tiled = saved_bytes(lambda: flash_attention(q, k, v, mask=causal()))
    per_token = 8 * (B * H * D + 2 * B * H_KV * D + B * H * D + B * H) + 2 * 8  # q k v O L pos
    assert tiled == per_token * num_tokens
    line = torch.arange(num_tokens)
    full = saved_bytes(lambda: explicit(q, k, v, causal(), (), tokens(line), tokens(line)))
    assert full >= 8 * B * H * num_tokens**2


def test_split_kv_equals_one_pass() -> None:
    """One query at position 99 over 100 keys, in 1 .. 7 chunks, on 1 or 3 threads."""
    q, k, v = (t.detach() for t in qkv(1, 100))
    for mask, mods in [(causal(), (alibi(H),)), (causal() & (window(30) | sinks(3)), ())]:
        one = flash_attention(q, k, v, mask=mask, score_mods=mods, block_k=100)
        for num_splits in (1, 3, 7):
            for workers in (1, 3):
                out = split_kv_attention(q, k, v, num_splits=num_splits, mask=mask,
                                         score_mods=mods, workers=workers)  # fmt: skip
                torch.testing.assert_close(out, one, atol=ATOL, rtol=0)


def test_merge_of_halves_is_the_whole_and_ignores_an_empty_part() -> None:
    scores = torch.randn(3, 10, dtype=torch.float64)  # 3 queries, 10 keys
    values = torch.randn(10, 2, dtype=torch.float64)
    whole = torch.softmax(scores, -1) @ values

    def part(lo: int, hi: int) -> tuple[Tensor, Tensor]:
        s = scores[:, lo:hi]
        return torch.softmax(s, -1) @ values[lo:hi], torch.logsumexp(s, -1)

    (o1, l1), (o2, l2) = part(0, 4), part(4, 10)
    empty = (torch.zeros(3, 2, dtype=torch.float64), torch.full((3,), -math.inf).double())
    out, lse = merge([o1, o2, empty[0]], [l1, l2, empty[1]])
    torch.testing.assert_close(out, whole, atol=ATOL, rtol=0)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=ATOL, rtol=0)
    nothing, lse = merge([empty[0]], [empty[1]])
    assert nothing.abs().max() == 0 and lse.isneginf().all()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"q": torch.zeros(2, 3, 4)}, ValueError, "q must have 4 dimensions"),
        ({"k": torch.zeros(1, 2, 5, 4, dtype=torch.float32)}, TypeError, "k must have dtype"),
        (
            {
                "k": torch.zeros(1, 3, 5, 4, dtype=torch.float64),
                "v": torch.zeros(1, 3, 5, 4, dtype=torch.float64),
            },
            ValueError,
            "multiple of k's heads",
        ),
        ({"v": torch.zeros(1, 2, 6, 4, dtype=torch.float64)}, ValueError, "v must be"),
        ({"block_q": 0}, ValueError, "block_q must be >= 1"),
        ({"block_k": 2.0}, TypeError, "block_k must be an int"),
        ({"scale": -1.0}, ValueError, "scale must be"),
        ({"q_positions": torch.zeros(5)}, TypeError, "q_positions must hold integer"),
        ({"k_positions": torch.arange(4)}, ValueError, "k_positions must have shape (5,)"),
        ({"mask": 3}, TypeError, "mask must be a Mask"),
        ({"score_mods": [3]}, TypeError, "score_mods[0]"),
        ({"score_mods": [lambda s, b, h, q, kv: s[..., :1]]}, ValueError, "the scores' shape"),
    ],
)
def test_bad_input_is_named(kwargs: dict, error: type, words: str) -> None:
    args = {"q": torch.zeros(1, 2, 5, 4, dtype=torch.float64),
            "k": torch.zeros(1, 2, 5, 4, dtype=torch.float64),
            "v": torch.zeros(1, 2, 5, 4, dtype=torch.float64), **kwargs}  # fmt: skip
    with pytest.raises(error, match=re.escape(words)):
        flash_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_split_kv_bad_input_is_named() -> None:
    q, k, v = (t.detach() for t in qkv(1, 10))
    with pytest.raises(ValueError, match="num_splits must be at most num_keys=10, got 11"):
        split_kv_attention(q, k, v, num_splits=11)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        split_kv_attention(q, k, v, num_splits=2, workers=0)
    with pytest.raises(ValueError, match="merge needs one lse per output"):
        merge([q], [])


def test_a_nan_or_infinite_score_is_nan_as_in_the_formula_not_a_row_of_zeros() -> None:
    q, k, v = (t.detach() for t in qkv(6, 6))
    q[0, 1, 2, 0] = math.nan  # one query's score against every key is NaN
    k[1, 0, 3, 0] = math.inf  # one key scores +-inf against every query of its group
    want = explicit(q, k, v, causal(), (), tokens(torch.arange(6)), tokens(torch.arange(6)))
    for got in (flash_attention(q, k, v, mask=causal(), block_q=4, block_k=4),
                split_kv_attention(q, k, v, mask=causal(), num_splits=3)):  # fmt: skip
        assert torch.equal(got.isnan(), want.isnan())  # NaN exactly where the formula has it
        assert got[0, 1, 2].isnan().all()  # the NaN query's row
        assert got[1, :2, 3:].isnan().any()  # +inf - inf where the key scores +inf
        finite = ~want.isnan()
        assert torch.allclose(got[finite], want[finite], rtol=0, atol=ATOL)


def test_a_missing_token_is_read_by_nothing_not_even_its_nan() -> None:
    q, k, v = (t.detach() for t in qkv(6, 6))
    line = torch.tensor([[0, 1, 2, -1, 4, 5], [0, -1, 2, 3, 4, 5]])  # -1: no token there
    clean = [t.clone().requires_grad_() for t in (q, k, v)]
    dirty = [t.clone() for t in (q, k, v)]
    dirty[1][0, :, 3], dirty[2][1, :, 1] = math.nan, math.inf  # a missing token's key, value
    dirty = [t.requires_grad_() for t in dirty]
    outs = []
    for leaves in (clean, dirty):
        out = flash_attention(*leaves, mask=causal(), q_positions=torch.arange(6),
                              k_positions=line, block_q=2, block_k=2)  # fmt: skip
        out.sum().backward()
        outs.append(out)
    assert torch.allclose(outs[1], outs[0], rtol=0, atol=ATOL)
    for c, d in zip(clean, dirty, strict=True):
        assert c.grad is not None and d.grad is not None
        assert torch.allclose(d.grad, c.grad, rtol=0, atol=ATOL)
    assert dirty[1].grad is not None and dirty[1].grad[0, :, 3].abs().max() == 0


def test_merge_and_partial_backward_refuse_what_does_not_fit() -> None:
    from attention.layer.split_kv import partial_attention, partial_backward

    q, k, v = (t.detach() for t in qkv(5, 6))
    o, lse = partial_attention(q, k, v)
    with pytest.raises(ValueError, match=r"lses\[1\] must have shape \(2, 4, 5\), got \(1, 4, 5\)"):
        merge([o, o], [lse, lse[:1]])  # broadcasting would have mixed the rows
    with pytest.raises(ValueError, match=r"outputs\[1\] must have shape \(2, 4, 5, 8\), got"):
        merge([o, o[..., :1, :]], [lse, lse])
    with pytest.raises(TypeError, match=r"lses\[0\] must have dtype torch.float64"):
        merge([o], [lse.float()])
    with pytest.raises(TypeError, match=r"outputs\[0\] must be a torch.Tensor, got NoneType"):
        merge([None, o], [lse, lse])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"outputs\[0\] must be a floating-point tensor"):
        merge([o.long()], [lse])
    with pytest.raises(
        ValueError, match=r"q_positions must have 1 or 2 dimensions, got shape \(\)"
    ):
        tile_grid(causal(), torch.tensor(3), torch.arange(4))
    with pytest.raises(TypeError, match=r"outputs must be a list or tuple of tensors"):
        merge(o.numpy(), [lse])  # type: ignore[arg-type]
    stacked, _ = merge(torch.stack([o, o]), torch.stack([lse, lse]))  # a tensor: one per set
    assert torch.allclose(stacked, merge([o, o], [lse, lse])[0], rtol=0, atol=ATOL)
    d_out, delta = torch.ones_like(o), lse.clone()
    for args, words in (
        ((d_out[..., :1], lse, delta), r"d_out must have shape \(2, 4, 5, 8\)"),
        ((d_out, lse[..., :1], delta), r"lse must have shape \(2, 4, 5\), got \(2, 4, 1\)"),
        ((d_out, lse, delta[..., :1]), r"delta must have shape \(2, 4, 5\)"),
    ):
        with pytest.raises(ValueError, match=words):
            partial_backward(q, k, v, *args)
    with pytest.raises(TypeError, match=r"d_out must have dtype torch.float64"):
        partial_backward(q, k, v, d_out.float(), lse, delta)


def test_a_numpy_scale_is_a_number() -> None:
    import numpy as np

    q, k, v = (t.detach() for t in qkv(4, 4))
    want = flash_attention(q, k, v, scale=0.5)
    assert torch.equal(flash_attention(q, k, v, scale=np.float32(0.5)), want)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0, got True"):
        flash_attention(q, k, v, scale=True)


def test_no_heads_or_an_empty_head_is_refused_by_name() -> None:
    q, k, v = (t.detach() for t in qkv(4, 4))
    with pytest.raises(
        ValueError, match=r"at least one head and head_dim >= 1, got q \(2, 4, 4, 0\)"
    ):
        flash_attention(q[..., :0], k[..., :0], v)
    with pytest.raises(ValueError, match=r"at least one head .* k \(2, 0, 4, 8\)"):
        flash_attention(q, k[:, :0], v[:, :0])
