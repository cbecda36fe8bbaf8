r"""Where a token is: absolute position vectors, and rotary position embeddings (RoPE).

Attention by itself is blind to order: permute the tokens and the outputs permute with them.
Two ways to tell it where each token is:

- **absolute**: add a vector per position to the input, learned (GPT-2, the book's
  `pos_emb`, [`TokenAndPositionEmbedding`][attention.derivation.text.TokenAndPositionEmbedding])
  or fixed sinusoids ([`sinusoidal_positions`][attention.layer.positions.sinusoidal_positions],
  *Attention Is All You Need*);
- **rotary** (RoPE, Su et al. 2021; Llama, Mistral, Qwen, Gemma): rotate each query and key,
  pair of dimensions by pair, by an angle proportional to its position. A rotation by
  $m\theta$ of the query and $n\theta$ of the key leaves, in their dot product, only the
  difference $(m - n)\theta$, so the score depends on the offset $m - n$ and not on where the
  pair sits:

$$
\begin{gathered}
\langle R_{m\theta}\, q,\; R_{n\theta}\, k \rangle = \langle q,\; R_{(n - m)\theta}\, k \rangle, \\
\theta_i = \text{base}^{-2i/d_h},\; i = 0, \dots, d_h/2 - 1 .
\end{gathered}
$$

Which dimensions form a pair is a convention: *rotate-half* (GPT-NeoX, Hugging Face, this
package) pairs dimension $i$ with $i + d_h/2$; the original paper and Meta's Llama code pair
$2i$ with $2i+1$ ([`apply_rope_interleaved`][attention.layer.positions.apply_rope_interleaved];
Hugging Face permutes Llama's $W_q$, $W_k$ rows at conversion). The two are the same rotation
up to a permutation of the dimensions.

Examples:
    >>> q = torch.randn(1, 4, 8)  # (batch, num_tokens, head_dim)
    >>> cos, sin = rope_angles(4, head_dim=8)  # (num_tokens, head_dim) each
    >>> apply_rope(q, cos, sin).shape
    torch.Size([1, 4, 8])
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attention.checks import check_size, check_tensor

if TYPE_CHECKING:
    from attention.layer.rope_scaling import RopeScaling
    from attention.layer.tokens import Tokens

__all__ = [
    "RotaryTable",
    "apply_rope",
    "apply_rope_interleaved",
    "rope_angles",
    "rope_frequencies",
    "rotate_half",
    "rotate_with",
    "sinusoidal_positions",
]


def sinusoidal_positions(num_tokens: int, d_model: int, base: float = 10000.0) -> Tensor:
    r"""The fixed position vectors of *Attention Is All You Need*, one row per position.

    $$
    \begin{gathered}
    P_{t, 2i} = \sin(t\, \theta_i), \qquad P_{t, 2i+1} = \cos(t\, \theta_i), \\
    \theta_i = \text{base}^{-2i/d}.
    \end{gathered}
    $$

    Args:
        num_tokens: positions $t = 0, \dots$, `num_tokens - 1`.
        d_model: width $d$, even.
        base: the longest wavelength's scale.

    Returns:
        Shape `(num_tokens, d_model)`, to add to the token embeddings.

    Raises:
        ValueError: `d_model` is odd.

    Examples:
        >>> P = sinusoidal_positions(3, 4)
        >>> P[0]  # position 0: sin 0 = 0, cos 0 = 1
        tensor([0., 1., 0., 1.])
    """
    check_size("num_tokens", num_tokens, minimum=0)
    check_size("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin, cos pairs), got {d_model}")
    theta = rope_frequencies(d_model, base)  # (d/2,)
    angles = torch.arange(num_tokens, dtype=torch.float32)[:, None] * theta  # (T, d/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (T, d)


def rope_frequencies(
    head_dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> Tensor:
    r"""$\theta_i = \text{base}^{-2i/d_h}$, $i = 0, \dots, d_h/2 - 1$: one angle per pair.

    The first pair turns by one radian per position; the last by about $1/\text{base}$: at
    base 10,000 and $d_h = 128$ it takes about 54,000 positions to turn once (chapter 10
    computes it).

    Examples:
        >>> rope_frequencies(4, base=100.0)
        tensor([1.0000, 0.1000])
    """
    check_size("head_dim", head_dim)
    if not (isinstance(base, int | float) and not isinstance(base, bool) and 1 < base < math.inf):
        raise ValueError(f"rope_base must be a finite number > 1, got {base!r}")
    exponents = torch.arange(0, head_dim - 1, 2, dtype=torch.float64) / head_dim  # 2i / d_h
    return (base**-exponents).to(dtype)  # (d_h / 2,), computed in float64


def rope_angles(
    num_tokens: int,
    head_dim: int,
    base: float = 10000.0,
    *,
    offset: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    r"""$\cos$ and $\sin$ of $m\,\theta_i$, positions $m$ = `offset` ... `offset + num_tokens - 1`.

    Each angle appears twice, for both dimensions of its rotate-half pair: column $i$ and
    column $i + d_h/2$ hold the same angle. Computed for the positions a call needs, never for
    a whole `context_length`.

    Args:
        num_tokens: how many positions.
        head_dim: $d_h$, even.
        base: RoPE's base (10,000 in the paper and Llama 2; 500,000 in Llama 3).
        offset: the first position (a cache's length, when generating).
        device: where to build them.
        dtype: their dtype (the angles are computed in float64 first).

    Returns:
        `(cos, sin)`, each `(num_tokens, head_dim)`.

    Raises:
        ValueError: `head_dim` is odd.

    Examples:
        >>> cos, sin = rope_angles(2, head_dim=4, base=100.0)
        >>> sin  # position 1 turns pair 0 by 1 radian, pair 1 by 0.1
        tensor([[0.0000, 0.0000, 0.0000, 0.0000],
                [0.8415, 0.0998, 0.8415, 0.0998]])
    """
    check_size("num_tokens", num_tokens, minimum=0)
    check_size("offset", offset, minimum=0)
    check_size("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: head_dim must be even, got {head_dim}")
    theta = rope_frequencies(head_dim, base, dtype=torch.float64)  # (d_h/2,)
    positions = torch.arange(offset, offset + num_tokens, dtype=torch.float64)  # (T,)
    return _cos_sin(positions, theta, device, dtype)


def _cos_sin(
    positions: Tensor,
    theta: Tensor,
    device: torch.device | str | None,
    dtype: torch.dtype,
    factor: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """cos and sin of m theta_i (times YaRN's `factor`), computed in float64 where `theta` is,
    then cast."""
    angles = positions.to(theta.device, torch.float64)[..., None] * theta  # m theta_i
    angles = torch.cat((angles, angles), dim=-1)  # (..., d_h): pair (i, i + d_h/2)
    cos, sin = angles.cos(), angles.sin()
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)


def rotate_half(x: Tensor) -> Tensor:
    """`(x1, x2) -> (-x2, x1)` on the last dimension's halves: a 90-degree turn of each pair.

    Examples:
        >>> rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        tensor([-3., -4.,  1.,  2.])
    """
    check_tensor("x", x)
    if x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(f"rotate_half needs an even last dimension, got shape {tuple(x.shape)}")
    return _rotate_half(x)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    d = cos.shape[-1]  # the checks were made by the caller
    if d == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    # partial rotary: the first d dimensions turn (their halves paired), the rest pass
    turned, kept = x[..., :d], x[..., d:]
    return torch.cat((turned * cos + _rotate_half(turned) * sin, kept), dim=-1)


def rotate_with(x: Tensor, angles: tuple[Tensor, Tensor]) -> Tensor:
    """`x` rotated by angles already made
    ([`RotaryTable.at`][attention.layer.positions.RotaryTable.at]).

    Inner function: nothing is checked; the angles are cast to `x`'s dtype (autocast).
    """
    cos, sin = angles
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return _rope(x, cos, sin)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    r"""Rotate each rotate-half pair of `x` by its position's angle.

    For the pair $(x_i, x_{i + d_h/2})$ at position $m$:

    $$
    \begin{aligned}
    & \begin{pmatrix} x_i' \\ x_{i+d_h/2}' \end{pmatrix} \\
    & \quad = \begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i
    \end{pmatrix}
    \begin{pmatrix} x_i \\ x_{i+d_h/2} \end{pmatrix},
    \end{aligned}
    $$

    that is `x * cos + rotate_half(x) * sin`.

    Args:
        x: queries or keys, `(..., num_tokens, head_dim)`.
        cos: from [`rope_angles`][attention.layer.positions.rope_angles], `(num_tokens, head_dim)`.
        sin: likewise.

    Returns:
        The rotated `x`, same shape.
    """
    _check_rope_inputs(x, cos, sin)
    return _rope(x, cos, sin)


def _check_rope_inputs(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    check_tensor("x", x, floating=True)
    check_tensor("cos", cos)
    check_tensor("sin", sin)
    if x.ndim < 2 or x.shape[-1] % 2 or cos.shape != x.shape[-2:] or sin.shape != cos.shape:
        raise ValueError(
            "x must be (..., num_tokens, head_dim) with head_dim even, and cos and sin "
            f"(num_tokens, head_dim): got x {tuple(x.shape)}, cos {tuple(cos.shape)}, "
            f"sin {tuple(sin.shape)}"
        )


def apply_rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The original paper's pairing: dimensions `(2i, 2i+1)` turn together by $m\\theta_i$.

    Equal to [`apply_rope`][attention.layer.positions.apply_rope] after moving dimension $2i$ to $i$
    and $2i+1$ to $i + d_h/2$ (and back).

    Args:
        x: `(..., num_tokens, head_dim)`.
        cos: from [`rope_angles`][attention.layer.positions.rope_angles] (rotate-half layout).
        sin: likewise.

    Returns:
        The rotated `x`, same shape.

    Examples:
        >>> x = torch.randn(5, 8)
        >>> cos, sin = rope_angles(5, 8)
        >>> to_half = torch.cat((torch.arange(0, 8, 2), torch.arange(1, 8, 2)))  # 0 2 4 6 1 3 5 7
        >>> torch.allclose(apply_rope_interleaved(x, cos, sin)[..., to_half],
        ...                apply_rope(x[..., to_half], cos, sin), atol=1e-6)
        True
    """
    _check_rope_inputs(x, cos, sin)
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]  # one angle per pair: (T, d_h/2)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, d_h/2) each
    out = torch.stack((x_even * c - x_odd * s, x_even * s + x_odd * c), dim=-1)
    return out.flatten(-2)  # interleave back: (..., T, d_h)


class RotaryTable:
    r"""The cos and sin of $m\,\theta_i$ for positions $m = 0, 1, \dots$, made once and reused.

    A module with RoPE keeps one. The first call for a device and dtype builds the table for
    the positions it needs (at least 256, rounded up to a power of two); later calls slice it,
    and a position beyond it doubles it. Each entry is computed in float64 before the cast,
    as [`rope_angles`][attention.layer.positions.rope_angles] computes it, so both give the same
    numbers. Inner helper: it checks nothing.

    With a [`RopeScaling`][attention.layer.rope_scaling.RopeScaling] the frequencies are its
    scaled ones, cos and sin carry its attention factor, and only its rotated width `dim`
    of each head turns.

    Args:
        head_dim: $d_h$, even.
        base: RoPE's base.
        limit: positions below it come from the table; later ones are computed.
        scaling: RoPE scaling, partial rotation; None: the plain RoPE over all of $d_h$.

    Examples:
        >>> table = RotaryTable(head_dim=4, base=100.0)
        >>> cos, sin = table.angles(3, 2, torch.device("cpu"), torch.float32)  # positions 3, 4
        >>> torch.equal(sin, rope_angles(2, 4, base=100.0, offset=3)[1])
        True
        >>> x = torch.randn(1, 2, 5, 4)  # (b, h, T, d_h)
        >>> torch.allclose(table.rotate(x, start=0), apply_rope(x, *rope_angles(5, 4, 100.0)))
        True
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        limit: int = 1 << 16,
        scaling: RopeScaling | None = None,
    ) -> None:
        self.limit = limit  # the table covers positions below this; later ones are computed
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}
        if scaling is None:
            self._theta = rope_frequencies(head_dim, base, dtype=torch.float64)  # (d_h / 2,)
            self.factor = 1.0
        else:
            self._theta, self.factor = scaling.frequencies(head_dim, base)  # (dim / 2,)
        self.dim = 2 * self._theta.shape[0]  # the rotated width of each head
        self._thetas: dict[torch.device, Tensor] = {}

    def angles(
        self, start: int, num_tokens: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """`(cos, sin)` at positions `start ... start + num_tokens - 1`, `(num_tokens, d_h)`."""
        end = start + num_tokens
        if end > self.limit:  # far positions (unbounded generation): this chunk's only
            cos, sin = self._far(torch.arange(start, end, dtype=torch.float64), device, dtype)
            return cos, sin  # (T, d_h)
        table = self._tables.get((device, dtype))
        if table is None or table[0].shape[0] < end:
            size = max(256, 1 << max(end - 1, 1).bit_length())
            every = torch.arange(size, dtype=torch.float64)  # rope_angles' formula, scaled
            table = _cos_sin(every, self._theta, device, dtype, self.factor)
            self._tables[(device, dtype)] = table
        return table[0][start:end], table[1][start:end]

    def rotate(self, x: Tensor, start: int, positions: Tensor | None = None) -> Tensor:
        """`x` (`(b, h, T, d_h)`) rotated at positions `start ... start + T - 1`, or at `positions`.

        Args:
            x: queries or keys.
            start: the first token's slot.
            positions: `(b, T)` each row's own positions (padding skipped; a padded token's
                may be negative, and is taken as 0), none beyond its slot `start + t`; or
                None for the slots themselves.
        """
        cos, sin = self.at(start, x.shape[-2], positions, x.device, x.dtype)
        return _rope(x, cos, sin)

    def at(
        self,
        start: int,
        num_tokens: int,
        positions: Tensor | None,
        device: torch.device,
        dtype: torch.dtype,
    ) -> tuple[Tensor, Tensor]:
        """`(cos, sin)` for a chunk: `(T, d_h)` at `start ...`, or `(b, 1, T, d_h)` at `positions`.

        What a model computes once per call and hands to every layer
        ([`rotate_with`][attention.layer.positions.rotate_with]).
        """
        if positions is None:
            return self.angles(start, num_tokens, device, dtype)  # (T, d_h)
        # computed from the positions themselves (the table's own float64 formula, so the same
        # numbers): any position works, and no value is read to size a table
        cos, sin = self._far(positions.clamp(min=0), positions.device, dtype)  # (b, T, d_h)
        return cos[:, None], sin[:, None]  # (b, 1, T, d_h)

    def of(self, tokens: Tokens, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """`(cos, sin)` at the tokens' positions: `(T, d_h)` from the table where every row's
        are `start ...`, else `(b, 1, T, d_h)` computed from them (no token: as 0)."""
        if tokens.start is not None:
            return self.angles(tokens.start, tokens.n, tokens.device, dtype)
        return self.at(0, tokens.n, tokens.pos, tokens.device, dtype)

    def _far(
        self, positions: Tensor, device: torch.device, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """`(cos, sin)` of positions beyond the table, computed in float64 as the table is."""
        theta = self._thetas.get(device)  # on each device once: positions stay where they are
        if theta is None:
            theta = self._thetas[device] = self._theta.to(device)
        return _cos_sin(positions, theta, device, dtype, self.factor)
