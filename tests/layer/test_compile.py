"""`torch.compile` and `torch.export` of the production module match eager; scripting is refused.

These are the limits the module's docstring and the production page state.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.export import Dim, export
from torch.testing import assert_close

from attention import MultiHeadAttention


@pytest.mark.inductor
@pytest.mark.heavy
@pytest.mark.xdist_group("inductor")  # on the worker that compiles the others
def test_compiled_module_matches_eager(device: torch.device) -> None:
    torch._dynamo.reset()
    mha = MultiHeadAttention(16, 32, context_length=64, dropout=0.0, num_heads=4).to(device)
    compiled = torch.compile(mha)
    x = torch.randn(2, 64, 16, device=device, requires_grad=True)
    eager_out = mha(x)
    compiled_out = compiled(x)
    assert_close(compiled_out, eager_out, atol=1e-5, rtol=1e-5)
    (grad_eager,) = torch.autograd.grad(eager_out.sum(), x)
    (grad_compiled,) = torch.autograd.grad(compiled(x).sum(), x)
    assert_close(grad_compiled, grad_eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.slow(seconds=1)
def test_export_with_a_dynamic_token_count(padded: bool) -> None:
    """One exported program serves every length up to context_length, with or without a
    padding mask of any layout."""
    mha = MultiHeadAttention(16, 16, context_length=64, dropout=0.0, num_heads=2).eval()
    x = torch.randn(2, 10, 16)
    num_tokens = Dim("num_tokens", min=2, max=64)
    if padded:
        mask = torch.tensor([[False] * 10, [False] * 7 + [True] * 3])
        shapes = ((None, num_tokens, None), (None, num_tokens))
        program = export(mha, (x, mask), dynamic_shapes=shapes)
    else:
        program = export(mha, (x,), dynamic_shapes=((None, num_tokens, None),))
    x13 = torch.randn(2, 13, 16)
    left = torch.tensor([[True] * 3 + [False] * 10, [False] * 13])  # another layout too
    args = (x13, left) if padded else (x13,)
    assert_close(program.module()(*args), mha(*args), atol=1e-5, rtol=0)


def test_torch_jit_script_is_not_supported() -> None:
    """TorchScript is deprecated upstream; the docstring points to compile and export."""
    mha = MultiHeadAttention(16, 16, context_length=64, dropout=0.0, num_heads=2)
    unsupported = (torch.jit.frontend.NotSupportedError, ValueError)  # its parser's word for it
    with warnings.catch_warnings(), pytest.raises(unsupported):
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(mha)
