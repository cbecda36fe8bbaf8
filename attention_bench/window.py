"""A long sliding window: does the windowed layer skip the work its mask hides?

One `MultiHeadAttention` layer (d 1024, 16 heads) at a long length, causal against a window,
beside what the window's work needs at least: the layer's four projections, and (on CUDA)
FlexAttention's own windowed core on the same queries, keys and values. On CUDA the windowed
layer goes through FlexAttention ([`attention.layer.flex`][attention.layer.flex]); on the CPU
through SDPA in blocks ([`sliding_window_attention`][attention.layer.fused.sliding_window_attention]).
"""  # noqa: E501

from __future__ import annotations

from typing import Any

import torch

from attention import MultiHeadAttention
from attention.layer import flex
from attention.layer.masks import causal, window
from attention.layer.tokens import Tokens
from attention_bench.measuring import Device, measure

__all__ = ["LONG_WINDOW", "long_window_rows"]

LONG_WINDOW = {"cuda": (32_768, 1024), "cpu": (4096, 256)}
"""`(num_tokens, window)` per device type: the issue's shape on a GPU, a CPU-sized one."""


def _steps(device: Device, dtype: torch.dtype, num_tokens: int, w: int) -> dict[str, Any]:
    """The timed calls: the causal layer, the windowed one, its projections, its core."""
    torch.manual_seed(0)
    layers = {
        name: MultiHeadAttention(1024, 1024, num_tokens, 0.0, num_heads=16, window=size)
        for name, size in (("causal", None), ("window", w))
    }
    for layer in layers.values():
        layer.to(device.type, dtype).eval()
    x = torch.randn(1, num_tokens, 1024, device=device.type, dtype=dtype)
    windowed = layers["window"]

    def projections() -> tuple[torch.Tensor, ...]:  # what any attention layer does: 4 matmuls
        q, k, v = windowed.project(x)
        out = windowed.out_proj(q.transpose(1, 2).reshape(1, num_tokens, 1024))
        return out, k, v

    steps = {
        "causal": lambda: layers["causal"](x),
        "window": lambda: windowed(x),
        "projections": projections,
    }
    if flex.usable(x.device, 0.0):
        q, k, v = windowed.project(x)
        rule = causal() & window(w)
        line = Tokens(1, num_tokens, x.device, start=0)
        steps["flex_core"] = lambda: flex.attend(q, k, v, rule, line, line)
    return steps


def long_window_rows(
    device: Device, dtype: str, shape: tuple[int, int] | None = None
) -> list[dict[str, Any]]:
    """One row per timed call (`experiment` "window"), each with its median time.

    `shape` is `(num_tokens, window)`; default [`LONG_WINDOW`][attention_bench.window.LONG_WINDOW]
    for the device.
    """
    num_tokens, w = shape or LONG_WINDOW["cuda" if device.type == "cuda" else "cpu"]
    steps = _steps(device, getattr(torch, dtype), num_tokens, w)
    with torch.no_grad():
        timings = measure(steps, device, budget_s=20.0, min_repeats=3, max_repeats=20, memory=False)
    return [
        {
            "experiment": "window",
            "impl": name,
            "dtype": dtype,
            "num_tokens": num_tokens,
            "window": w,
            **timing.summary(),
        }
        for name, timing in timings.items()
    ]
