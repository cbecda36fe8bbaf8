"""`torch.compile` of the production module runs and matches eager."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention import MultiHeadAttention


@pytest.mark.slow
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
