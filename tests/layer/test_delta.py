"""The delta rule and Gated DeltaNet: recurrent = chunked = parallel = the definition, values
and gradients (float64, 1e-10); the layer's decode = its prefill with a state of fixed size;
and the layer equal to transformers' `Qwen3NextGatedDeltaNet`.

transformers computes the delta rule and the gated RMSNorm in float32 whatever the input's
dtype (`torch_chunk_gated_delta_rule` casts q, k, v, beta and g to float32, and so does
`Qwen3NextRMSNormGated`, and `A_log.float()` the decay): as it runs, the comparison is at
float32's precision, 1e-5; with those casts pointed at float64 (`tests.float64`), both
evaluate the same formulas in float64 and agree to 1e-10.
"""

from __future__ import annotations

import contextlib
import importlib.util
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.testing import assert_close

import attention
from attention.layer.delta import delta_chunked, delta_parallel, delta_recurrent
from attention.layer.gated_delta import GatedDeltaNet, GatedDeltaState
from tests.float64 import float64_casts

EXACT = {"atol": 1e-10, "rtol": 0.0}
FLOAT32 = {"atol": 1e-5, "rtol": 1e-5}  # transformers computes in float32
B, H, D_K, D_V = 2, 3, 4, 5
D_IN, H_K, H_V, K_DIM, V_DIM = 32, 2, 4, 8, 6


