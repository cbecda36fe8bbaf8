"""Linear attention: parallel = recurrent = chunked = the definition, values and gradients.

Every comparison is in float64 at 1e-10, at lengths that are and are not multiples of the
chunk.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from attention.layer.linear import (
    LinearState,
    elu_plus_one,
    linear_chunked,
    linear_parallel,
    linear_recurrent,
)

EXACT = {"atol": 1e-10, "rtol": 0.0}
B, H, D_K, D_V = 2, 3, 4, 5


def qkv(T: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D_K, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(B, H, T, D_V, generator=gen, dtype=torch.float64)


def reference(q: Tensor, k: Tensor, v: Tensor, normalize: bool) -> Tensor:
    """The definition, a loop over queries and keys:
    o_t = sum_{s<=t} phi(q_t).phi(k_s) v_s / sum_{s<=t} phi(q_t).phi(k_s)."""
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    fq, fk = elu_plus_one(q), elu_plus_one(k)
    for t in range(q.shape[2]):
        weights = [(fq[:, :, t] * fk[:, :, s]).sum(-1, keepdim=True) for s in range(t + 1)]
        out[:, :, t] = sum(w * v[:, :, s] for s, w in enumerate(weights))
        if normalize:
            out[:, :, t] /= sum(weights)
    return out


@pytest.mark.parametrize("T", [8, 11])
@pytest.mark.parametrize("normalize", [True, False])
def test_three_forms_equal_the_definition(T: int, normalize: bool) -> None:
    q, k, v = qkv(T)
    expected = reference(q, k, v, normalize)
    assert_close(linear_parallel(q, k, v, normalize=normalize), expected, **EXACT)
    recurrent, state = linear_recurrent(q, k, v, normalize=normalize)
    assert_close(recurrent, expected, **EXACT)
    for chunk_size in (1, 4, 64):
        chunked, chunked_state = linear_chunked(q, k, v, chunk_size=chunk_size, normalize=normalize)
        assert_close(chunked, expected, **EXACT)
        assert_close(chunked_state.S, state.S, **EXACT)
        assert_close(chunked_state.z, state.z, **EXACT)
    # the state is the definition's sums: S = sum_s phi(k_s) v_s^T, z = sum_s phi(k_s)
    assert_close(state.S, elu_plus_one(k).transpose(-1, -2) @ v, **EXACT)
    assert_close(state.z, elu_plus_one(k).sum(2), **EXACT)


def test_a_carried_state_continues_the_sequence() -> None:
    q, k, v = qkv(11)
    whole, whole_state = linear_recurrent(q, k, v)
    _, state = linear_chunked(q[:, :, :6], k[:, :, :6], v[:, :, :6], chunk_size=4)
    rest, end = linear_chunked(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], chunk_size=4, state=state)
    assert_close(rest, whole[:, :, 6:], **EXACT)
    assert_close(end.S, whole_state.S, **EXACT)
    step, _ = linear_recurrent(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], state=state)
    assert_close(step, whole[:, :, 6:], **EXACT)


def test_the_state_does_not_grow() -> None:
    sizes = {linear_recurrent(*qkv(T))[1].nbytes for T in (8, 64)}
    assert sizes == {(B * H * D_K * D_V + B * H * D_K) * 8}


def test_a_feature_map_is_an_argument() -> None:
    q, k, v = qkv(7)

    def relu_plus(x: Tensor) -> Tensor:
        return torch.relu(x) + 0.5

    A = (relu_plus(q) @ relu_plus(k).transpose(-1, -2)).tril()
    expected = A @ v / A.sum(-1, keepdim=True)
    assert_close(linear_parallel(q, k, v, feature_map=relu_plus), expected, **EXACT)
    chunked, _ = linear_chunked(q, k, v, chunk_size=3, feature_map=relu_plus)
    assert_close(chunked, expected, **EXACT)


@pytest.mark.parametrize("normalize", [True, False])
def test_gradients_equal_across_forms(normalize: bool) -> None:
    q, k, v = (t.requires_grad_() for t in qkv(9))
    cotangent = torch.randn(B, H, 9, D_V, dtype=torch.float64)
    outputs = [
        linear_parallel(q, k, v, normalize=normalize),
        linear_recurrent(q, k, v, normalize=normalize)[0],
        linear_chunked(q, k, v, chunk_size=4, normalize=normalize)[0],
    ]
    grads = [torch.autograd.grad(out, (q, k, v), cotangent) for out in outputs]
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            assert_close(b, a, **EXACT)


@pytest.mark.parametrize("chunk_size", [0, -2])
def test_a_chunk_size_below_one_is_refused(chunk_size: int) -> None:
    with pytest.raises(ValueError, match=f"chunk_size must be >= 1, got {chunk_size}"):
        linear_chunked(*qkv(4), chunk_size=chunk_size)


def test_a_state_of_the_wrong_size_is_refused() -> None:
    q, k, v = qkv(4)
    wrong = LinearState(
        torch.zeros(B, H, D_K, D_V + 1, dtype=q.dtype), torch.zeros(B, H, D_K, dtype=q.dtype)
    )
    message = r"state.S must have shape \(B, H, d_k, d_v\) of q and v = \(2, 3, 4, 5\), got \(2, 3, 4, 6\)"
    with pytest.raises(ValueError, match=message):
        linear_recurrent(q, k, v, state=wrong)
    with pytest.raises(TypeError, match="state must be a LinearState, got Tensor"):
        linear_chunked(q, k, v, state=torch.zeros(1))  # type: ignore[arg-type]


def test_mismatched_heads_and_dims_are_refused() -> None:
    q, k, v = qkv(4)
    with pytest.raises(
        ValueError, match=r"k must have q's shape .* \(2, 3, 4, 4\), got \(2, 2, 4, 4\)"
    ):
        linear_parallel(q, k[:, :2], v)
    with pytest.raises(
        ValueError, match=r"v must have q's \(B, H, T\) \(2, 3, 4\), got \(2, 3, 3\)"
    ):
        linear_recurrent(q, k, v[:, :, :3])
    with pytest.raises(TypeError, match="k"):
        linear_chunked(q, k.float(), v)


def test_a_query_with_no_weight_gets_zeros_not_nan_in_every_form() -> None:
    q, k, v = qkv(9)
    q[0, 0, :4] = -1.0  # with phi = ReLU, these queries weigh every key 0
    relu = torch.nn.functional.relu
    forms = [linear_parallel(q, k, v, feature_map=relu),
             linear_recurrent(q, k, v, feature_map=relu)[0],
             linear_chunked(q, k, v, chunk_size=4, feature_map=relu)[0]]  # fmt: skip
    for out in forms:
        assert not out.isnan().any()
        assert out[0, 0, :4].abs().max() == 0  # as a softmax query that sees no key
        assert_close(out, forms[0], **EXACT)


def test_a_cache_takes_only_states_that_fit_and_keeps_its_own_otherwise() -> None:
    from attention.layer.linear import LinearCache

    q, k, v = qkv(3)
    state = LinearState.zeros(q, v)
    with pytest.raises(ValueError, match=r"length must be >= 0, got -5"):
        LinearCache(state, length=-5)
    cache = LinearCache(state, length=3)
    with pytest.raises(ValueError, match=r"num_tokens must be >= 0, got -3"):
        cache.update(state, num_tokens=-3)
    with pytest.raises(TypeError, match=r"state.S must have dtype torch.float64"):
        cache.update(LinearState(state.S.float(), state.z.float()), num_tokens=1)
    assert cache.length == 3 and cache.state is state  # nothing kept from a refused update
    with pytest.raises(TypeError, match=r"state.S must have dtype torch.float32"):
        linear_recurrent(q.float(), k.float(), v.float(), state=state)
