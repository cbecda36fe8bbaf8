"""Ring attention on 2, 3 and 4 gloo processes equals attention over the whole sequence.

Each world size runs every case in one spawn (starting processes costs seconds): the outputs
and the gradients of q, k and v of every process's shard, against autograd through the
explicit formula over the whole sequence in one process, float64, to 1e-10.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from attention.layer.alibi import alibi
from attention.layer.masks import Mask, causal, documents, evaluate, indices, sinks, window
from attention.parallel import contiguous_shard, ring_attention, spawn, zigzag_shard
from attention.parallel.blocks import block_attention, block_backward, merge

B, H, H_KV, T, D, D_V = 2, 4, 2, 13, 4, 5
"""Two rows, four query heads reading two key/value heads, 13 tokens (no multiple of a shard)."""


def _checkerboard(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return (q + kv) % 3 != 1  # a user's mask: no bounds, nothing certain


def cases() -> dict[str, tuple[Mask, list[Any], Tensor]]:
    """Each case's mask, score modifiers and positions `(B, T)` (-1: padding)."""
    line = torch.arange(T).expand(B, T)
    padded = line.clone()
    padded[1] = torch.cat((torch.full((3,), -1), torch.arange(T - 3)))  # left padding
    ids = torch.tensor([0] * 5 + [1] * 4 + [2] * 4)  # three packed documents, by position
    return {
        "causal": (causal(), [], line),
        "window": (window(3), [], line),
        "sinks": (causal() & (window(3) | sinks(2)), [], line),
        "documents": (causal() & documents(ids), [], line),
        "padding": (causal(), [], padded),
        "alibi": (causal(), [alibi(H)], line),
        "user": (Mask(_checkerboard), [], line),
        "user_causal": (causal() & Mask(_checkerboard), [], line),
    }


def explicit(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, mask: Mask, mods: list[Any]) -> Tensor:
    """softmax(f(Q K^T / sqrt(d)) + M) V over the whole sequence; a query seeing nothing: 0."""
    group = q.shape[1] // k.shape[1]
    keys, values = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (B, H, T, d)
    s = q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    for mod in mods:
        s = mod(s, *indices(pos, pos, batch=B, num_heads=H))
    seen = evaluate(mask, pos, pos, num_heads=H, batch=B).expand_as(s)
    rows = seen.any(dim=-1, keepdim=True)
    s = torch.where(rows, s.masked_fill(~seen, -math.inf), 0.0)
    return torch.softmax(s, dim=-1) * rows @ values


def inputs() -> list[Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(B, H, T, D), (B, H_KV, T, D), (B, H_KV, T, D_V), (B, H, T, D_V)]
    return [torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes]


def errors(rank: int, world: int) -> dict[str, float]:
    """On one process: the largest error of the output and of dq, dk, dv, for every case."""
    q, k, v, d_out = inputs()
    found = {}
    for name, (mask, mods, pos) in cases().items():
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        explicit(*full, pos, mask, mods).backward(d_out)
        want = [explicit(*full, pos, mask, mods).detach()] + [t.grad for t in full]
        for layout, shard in (("contiguous", contiguous_shard), ("zigzag", zigzag_shard)):
            mine = [shard(t, pos, rank, world, dim=2)[0] for t in (q, k, v, d_out)]
            own = shard(q, pos, rank, world, dim=2)[1]  # (B, tokens): these tokens' positions
            leaves = [t.clone().requires_grad_() for t in mine[:3]]
            out = ring_attention(*leaves, own, mask=mask, score_mods=mods)
            out.backward(mine[3])
            got = [out.detach()] + [t.grad for t in leaves]
            expected = [shard(t, pos, rank, world, dim=2)[0] for t in want]
            worst = max(float((g - e).abs().max()) for g, e in zip(got, expected, strict=True))
            found[f"{name}/{layout}"] = worst
    return found


def bad_inputs(rank: int, world: int) -> list[str]:
    """Wrong shards on one process: the error every process raised, as text."""
    q, k, v, _ = [t[:, :, :4] for t in inputs()]
    pos = torch.arange(4)[None].expand(B, 4) + 4 * rank
    told = []
    for wrong in ("k", "positions", "mask", "overlap", "rule"):
        args = [q, k, v, pos]
        if wrong == "k" and rank == 1:
            args[:3] = [t[..., :3] for t in args[:3]]  # another head size on rank 1 only
        if wrong == "positions" and rank == 0:
            args[3] = pos[0]  # (tokens,) instead of (batch, tokens), on rank 0 only
        if wrong == "overlap":
            args[3] = torch.arange(4)[None].expand(B, 4)  # each shard's own 0..3: overlapping
        mask: Any = "causal" if wrong == "mask" and rank == 1 else None  # a str, on rank 1
        if wrong == "rule":
            mask = window(2) if rank == 1 else causal()  # each computes its half its own way
        try:
            ring_attention(*args, mask=mask)
        except (TypeError, ValueError) as error:
            told.append(f"{type(error).__name__}: {error}")
    dist.barrier()  # still in step: nobody hung
    return told


