"""GPU-only checks: low precision, each fused SDPA backend forced on its own, buffers on `cuda`.

Every test here needs CUDA and is skipped without it, so `nox -s tests` on a CPU reports them
as skipped. `nox -s tests_gpu` sets `ATTENTION_DEVICE=cuda`, under which a missing GPU fails the
run instead (see `pytest_configure` in conftest.py).

The reference is always the explicit path (`need_weights=True`, the core's
`explicit_attention`) of the same module in fp32. Tolerances, absolute, on outputs and input
gradients of magnitude ~1.5 (inputs ~ N(0, 1), default `nn.Linear` init, d_in = d_out = 64):

- fp32 `1e-4`: the kernels reduce in another order than the explicit path (the
  memory-efficient one with 3xTF32 tensor-core products); the error is ~1e-6, and any masking
  bug would be ~1e-1.
- fp16 `1e-2`: unit roundoff 2^-11 ~ 4.9e-4; about six rounding steps (the input, Q/K/V
  projections, scores, softmax, weights @ V, out_proj) with fp32 accumulation inside each
  matmul. Measured on CPU with the same shapes: at most 5.4e-4 (outputs), 1.3e-3 (gradients).
- bf16 `5e-2`: unit roundoff 2^-8 ~ 3.9e-3, 8x coarser than fp16. Measured likewise: at most
  5.1e-3 (outputs), 8.4e-3 (gradients).

Backend constraints (PyTorch's `sdp_utils.cpp`): the flash kernel takes fp16/bf16 only, needs
sm80 or newer, a head_dim <= 256, and no `attn_mask` (so it cannot run the padded case, where
the module passes one); the memory-efficient kernel takes fp32 and fp16 (bf16 on sm80+) with a
head_dim divisible by 8 and accepts an `attn_mask`. With one backend enabled, SDPA raises
"No available kernel" rather than falling back, so a passing test did run that kernel.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from _pytest.mark import ParameterSet
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing import assert_close

from attention import MultiHeadAttention

CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not CUDA, reason="needs a CUDA device (run `nox -s tests_gpu` on a GPU)"),
]
# Without CUDA these stay False and only the module-level skip above applies.
NO_SM80 = CUDA and torch.cuda.get_device_capability() < (8, 0)
NO_FLASH = CUDA and (NO_SM80 or not torch.backends.cuda.is_flash_attention_available())

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
BF16 = pytest.param(
    torch.bfloat16, marks=pytest.mark.skipif(NO_SM80, reason="bf16 kernels need sm80+"), id="bf16"
)

# head_dim = 64 / 4 = 16: a multiple of 8, <= 256, as both fused kernels require.
B, NUM_TOKENS, CONTEXT_LENGTH, D, H = 4, 100, 128, 64, 4


def padding_mask(device: torch.device | str, layout: str = "mixed") -> torch.Tensor:
    """`(4, NUM_TOKENS)` bool, True = padding. "right": lengths 100, 70, 1, 40, real tokens
    first (causal attention then needs no mask). "mixed": none, right-padded to 70,
    left-padded by 30, one token left (the left-padded rows take the bool-mask path, with
    padded queries that have no key under the causal mask)."""
    pos = torch.arange(NUM_TOKENS, device=device)
    if layout == "right":
        return pos[None, :] >= torch.tensor([NUM_TOKENS, 70, 1, 40], device=device)[:, None]
    right = pos[None, :] >= torch.tensor([NUM_TOKENS, 70], device=device)[:, None]
    left = pos[None, :] < torch.tensor([30, NUM_TOKENS - 1], device=device)[:, None]
    return torch.cat([right, left])  # (4, NUM_TOKENS)


def make_module(causal: bool = True) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(D, D, CONTEXT_LENGTH, 0.0, H, qkv_bias=True, causal=causal)


def run(
    mha: MultiHeadAttention,
    x: torch.Tensor,
    grad_out: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and input gradient in fp32, for `x` cast to the module's dtype."""
    dtype = mha.out_proj.weight.dtype
    xi = x.detach().to(dtype).requires_grad_(True)
    if need_weights:
        out, _ = mha(xi, key_padding_mask, need_weights=True)
    else:
        out = mha(xi, key_padding_mask)
    assert out.dtype == dtype and out.shape == (B, NUM_TOKENS, D)
    (out.float() * grad_out).sum().backward()
    assert xi.grad is not None
    return out.float(), xi.grad.float()


