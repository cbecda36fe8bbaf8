r"""FLOP counts: what one multi-head self-attention call must compute.

A matmul $(m \times k)(k \times n)$ costs $2mkn$ FLOPs. With $b$ sequences of $T$ tokens and
$h$ heads of width $d_h$ ($h d_h = d_\text{out}$), the forward pass costs

$$
F = \underbrace{3 \cdot 2 b T d_\text{in} d_\text{out}}_{W_q, W_k, W_v}
+ \underbrace{2 b T d_\text{out}^2}_{W_o}
+ \underbrace{c \cdot 4 b h T^2 d_h}_{Q K^\top \text{ and } \alpha V},
$$

with $c = \tfrac12$ if causal (only the lower triangle) and $1$ otherwise; softmax, scaling
and biases are ignored. The backward pass costs twice the forward (two matmuls
per matmul: the gradient of each operand), so forward+backward is $3F$.
"""

from __future__ import annotations

__all__ = ["attention_flops", "flop_terms"]


def flop_terms(
    batch: int,
    num_tokens: int,
    d_in: int,
    d_out: int,
    *,
    causal: bool = True,
    out_proj: bool = True,
) -> tuple[int, int]:
    r"""The two terms of the forward count: `(projections, attention)`.

    The projections grow like $T$, the attention ($Q K^\top$ and $\alpha V$) like $T^2$, so
    they are equal at one length, $T^* = T \cdot \text{projections} / \text{attention}$ for any
    $T$: with $d_\text{in} = d_\text{out} = d$, $8 b T d^2 = 2 b T^2 d$ gives $T^* = 4d$ (causal;
    $2d$ without the mask, which halves the attention's work).

    Args:
        batch: $b$.
        num_tokens: $T$.
        d_in: input width.
        d_out: total head width $h d_h$ (the number of heads cancels out).
        causal: count only the lower triangle of the $T \times T$ products.
        out_proj: include the output projection (the wrapper has none).

    Returns:
        `(projections, attention)` FLOPs of the forward pass.

    Examples:
        >>> projections, attention = flop_terms(1, 1024, 768, 768)
        >>> 1024 * projections // attention  # the crossover length T*: 4 * 768
        3072
    """
    projections = 3 * 2 * batch * num_tokens * d_in * d_out
    if out_proj:
        projections += 2 * batch * num_tokens * d_out * d_out
    attention = 4 * batch * num_tokens * num_tokens * d_out
    if causal:
        attention //= 2
    return projections, attention


def attention_flops(
    batch: int,
    num_tokens: int,
    d_in: int,
    d_out: int,
    *,
    causal: bool = True,
    out_proj: bool = True,
    backward: bool = False,
) -> int:
    """Useful FLOPs of one call: the sum of [`flop_terms`][attention_bench.flops.flop_terms].

    Args:
        batch: $b$.
        num_tokens: $T$.
        d_in: input width.
        d_out: total head width.
        causal: count only the lower triangle of the $T \\times T$ products.
        out_proj: include the output projection.
        backward: count forward+backward ($3F$).

    Returns:
        The FLOP count.

    Examples:
        >>> attention_flops(1, 4, 2, 2, causal=False)  # 3*2*4*2*2 + 2*4*2*2 + 4*4*4*2
        256
        >>> attention_flops(1, 4, 2, 2, causal=False, backward=True)
        768
    """
    projections, attention = flop_terms(
        batch, num_tokens, d_in, d_out, causal=causal, out_proj=out_proj
    )
    forward = projections + attention
    return 3 * forward if backward else forward