def inputs(T: int, seed: int = 0) -> tuple[Tensor, ...]:
    """q, k (unit length), v, beta in (0, 1), g <= 0."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D_K, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, D_V, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    g = -torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    return q, torch.nn.functional.normalize(k, dim=-1), v, beta, g


def reference(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None) -> Tensor:
    """The definition, a loop with explicit matrices:
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t."""
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    S = torch.zeros(*q.shape[:2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    eye = torch.eye(q.shape[-1], dtype=q.dtype)
    for t in range(q.shape[2]):
        kt, bt = k[:, :, t, :, None], beta[:, :, t, None, None]
        alpha = 1.0 if g is None else g[:, :, t, None, None].exp()
        S = alpha * (eye - bt * kt @ kt.transpose(-1, -2)) @ S + bt * kt @ v[:, :, t, None, :]
        out[:, :, t] = (S.transpose(-1, -2) @ q[:, :, t, :, None]).squeeze(-1)
    return out


@pytest.mark.parametrize("T", [8, 11])
@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
def test_three_forms_equal_the_definition(T: int, gated: bool) -> None:
    q, k, v, beta, g = inputs(T)
    gate = g if gated else None
    expected = reference(q, k, v, beta, gate)
    recurrent, state = delta_recurrent(q, k, v, beta, gate)
    assert_close(recurrent, expected, **EXACT)
    parallel, parallel_state = delta_parallel(q, k, v, beta, gate)
    assert_close(parallel, expected, **EXACT)
    assert_close(parallel_state, state, **EXACT)
    for chunk_size in (1, 4, 64):
        chunked, chunked_state = delta_chunked(q, k, v, beta, gate, chunk_size=chunk_size)
        assert_close(chunked, expected, **EXACT)
        assert_close(chunked_state, state, **EXACT)


def test_a_carried_state_continues_the_sequence() -> None:
    q, k, v, beta, g = inputs(11)
    whole, end = delta_recurrent(q, k, v, beta, g)
    first, rest = (slice(None, 6), slice(6, None))
    _, state = delta_chunked(*(t[:, :, first] for t in (q, k, v, beta, g)), chunk_size=4)
    tail, tail_end = delta_chunked(
        *(t[:, :, rest] for t in (q, k, v, beta, g)), state, chunk_size=4
    )
    assert_close(tail, whole[:, :, rest], **EXACT)
    assert_close(tail_end, end, **EXACT)


def test_the_delta_rule_overwrites_where_linear_attention_adds() -> None:
    """Store v1 under k, then v2 under the same k with beta = 1: DeltaNet reads back v2."""
    k = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64).expand(1, 1, 2, 3)
    v = torch.tensor([[1.0, 2.0], [5.0, -1.0]], dtype=torch.float64).expand(1, 1, 2, 2)
    beta = torch.ones(1, 1, 2, dtype=torch.float64)
    out, _ = delta_recurrent(k, k, v, beta)
    assert_close(out[0, 0, 1], v[0, 0, 1], **EXACT)


@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
def test_gradients_equal_across_forms(gated: bool) -> None:
    q, k, v, beta, g = (t.requires_grad_() for t in inputs(9))
    gate = g if gated else None
    wrt = (q, k, v, beta, g) if gated else (q, k, v, beta)
    cotangent = torch.randn(B, H, 9, D_V, dtype=torch.float64)
    outputs = [delta_recurrent(q, k, v, beta, gate)[0], delta_chunked(q, k, v, beta, gate, chunk_size=4)[0],
               delta_parallel(q, k, v, beta, gate)[0]]  # fmt: skip
    grads = [torch.autograd.grad(out, wrt, cotangent) for out in outputs]
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            assert_close(b, a, **EXACT)


def layer(seed: int = 0, chunk_size: int = 4) -> GatedDeltaNet:
    torch.manual_seed(seed)
    net = GatedDeltaNet(D_IN, num_k_heads=H_K, num_v_heads=H_V, head_k_dim=K_DIM,
                        head_v_dim=V_DIM, chunk_size=chunk_size).double()  # fmt: skip
    with torch.no_grad():
        for param in net.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    return net


def hidden(T: int, seed: int = 1) -> Tensor:
    return torch.randn(
        B, T, D_IN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


@pytest.mark.parametrize("prefill", [0, 5])
def test_decode_step_by_step_equals_the_whole_sequence(prefill: int) -> None:
    net, x = layer(), hidden(11)
    with torch.no_grad():
        whole = net(x)
        state = net.init_state(B)
        parts = [net(x[:, :prefill], state=state)] if prefill else []
        parts += [net(x[:, t : t + 1], state=state) for t in range(prefill, 11)]
    assert_close(torch.cat(parts, dim=1), whole, **EXACT)


def test_the_decode_state_does_not_grow() -> None:
    net = layer()
    sizes = []
    with torch.no_grad():
        for T in (8, 64):
            state = net.init_state(B)
            net(hidden(T), state=state)
            sizes.append(state.nbytes)
    conv = B * (2 * H_K * K_DIM + H_V * V_DIM) * (net.conv_kernel_size - 1)
    assert sizes == [(conv + B * H_V * K_DIM * V_DIM) * 8] * 2


def tiny_qwen3_next(transformers: ModuleType) -> tuple[Any, nn.Module]:
    config = transformers.Qwen3NextConfig(
        hidden_size=D_IN, linear_num_key_heads=H_K, linear_num_value_heads=H_V,
        linear_key_head_dim=K_DIM, linear_value_head_dim=V_DIM, linear_conv_kernel_dim=4,
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], vocab_size=50,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=16,
        moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    torch.manual_seed(0)
    module = Qwen3NextGatedDeltaNet(config, layer_idx=0).double()
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn_like(param) * 0.3)
    return config, module


@pytest.mark.heavy(seconds=30)
@pytest.mark.parametrize("in_float64", [False, True])
def test_equal_to_transformers_prefill_and_decode(in_float64: bool) -> None:
    transformers = pytest.importorskip("transformers", minversion="5.24")
    # no flash-linear-attention, no causal-conv1d: transformers runs its torch fallbacks
    assert (
        importlib.util.find_spec("fla") is None
        and importlib.util.find_spec("causal_conv1d") is None
    )
    config, theirs = tiny_qwen3_next(transformers)
    ours = attention.from_hf(theirs)
    assert isinstance(ours, GatedDeltaNet)
    x = hidden(11)
    tol = EXACT if in_float64 else FLOAT32
    casts = float64_casts(tensor_float=True) if in_float64 else contextlib.nullcontext()
    with torch.no_grad(), casts:
        assert_close(ours(x), theirs(x), **tol)
        cache, state = transformers.DynamicCache(config=config), ours.init_state(B)
        assert_close(ours(x[:, :5], state=state), theirs(x[:, :5], cache=cache), **tol)
        for t in range(5, 11):
            step = x[:, t : t + 1]
            assert_close(ours(step, state=state), theirs(step, cache=cache), **tol)
    assert_close(state.recurrent, cache.layers[0].recurrent_states[0].to(torch.float64), **tol)


def test_from_hf_refuses_an_unknown_module_by_name() -> None:
    with pytest.raises(TypeError, match=r"Qwen3NextGatedDeltaNet.*got Linear"):
        attention.from_hf(nn.Linear(2, 2))


@pytest.mark.parametrize("chunk_size", [0, -1])
def test_a_chunk_size_below_one_is_refused(chunk_size: int) -> None:
    with pytest.raises(ValueError, match=f"chunk_size must be >= 1, got {chunk_size}"):
        delta_chunked(*inputs(4), chunk_size=chunk_size)
    with pytest.raises(ValueError, match=f"chunk_size must be >= 1, got {chunk_size}"):
        GatedDeltaNet(
            D_IN, num_k_heads=1, num_v_heads=1, head_k_dim=4, head_v_dim=4, chunk_size=chunk_size
        )


def test_bad_states_and_shapes_are_refused() -> None:
    q, k, v, beta, g = inputs(4)
    with pytest.raises(
        ValueError,
        match=r"state must have shape \(B, H, d_k, d_v\) = \(2, 3, 4, 5\), got \(2, 3, 5, 4\)",
    ):
        delta_recurrent(q, k, v, beta, g, torch.zeros(B, H, D_V, D_K, dtype=q.dtype))
    with pytest.raises(
        ValueError, match=r"beta must have shape \(B, H, T\) = \(2, 3, 4\), got \(2, 3, 3\)"
    ):
        delta_chunked(q, k, v, beta[:, :, :3], g)
    with pytest.raises(
        ValueError, match=r"g must have shape \(B, H, T\) = \(2, 3, 4\), got \(2, 2, 4\)"
    ):
        delta_parallel(q, k, v, beta, g[:, :2])
    with pytest.raises(
        ValueError, match="num_v_heads must be a multiple of num_k_heads \\(2\\), got 3"
    ):
        GatedDeltaNet(D_IN, num_k_heads=2, num_v_heads=3, head_k_dim=4, head_v_dim=4)
    net = layer()
    wrong = GatedDeltaState(torch.zeros(B, 1, 3, dtype=torch.float64), net.init_state(B).recurrent)
    with pytest.raises(
        ValueError, match=r"state.conv must have shape \(2, 56, 3\), got \(2, 1, 3\)"
    ):
        net(hidden(3), state=wrong)
    state = net.init_state(B)
    with pytest.raises(
        ValueError, match=r"state.recurrent must keep shape \(2, 4, 8, 6\), got \(1, 4, 8, 6\)"
    ):
        state.update(state.conv, state.recurrent[:1])


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [("g", -torch.inf, r"g must be finite log decays <= 0 .* from -inf"),
     ("g", 3.0, r"g must be finite log decays <= 0 .* to 3"),
     ("g", torch.nan, r"g must be finite log decays <= 0"),
     ("beta", 7.0, r"beta must be write strengths in \[0, 1\], got values from .* to 7"),
     ("beta", -0.5, r"beta must be write strengths in \[0, 1\], got values from -0.5")],
)  # fmt: skip
def test_gates_out_of_their_range_are_refused_by_every_form(name: str, value: float,
                                                            words: str) -> None:  # fmt: skip
    q, k, v, beta, g = inputs(6)
    gates = {"beta": beta.clone(), "g": g.clone()}
    gates[name][0, 0, 2] = value  # g = -inf would be NaN in the chunked form's differences
    for form in (delta_recurrent, delta_chunked, delta_parallel):
        with pytest.raises(ValueError, match=words):
            form(q, k, v, gates["beta"], gates["g"])


def test_an_empty_batch_or_chunk_gives_empty_outputs_and_keeps_the_state() -> None:
    net, x = layer(), hidden(5)
    with torch.no_grad():
        state = net.init_state(B)
        net(x[:, :3], state=state)
        kept = [t.clone() for t in (state.conv, state.recurrent)]
        assert net(x[:, :0], state=state).shape == (B, 0, D_IN)
        assert net(x[:0]).shape == (0, 5, D_IN)
    assert torch.equal(state.conv, kept[0]) and torch.equal(state.recurrent, kept[1])
