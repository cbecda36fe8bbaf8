r"""ALiBi: no position embedding, a penalty on each score that grows with distance.

Press et al. (2022, *Train Short, Test Long*) drop position embeddings and add to each
scaled score a bias linear in the distance, one slope $m_h$ per head:

$$
s_{ij} \leftarrow s_{ij} + m_h\,(j - i), \qquad m_h = 2^{-8(h + 1)/H}.
$$

Heads with a steep slope read locally, those with a gentle one far back, and the model reads
texts longer than those it was trained on. BLOOM and MPT use it. The bias is additive, so the
fused kernel takes it as a float mask.

Examples:
    >>> alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039], dtype=torch.float64)
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor

from attention.checks import check_size
from attention.layer.score_mods import ScoreMod

__all__ = ["alibi", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> Tensor:
    r"""Each head's slope $m_h$, float64 `(num_heads,)`, as the paper's code makes them.

    For $H$ a power of two, the geometric sequence $2^{-8/H}, 2^{-16/H}, \dots, 2^{-8}$;
    otherwise the slopes of the power of two below $H$, then every other slope of the one
    above, until there are $H$.
    """
    check_size("num_heads", num_heads)

    def geometric(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    below = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(below) + geometric(2 * below)[0::2][: num_heads - below]
    return torch.tensor(slopes, dtype=torch.float64)


def _bias(slopes: dict[str, Tensor], b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    on = slopes.get(str(q.device))  # copied to a device once, not at every call
    if on is None:
        on = slopes[str(q.device)] = slopes["cpu"].to(q.device)
    return on[h] * (kv - q)  # m_h (j - i)


def _alibi(
    slopes: dict[str, Tensor], score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor
) -> Tensor:
    return score + _bias(slopes, b, h, q, kv).to(score.dtype)


def alibi(num_heads: int) -> ScoreMod:
    """ALiBi's score modifier for a layer of `num_heads` heads (additive: fused).

    Examples:
        >>> from attention import MultiHeadAttention
        >>> layer = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, score_mods=[alibi(2)])
        >>> layer.extra_repr()
        'num_heads=2, causal=True, score_mods=[alibi(2)]'
    """
    slopes = {"cpu": alibi_slopes(num_heads)}  # by device
    return ScoreMod(partial(_alibi, slopes), f"alibi({num_heads})", bias=partial(_bias, slopes))