@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"), BF16])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_low_precision_matches_fp32_explicit(dtype: torch.dtype, padded: bool) -> None:
    mha = make_module().cuda()
    x = torch.randn(B, NUM_TOKENS, D, device="cuda")
    grad_out = torch.randn(B, NUM_TOKENS, D, device="cuda")
    mask = padding_mask("cuda") if padded else None
    ref_out, ref_grad = run(mha, x, grad_out, mask, need_weights=True)
    low = copy.deepcopy(mha).to(dtype)
    for need_weights in (False, True):  # default SDPA dispatch, then the explicit path
        low.zero_grad()
        out, grad = run(low, x, grad_out, mask, need_weights)
        assert_close(out, ref_out, atol=TOL[dtype], rtol=0)
        assert_close(grad, ref_grad, atol=TOL[dtype], rtol=0)
    _, weights = low(x.to(dtype), mask, need_weights=True)
    _, ref_weights = mha(x, mask, need_weights=True)
    assert weights.dtype == dtype
    assert_close(weights.float(), ref_weights, atol=TOL[dtype], rtol=0)


DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def backend_cases() -> list[ParameterSet]:
    """(backend, dtype, padding) for every dtype each kernel takes; skips name the constraint."""
    cases = []
    for backend, dtypes in (
        (SDPBackend.FLASH_ATTENTION, (torch.float16, torch.bfloat16)),
        (SDPBackend.EFFICIENT_ATTENTION, (torch.float32, torch.float16, torch.bfloat16)),
    ):
        flash = backend == SDPBackend.FLASH_ATTENTION
        for dtype in dtypes:
            for padding in ("none", "right", "mixed"):
                marks = []
                if flash:
                    marks.append(pytest.mark.skipif(NO_FLASH, reason="flash needs sm80+"))
                if dtype == torch.bfloat16:
                    marks.append(pytest.mark.skipif(NO_SM80, reason="bf16 needs sm80+"))
                case_id = "-".join(("flash" if flash else "efficient", DTYPE_NAMES[dtype], padding))
                cases.append(pytest.param(backend, dtype, padding, id=case_id, marks=marks))
    return cases


@pytest.mark.parametrize(("backend", "dtype", "padding"), backend_cases())
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_forced_sdpa_backend_matches_explicit_path(
    backend: SDPBackend, dtype: torch.dtype, padding: str, causal: bool
) -> None:
    # The module passes no attn_mask without padding, nor for causal right padding; flash
    # takes no attn_mask, so it runs those cases only.
    needs_mask = padding == "mixed" or (padding == "right" and not causal)
    if backend == SDPBackend.FLASH_ATTENTION and needs_mask:
        pytest.skip("flash takes no attn_mask, and this padding needs one")
    mha = make_module(causal).cuda()
    x = torch.randn(B, NUM_TOKENS, D, device="cuda")
    grad_out = torch.randn(B, NUM_TOKENS, D, device="cuda")
    mask = None if padding == "none" else padding_mask("cuda", padding)
    ref_out, ref_grad = run(mha, x, grad_out, mask, need_weights=True)  # fp32, explicit
    fused = copy.deepcopy(mha).to(dtype)
    fused.zero_grad()
    with sdpa_kernel([backend]):  # only this kernel: no silent fallback to another
        out, grad = run(fused, x, grad_out, mask, need_weights=False)
    assert_close(out, ref_out, atol=TOL[dtype], rtol=0)
    assert_close(grad, ref_grad, atol=TOL[dtype], rtol=0)


def test_parameters_follow_the_module_to_cuda() -> None:
    mha_cpu = make_module()
    mha = copy.deepcopy(mha_cpu).to("cuda")
    assert list(mha.buffers()) == []  # no mask is stored: it is computed per call
    assert all(p.device.type == "cuda" for p in mha.parameters())
    x = torch.randn(B, NUM_TOKENS, D)
    mask = padding_mask("cpu")
    out = mha(x.cuda(), mask.cuda())
    assert out.device.type == "cuda" and out.shape == (B, NUM_TOKENS, D)
    assert_close(out.cpu(), mha_cpu(x, mask), atol=TOL[torch.float32], rtol=0)


def test_state_dict_round_trip_on_cuda(tmp_path: Path) -> None:
    mha = make_module().cuda()
    state = mha.state_dict()
    assert "mask" not in state  # parameters only: the mask is computed, not stored
    assert all(t.device.type == "cuda" for t in state.values())
    path = tmp_path / "mha.pt"
    torch.save(state, path)

    torch.manual_seed(1)  # different initial weights, overwritten by the load
    restored = MultiHeadAttention(D, D, CONTEXT_LENGTH, 0.0, H, qkv_bias=True).cuda()
    restored.load_state_dict(torch.load(path, weights_only=True))
    on_cpu = MultiHeadAttention(D, D, CONTEXT_LENGTH, 0.0, H, qkv_bias=True)
    on_cpu.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    for name, tensor in state.items():
        assert torch.equal(restored.state_dict()[name], tensor)
        assert torch.equal(on_cpu.state_dict()[name], tensor.cpu())

    x = torch.randn(B, NUM_TOKENS, D, device="cuda")
    mask = padding_mask("cuda")
    assert_close(restored(x, mask), mha(x, mask), atol=1e-6, rtol=0)  # same weights
    assert_close(on_cpu(x.cpu(), mask.cpu()), mha(x, mask).cpu(), atol=TOL[torch.float32], rtol=0)
