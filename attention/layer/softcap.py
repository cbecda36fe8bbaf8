r"""Soft-capping: scores squashed smoothly into $(-c, c)$ before the softmax (Gemma 2, Grok-1).

A score that grows without bound lets one key take all of a query's weight. Gemma 2 caps its
attention scores softly, $c = 50$:

$$
s_{ij} \leftarrow c \tanh(s_{ij} / c),
$$

the identity for small scores and a ceiling for large ones. It is no added term, so no fused
kernel here can take it: a layer with it runs the explicit path.

Examples:
    >>> mod = softcap(20.0)
    >>> mod(torch.tensor([0.0, 10.0, 100.0]), *torch.zeros(4, dtype=torch.long))
    tensor([ 0.0000,  9.2423, 19.9982])
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from attention.checks import check_positive
from attention.layer.score_mods import ScoreMod

__all__ = ["softcap"]


def _softcap(cap: float, score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return cap * torch.tanh(score / cap)  # c tanh(s / c)


def softcap(cap: float) -> ScoreMod:
    """The soft cap $c \\tanh(s / c)$ as a score modifier.

    Raises:
        ValueError: `cap` not a finite number above 0.
    """
    check_positive("softcap: cap", cap)
    return ScoreMod(partial(_softcap, float(cap)), f"softcap({float(cap):g})")
