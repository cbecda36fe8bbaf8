r"""QK-norm: RMSNorm of the queries and the keys before RoPE and the scores.

A score $q \cdot k$ grows with the norms of $q$ and $k$; large ones make the softmax
one-hot and training unstable. QK-norm divides each query and key by its root mean square
and multiplies it by a learned gain $g$ (Qwen3, Gemma 3, OLMo 2):

$$
\operatorname{RMSNorm}(x) = \frac{x}{\sqrt{\tfrac1n \sum_j x_j^2 + \epsilon}} \odot g .
$$

Two places to take it, both here:

- **per head** (`"head"`: Qwen3, Gemma 3): each head's $d_h$ numbers, one gain $g \in
  \mathbb{R}^{d_h}$ shared by the heads;
- **over the projection** (`"projection"`: OLMo 2): all $h\,d_h$ query numbers of a token
  together ($g \in \mathbb{R}^{h d_h}$), and all $h_{kv} d_h$ key numbers.

Examples:
    >>> norm = RMSNorm(4)
    >>> norm(torch.tensor([[3.0, -3.0, 3.0, -3.0]]))  # rms 3: divided by 3
    tensor([[ 1.0000, -1.0000,  1.0000, -1.0000]], grad_fn=<MulBackward0>)
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from attention.checks import check_positive, check_size

__all__ = ["KINDS", "QKNormKind", "RMSNorm", "apply_qk_norm", "check_qk_norm"]

QKNormKind = Literal["head", "projection"]
KINDS = ("head", "projection")
"""Where the norm is taken: each head, or the whole projection."""


class RMSNorm(nn.Module):
    r"""$x / \sqrt{\operatorname{mean}(x^2) + \epsilon} \odot g$ over the last dimension.

    Computed in float32 at least (in float64 for float64 inputs), then cast back before the
    gain, as Llama's `LlamaRMSNorm` computes it. Gemma's norms multiply by $1 + g$: a loader
    stores $1 + g$ as the gain.

    Args:
        dim: the width normalised.
        eps: $\epsilon$.

    Attributes:
        weight: the gain $g$, `(dim,)`, ones at first.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = check_positive("eps", eps)
        self.weight = nn.Parameter(torch.ones(check_size("dim", dim)))

    def forward(self, x: Tensor) -> Tensor:
        h = x if x.dtype == torch.float64 else x.float()  # (..., dim)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)  # x / rms(x)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps:g}"


def check_qk_norm(kind: object) -> QKNormKind | None:
    """`kind` if it is None, `"head"` or `"projection"`; else a ValueError naming it."""
    if kind is None or kind in KINDS:
        return kind  # type: ignore[return-value]
    raise ValueError(f"qk_norm must be None, 'head' or 'projection', got {kind!r}")


def qk_norms(
    kind: QKNormKind | None, num_heads: int, num_kv_heads: int, head_dim: int, eps: float
) -> tuple[RMSNorm, RMSNorm] | tuple[None, None]:
    """The query's and the key's `RMSNorm`: `d_h` wide per head, or the projections' widths;
    none without a `kind`."""
    if kind is None:
        return None, None
    if kind == "head":
        return RMSNorm(head_dim, eps), RMSNorm(head_dim, eps)
    return RMSNorm(num_heads * head_dim, eps), RMSNorm(num_kv_heads * head_dim, eps)


def apply_qk_norm(
    kind: str | None, q_norm: RMSNorm, k_norm: RMSNorm, q: Tensor, k: Tensor, head_dim: int
) -> tuple[Tensor, Tensor]:
    """The norms on `q` `(b, T, h d_h)` and `k` `(b, T, h_kv d_h)`: on each head's `d_h`
    numbers, or on a token's whole projection."""
    if kind == "projection":
        return q_norm(q), k_norm(k)  # (b, T, h d_h) together

    def per_head(norm: RMSNorm, x: Tensor) -> Tensor:
        normed: Tensor = norm(x.unflatten(-1, (-1, head_dim)))  # (b, T, heads, d_h)
        return normed.flatten(-2)

    return per_head(q_norm, q), per_head(k_norm, k)
