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
def float64_casts() -> Iterator[None]:
    """transformers' float32 casts made float64, for the duration."""
    saved = torch.float, torch.float32
    torch.float = torch.float32 = torch.float64  # type: ignore[misc]
    try:
        yield
    finally:
        torch.float, torch.float32 = saved  # type: ignore[misc]
