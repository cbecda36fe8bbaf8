r"""FLOP counts: what one multi-head self-attention call must compute.

A matmul $(m \times k)(k \times n)$ costs $2mkn$ FLOPs. With $b$ sequences of $T$ tokens,
$h$ query heads of width $d_h$ ($h d_h = d_\text{out}$) and $h_{kv}$ key/value heads
($d_{kv} = h_{kv} d_h$, equal to $d_\text{out}$ unless the heads are grouped), the forward pass
costs

$$
\begin{aligned}
F = {} & \underbrace{2 b T d_\text{in} d_\text{out}}_{W_q}
+ \underbrace{2 \cdot 2 b T d_\text{in} d_{kv}}_{W_k, W_v} \\
& + \underbrace{2 b T d_\text{out}^2}_{W_o}
+ \underbrace{4 b P d_\text{out}}_{Q K^\top \text{ and } \alpha V},
\end{aligned}
$$

where $P$ counts the (query, key) pairs each head multiplies: $T^2$ without a mask, $T^2/2$
if causal (the lower triangle), and with a sliding window of $w \le T$ tokens the band
$P = T w - w(w-1)/2 - T/2$ (its cells, the diagonal counted half as in the triangle, so
$w = T$ gives $T^2/2$ again). Each pair costs $2 d_h$ FLOPs in $Q K^\top$ and $2 d_h$ in
$\alpha V$, for each of the $h$ heads: $4 d_\text{out}$. Softmax, scaling and biases are
ignored. The backward pass costs twice the forward (two matmuls per matmul: the gradient of
each operand), so forward+backward is $3F$.
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
    d_kv: int | None = None,
    window: int | None = None,
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
        d_kv: width of the key and value projections, $h_{kv} d_h$; default `d_out`
            (grouped-query attention makes it smaller).
        window: a sliding window of $w$ tokens (causal only): count the band of $P = T w -
            w(w-1)/2 - T/2$ pairs instead of the triangle's $T^2/2$.

    Returns:
        `(projections, attention)` FLOPs of the forward pass.

    Raises:
        ValueError: `window` without `causal`, or `d_kv` or `window` not positive.

    Examples:
        >>> projections, attention = flop_terms(1, 1024, 768, 768)
        >>> 1024 * projections // attention  # the crossover length T*: 4 * 768
        3072
        >>> gqa = flop_terms(1, 1024, 768, 768, d_kv=768 // 4)  # 3 of 12 key/value heads
        >>> gqa[0] / projections, gqa[1] == attention  # smaller W_k, W_v; the same attention
        (0.625, True)
        >>> flop_terms(1, 1024, 768, 768, window=256)[1] // (4 * 768)  # pairs P in the band
        228992
        >>> 1024 * 256 - 256 * 255 // 2 - 1024 // 2
        228992
    """
    d_kv = d_out if d_kv is None else d_kv
    for name, value in (("d_kv", d_kv), ("window", window)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if window is not None and not causal:
        raise ValueError(f"window={window} needs causal=True (the window looks back)")
    projections = 2 * batch * num_tokens * d_in * (d_out + 2 * d_kv)
    if out_proj:
        projections += 2 * batch * num_tokens * d_out * d_out
    pairs_x2 = num_tokens * num_tokens  # twice the causal triangle's pairs, T^2
    if not causal:
        pairs_x2 *= 2
    elif window is not None and window < num_tokens:
        pairs_x2 = 2 * num_tokens * window - window * (window - 1) - num_tokens
    return projections, 2 * batch * pairs_x2 * d_out


def attention_flops(
    batch: int,
    num_tokens: int,
    d_in: int,
    d_out: int,
    *,
    causal: bool = True,
    out_proj: bool = True,
    d_kv: int | None = None,
    window: int | None = None,
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
        d_kv: width of the key and value projections (grouped heads); default `d_out`.
        window: a sliding window of this many tokens (causal only).
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
        batch, num_tokens, d_in, d_out, causal=causal, out_proj=out_proj, d_kv=d_kv, window=window
    )
    forward = projections + attention
    return 3 * forward if backward else forward
