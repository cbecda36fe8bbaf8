"""transformers in float64: its float32 casts pointed at float64, for the tests against it.

transformers computes RoPE's angles and frequencies (and Gemma's norms) in float32 whatever
the model's dtype; while `float64_casts` runs, its `torch.float` and `torch.float32` are
float64, so that both sides evaluate the same formulas in float64 and agree to rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def float64_casts(tensor_float: bool = False) -> Iterator[None]:
    """transformers' float32 casts made float64, for the duration; with `tensor_float`,
    `Tensor.float()` of a float64 tensor too (Qwen3-Next's decay gate casts so)."""
    saved = torch.float, torch.float32
    to_float = torch.Tensor.float
    torch.float = torch.float32 = torch.float64  # type: ignore[misc]
    if tensor_float:

        def keep_float64(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
            return self if self.dtype == torch.float64 else to_float(self, *args, **kwargs)  # type: ignore[arg-type]

        torch.Tensor.float = keep_float64  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.float, torch.float32 = saved  # type: ignore[misc]
        torch.Tensor.float = to_float  # type: ignore[method-assign]


def hf_rope_angles(
    positions: torch.Tensor, base: float, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's (cos, sin) over `dim` rotated numbers as transformers lays them out,
    `cat(freqs, freqs)`, in float64."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = positions[..., None].double() * inv_freq  # (b, T, dim / 2)
    full = torch.cat((freqs, freqs), dim=-1)
    return full.cos(), full.sin()


def exact_rms_norm(norm_class: type, monkeypatch: object) -> None:
    """A transformers RMSNorm class's `forward` without its float32 cast, for the test's
    duration (`monkeypatch`, pytest's): $g \\odot x / \\sqrt{\\overline{x^2} + \\epsilon}$."""

    def exact(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        mean_square = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(mean_square + self.variance_epsilon))  # type: ignore[operator]

    monkeypatch.setattr(norm_class, "forward", exact)  # type: ignore[attr-defined]