def _both(rank: int, world: int) -> tuple[dict[str, float], list[str]]:
    return errors(rank, world), bad_inputs(rank, world) if world == 2 else []


@pytest.mark.parametrize(
    "world",
    [pytest.param(2, marks=pytest.mark.heavy(seconds=20)),
     pytest.param(3, marks=pytest.mark.heavy(seconds=30)),
     pytest.param(4, marks=pytest.mark.heavy(seconds=40))],
)  # fmt: skip
def test_ring_equals_attention_over_the_whole_sequence(world: int) -> None:
    results = spawn(_both, world, timeout=120)
    for rank, (found, _) in enumerate(results):
        assert len(found) == 16
        assert max(found.values()) < 1e-10, (rank, found)
    if world == 2:
        for told in (r[1] for r in results):  # the same error on both processes
            assert len(told) == 5
            assert "q: every process needs the same" in told[0]
            assert "rank 0 has (2, 4, 4, 4), rank 1 has (2, 4, 4, 3)" in told[0]
            assert "rank 0" in told[1] and "positions must be" in told[1]
            assert told[2].startswith("TypeError: ring_attention: rank 1: mask must be a Mask")
            assert "positions: position 0 of row 0 is on rank 0 and rank 1" in told[3]
            assert (
                "mask: every process needs the same mask and score modifiers: rank 0 has "
                "mask causal(), score_mods [], rank 1 has mask window(2)"
            ) in told[4]


def test_no_process_group_is_a_runtime_error_naming_group() -> None:
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="group: no process group is initialised"):
        ring_attention(q, q, q, torch.arange(2)[None])


@pytest.mark.parametrize("name", list(cases()))
def test_blocks_merged_equal_attention_in_one_process(name: str) -> None:
    """The ring's arithmetic without the ring: keys in three blocks, each block's output and
    log-sum-exp merged, and each block's gradients summed, equal the whole sequence's."""
    mask, mods, pos = cases()[name]
    q, k, v, d_out = inputs()
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = explicit(*full, pos, mask, mods)
    want.backward(d_out)
    out, lse = torch.zeros_like(want), torch.full((B, H, T), -math.inf, dtype=torch.float64)
    parts = [slice(0, 4), slice(4, 9), slice(9, T)]
    for part in parts:
        block = block_attention(q, k[:, :, part], v[:, :, part], pos, pos[:, part], mask, mods)
        out, lse = merge([out, block[0]], [lse, block[1]])
    assert torch.allclose(out, want.detach(), rtol=0, atol=1e-12)
    delta = (d_out * out).sum(-1)
    dq = torch.zeros_like(q)
    for part in parts:
        grads = block_backward(q, k[:, :, part], v[:, :, part], pos, pos[:, part], mask, mods,
                               d_out, lse, delta)  # fmt: skip
        dq += grads[0]
        assert full[1].grad is not None and full[2].grad is not None
        assert torch.allclose(grads[1], full[1].grad[:, :, part], rtol=0, atol=1e-12)
        assert torch.allclose(grads[2], full[2].grad[:, :, part], rtol=0, atol=1e-12)
    assert full[0].grad is not None
    assert torch.allclose(dq, full[0].grad, rtol=0, atol=1e-12)


@pytest.fixture
def alone() -> Iterator[None]:
    """A gloo group of one process, this one (the ring of one: no transfer)."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=30))  # fmt: skip
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_ring_of_one_process_is_attention_and_checks_its_shard(alone: None) -> None:
    mask, mods, pos = cases()["sinks"]
    q, k, v, d_out = inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ring_attention(*leaves, pos, mask=mask)
    out.backward(d_out)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = explicit(*full, pos, mask, mods)
    want.backward(d_out)
    assert torch.allclose(out, want, rtol=0, atol=1e-12)
    for mine, theirs in zip(leaves, full, strict=True):
        assert mine.grad is not None and theirs.grad is not None
        assert torch.allclose(mine.grad, theirs.grad, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"rank 0: positions must be integers of shape"):
        ring_attention(q, k, v, pos[0])
    with pytest.raises(ValueError, match=r"integers of shape \(batch, tokens\) = \(2, 13\), "
                                         r"got torch.float32 \(2, 13\)"):  # fmt: skip
        ring_attention(q, k, v, pos.float())
    again = pos.clone()
    again[1, 5] = again[1, 4]  # one row's token at a position another holds
    with pytest.raises(ValueError, match=r"positions: position 4 of row 1 is twice on rank 0"):
        ring_attention(q, k, v, again)
    with pytest.raises(ValueError, match=r"rank 0: k must have q's head_dim=4"):
        ring_attention(q, k[..., :3], v, pos)
    with pytest.raises(TypeError, match=r"rank 0: mask must be a Mask"):
        ring_attention(q, k, v, pos, mask="causal")  # type: ignore[arg-type]
