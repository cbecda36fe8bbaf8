"""Python function calls in one decode step: the host's share of a step, counted, not timed.

A decode step does little arithmetic per call into torch, so every Python call between two
kernels is time the memory bus sits idle. Counting the calls (`sys.setprofile`'s `call`
events: Python functions entered, torch's C functions aside) is exact and the same on every
machine, unlike a timing.

Examples:
    >>> from attention.model.gpt import GPTModel
    >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
    >>> calls = decode_calls(GPTModel(cfg).eval())
    >>> calls["attention"] < 40  # one attention layer's decode step: project, store, attend
    True
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from attention.model.gpt import GPTModel

__all__ = ["count_calls", "decode_calls"]


def count_calls(fn: Callable[[], object]) -> int:
    """How many Python functions `fn()` enters (itself excluded)."""
    count = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        count += event == "call"

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count - 1  # fn's own frame


def decode_calls(model: GPTModel, prompt_tokens: int = 8) -> dict[str, float]:
    """Python calls in one decode step of `model` (batch 1, on the model's device), and in one
    attention layer's.

    Returns:
        `{"step": ..., "per_layer": step / n_layers, "attention": ...}`, the last for one
        block's `MultiHeadAttention` called on its own.
    """
    blocks = model.blocks
    device = model.tok_emb.weight.device
    with torch.no_grad():
        caches = model.init_caches(1, prompt_tokens + 2)
        model.logits(torch.zeros(1, prompt_tokens, dtype=torch.long, device=device), caches)
        token = torch.zeros(1, 1, dtype=torch.long, device=device)
        step = count_calls(lambda: model.logits(token, caches))
        att = blocks[0].att
        cache = att.init_cache(1, prompt_tokens + 2)
        x = torch.zeros(1, 1, att.d_in, dtype=att.W_query.weight.dtype, device=device)
        attention = count_calls(lambda: att(x, cache=cache))
    return {"step": step, "per_layer": step / len(blocks), "attention": attention}
