"""Training across processes equals training in one: DDP, FSDP2 and ring attention, float64."""

from __future__ import annotations

import functools

import pytest
import torch

from attention import GPTModel, MultiHeadAttention
from attention.parallel.training import RingAttention, compare_training, ring_layers

CFG = {"vocab_size": 50, "context_length": 16, "emb_dim": 16, "n_heads": 4, "n_layers": 2,
       "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip


@pytest.mark.heavy(seconds=40)
def test_ddp_fsdp_and_ring_steps_equal_one_process() -> None:
    """Two gloo processes, the global batch (4 rows of 16 tokens): the ring's processes hold 8
    tokens of each row, the data-parallel ones 2 whole rows."""
    seq = torch.randint(0, 50, (4, 17), generator=torch.Generator().manual_seed(1))
    found = compare_training(functools.partial(GPTModel, CFG), seq[:, :-1], seq[:, 1:], steps=2)
    want = found["single"]["losses"]
    assert want[1] < want[0]  # it trains
    for how in ("ddp", "fsdp", "ring"):
        run = found[how]
        assert run["losses"] == pytest.approx(want, rel=0, abs=1e-12), how
        assert run["grad_error"] < 1e-12 and run["param_error"] < 1e-12, (how, run)


def test_ring_layers_wrap_every_attention_and_keep_the_parameters() -> None:
    model = GPTModel(CFG)
    names = [n for n, _ in model.named_parameters()]
    ring_layers(model)
    assert all(isinstance(block.att, RingAttention) for block in model.blocks)
    assert [n.replace("att.att.", "att.") for n, _ in model.named_parameters()] == names


def test_ring_attention_refuses_what_it_cannot_compute() -> None:
    with pytest.raises(ValueError, match="dropout 0"):
        RingAttention(MultiHeadAttention(8, 8, 4, dropout=0.1, num_heads=2))
    ring = RingAttention(MultiHeadAttention(8, 8, 4, dropout=0.0, num_heads=2))
    with pytest.raises(ValueError, match="needs positions"):
        ring(torch.zeros(1, 4, 8))


def test_ring_attention_gates_its_output_as_the_layer_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process: the ring's exchange replaced by causal attention over the local keys, so
    what is tested is the wrapper around it (projections, output gate, `out_proj`)."""

    def local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object, **__: object):  # type: ignore[no-untyped-def]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    monkeypatch.setattr("attention.parallel.training.ring_attention", local)
    torch.manual_seed(0)
    att = MultiHeadAttention(8, 8, 6, 0.0, num_heads=4, num_kv_heads=2, rope=True,
                             output_gate=True).double()  # fmt: skip
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    positions = torch.arange(6).expand(2, 6)
    out = RingAttention(att)(x, positions=positions)
    torch.testing.assert_close(out, att(x), rtol=0, atol=1e-12)
