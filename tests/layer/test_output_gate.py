"""Qwen3-Next's gated attention: the heads' concatenation times sigma(x W_g), before W_o."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention.layer.multihead import MultiHeadAttention
from attention.layer.testing import reference_attention

EXACT = {"rtol": 0.0, "atol": 1e-12}


def gated(**options: object) -> MultiHeadAttention:
    torch.manual_seed(0)
    att = MultiHeadAttention(16, 16, 32, 0.0, num_heads=4, num_kv_heads=2, rope=True,
                             output_gate=True, **options).double().eval()  # type: ignore[arg-type]  # fmt: skip
    assert att.W_gate is not None
    with torch.no_grad():
        att.W_gate.weight.mul_(4.0)  # gates well away from 1/2
    return att


@pytest.mark.parametrize("need_weights", [False, True])
def test_equal_to_the_definition_with_padding_and_positions(need_weights: bool) -> None:
    att = gated(qkv_bias=True)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    pad = torch.tensor([[True, False, False, False, False, False], [False] * 6])
    positions = torch.arange(6).expand(2, 6) + torch.tensor([[3], [10]])  # not 0..T-1
    out = att(x, pad, need_weights, positions=positions)
    out = out[0] if need_weights else out
    assert_close(out, reference_attention(att, x, pad, positions=positions), **EXACT)
    assert att.W_gate is not None and att.W_gate.bias is not None  # qkv_bias: a gate bias
    # the gate is what differs: the same weights without it give another output
    plain = MultiHeadAttention(16, 16, 32, 0.0, num_heads=4, num_kv_heads=2, rope=True,
                               qkv_bias=True).double().eval()  # fmt: skip
    plain.load_state_dict({k: v for k, v in att.state_dict().items() if "W_gate" not in k})
    assert (plain(x, pad, positions=positions) - out)[~pad].abs().max() > 0.1


def test_cached_decoding_equals_the_whole_sequence_and_gradients_reach_the_gate() -> None:
    att = gated()
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True)
    cache = att.init_cache(2)
    with torch.no_grad():
        steps = [att(x[:, :4], cache=cache)] + [att(x[:, t : t + 1], cache=cache)
                                                for t in range(4, 7)]  # fmt: skip
    whole = att(x)
    assert_close(torch.cat(steps, dim=1), whole, **EXACT)
    whole.square().sum().backward()
    assert att.W_gate is not None and att.W_gate.weight.grad is not None
    assert att.W_gate.weight.grad.abs().min() > 0


def test_a_gate_that_is_not_a_bool_is_refused() -> None:
    with pytest.raises(TypeError, match=r"output_gate must be True or False, got 'yes' \(str\)"):
        MultiHeadAttention(16, 16, 32, 0.0, num_heads=4, output_gate="yes")  # type: ignore[arg-type]
