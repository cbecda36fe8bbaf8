r"""Prefix-LM: the prompt reads itself both ways, what follows it reads causally.

A decoder-only model can give its prompt (an instruction, an image's tokens, a document to
summarise) the bidirectional attention of an encoder while it keeps generating causally
(UniLM, T5's prefix-LM objective, PaliGemma). With a prefix of $n$ positions:

$$
\operatorname{mask}(b, h, i, j) = [j \le i] \vee [i < n \wedge j < n].
$$

Examples:
    >>> import torch
    >>> prefix_lm(3).grid(torch.arange(5), torch.arange(5)).int()
    tensor([[1, 1, 1, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1]], dtype=torch.int32)
"""

from __future__ import annotations

from functools import partial

from torch import Tensor

from attention.checks import check_size
from attention.layer.masks import Bounds, Mask, causal

__all__ = ["prefix", "prefix_lm"]


def _prefix(n: int, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return (q < n) & (kv < n)  # i < n and j < n


def prefix(n: int) -> Mask:
    """$i < n \\wedge j < n$: the first `n` positions see each other, and nothing else.

    Its bounds: a query sees no key at or past `n` (a reach of 0 with `n` anchors), so from
    position `n` on it is causal.
    """
    check_size("prefix", n)
    return Mask(
        partial(_prefix, n),
        f"prefix({n})",
        Bounds(causal_from=n, reach=0, anchor=n),
        f"prefix({n})",
    )


def prefix_lm(n: int) -> Mask:
    """`causal() | prefix(n)`: a prefix-LM over a prompt of `n` positions.

    Not causal (a prompt token sees later prompt tokens), but causal from position `n` on: a
    layer with it takes a cache once its first call holds the whole prompt, and every later
    token is decoded causally (PaliGemma's generation).
    """
    return causal() | prefix(n)
