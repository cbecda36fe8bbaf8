r"""The delta rule (DeltaNet) and its gated form (Gated DeltaNet, Qwen3-Next's linear
attention): a state that corrects what it predicts for a key instead of only adding.

Linear attention ([`attention.layer.linear`][attention.layer.linear]) only adds to its
state, $S_t = S_{t-1} + k_t v_t^\top$, so an association stored twice under one key is the
sum of both values. The delta rule (Schlag et al., 2021; Yang et al., 2024) first reads
what the state predicts for $k_t$, $S_{t-1}^\top k_t$, and writes a step $\beta_t \in (0, 1)$
of the correction towards $v_t$; Gated DeltaNet (Yang et al., 2025) also decays the state by
$\alpha_t = e^{g_t} \in (0, 1]$ first. With $S \in \mathbb{R}^{d_k \times d_v}$ (keys down
the rows, as transformers stores it; the papers write its transpose):

$$
\begin{aligned}
S_t &= \alpha_t \bigl(I - \beta_t k_t k_t^\top\bigr) S_{t-1} + \beta_t k_t v_t^\top \\
    &= \alpha_t S_{t-1} + k_t \delta_t^\top, \\
\delta_t &= \beta_t \bigl(v_t - \alpha_t S_{t-1}^\top k_t\bigr), \\
o_t &= S_t^\top q_t.
\end{aligned}
$$

DeltaNet is $g = 0$. Three forms, equal (tests, float64, $10^{-10}$):

- [`delta_recurrent`][attention.layer.delta.delta_recurrent]: the loop above;
- [`delta_chunked`][attention.layer.delta.delta_chunked]: the WY/UT form. In a chunk of $C$
  tokens entered with state $S_0$, let $\Gamma_i = \exp\sum_{j \le i} g_j$. Unrolling,
  $\alpha_i S_{i-1}^\top k_i = \Gamma_i S_0^\top k_i
  + \sum_{j<i} (\Gamma_i / \Gamma_j)(k_i \cdot k_j)\, \delta_j$, so the corrections
  $\Delta = [\delta_1; \dots; \delta_C]$ solve one unit lower-triangular system,
  $$(I + L)\,\Delta = \operatorname{diag}(\beta) V - \operatorname{diag}(\beta\Gamma) K S_0,
  \qquad L_{ij} = \beta_i \tfrac{\Gamma_i}{\Gamma_j} k_i \cdot k_j \ (j < i),$$
  and then every output and the next state are matrix products:
  $O = \operatorname{diag}(\Gamma) Q S_0 + (Q K^\top \odot D)\,\Delta$ with
  $D_{ij} = \Gamma_i / \Gamma_j$ for $j \le i$ (else 0), and
  $S_C = \Gamma_C S_0 + \sum_j (\Gamma_C / \Gamma_j)\, k_j \delta_j^\top$;
- [`delta_parallel`][attention.layer.delta.delta_parallel]: the chunked form with one chunk.

Shapes: `q`, `k`: `(B, H, T, d_k)`; `v`: `(B, H, T, d_v)`; `beta`, `g`: `(B, H, T)`; the
state `(B, H, d_k, d_v)`. The layer around it, Qwen3-Next's, is
[`GatedDeltaNet`][attention.layer.gated_delta.GatedDeltaNet].

Examples:
    >>> _ = torch.manual_seed(0)
    >>> q, k, v = torch.randn(1, 2, 9, 4), torch.nn.functional.normalize(torch.randn(1, 2, 9, 4), dim=-1), torch.randn(1, 2, 9, 3)
    >>> beta, g = torch.rand(1, 2, 9), -torch.rand(1, 2, 9)
    >>> recurrent, state = delta_recurrent(q, k, v, beta, g)
    >>> chunked, _ = delta_chunked(q, k, v, beta, g, chunk_size=4)
    >>> torch.allclose(recurrent, chunked, atol=1e-5), state.shape
    (True, torch.Size([1, 2, 4, 3]))
"""  # noqa: E501

from __future__ import annotations

import math

import torch
from torch import Tensor

from attention.checks import check_size, check_tensor
from attention.layer.linear import check_qkv

__all__ = ["check_gates", "delta_chunked", "delta_parallel", "delta_recurrent"]


def check_gates(
    q: Tensor, beta: object, g: object, state: object, d_v: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Check `beta` and `g` `(B, H, T)` (`g` None: zeros, DeltaNet) and the state
    `(B, H, d_k, d_v)` (None: zeros) against the queries `q` `(B, H, T, d_k)`."""
    beta = check_tensor("beta", beta, ndim=3, like=q, shape=q.shape[:3], dims="(B, H, T)")
    g = torch.zeros_like(beta) if g is None else g
    g = check_tensor("g", g, ndim=3, like=q, shape=q.shape[:3], dims="(B, H, T)")
    # values, not only shapes: outside these ranges the rule is not a contraction, and an
    # infinite g (a full reset) is NaN in the chunked form's differences of its running sums
    if not bool(((beta >= 0) & (beta <= 1)).all()):
        raise ValueError(
            f"beta must be write strengths in [0, 1], got values from "
            f"{beta.min().item():.4g} to {beta.max().item():.4g}"
        )
    if not bool(((g <= 0) & (g > -math.inf)).all()):
        raise ValueError(
            f"g must be finite log decays <= 0 (alpha = e^g in (0, 1]), got "
            f"values from {g.min().item():.4g} to {g.max().item():.4g}"
        )
    expected = (*q.shape[:2], q.shape[-1], d_v)
    if state is None:
        return beta, g, q.new_zeros(expected)
    state = check_tensor("state", state, ndim=4, like=q, shape=expected, dims="(B, H, d_k, d_v)")
    return beta, g, state


def delta_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The gated delta rule one token at a time:
    $S_t = \alpha_t S_{t-1} + \beta_t k_t (v_t - \alpha_t S_{t-1}^\top k_t)^\top$,
    $o_t = S_t^\top q_t$.

    Args:
        q: queries `(B, H, T, d_k)`, used as given (no scaling, no normalisation).
        k: keys `(B, H, T, d_k)` (unit length keeps $I - \beta k k^\top$ a contraction).
        v: values `(B, H, T, d_v)`.
        beta: write strengths $\beta_t \in [0, 1]$ `(B, H, T)`; others are refused.
        g: log decays $g_t \le 0$, finite `(B, H, T)` (others refused); None: 0, DeltaNet.
        state: $S$ before these tokens `(B, H, d_k, d_v)`; None: zeros. Not modified.

    Returns:
        The outputs `(B, H, T, d_v)` and the state after the last token.
    """
    q, k, v = check_qkv(q, k, v)
    beta, g, S = check_gates(q, beta, g, state, v.shape[-1])
    outputs = []
    for t in range(q.shape[2]):
        S = S * g[:, :, t, None, None].exp()  # alpha_t S_{t-1}               (B, H, d_k, d_v)
        predicted = torch.einsum("bhkv,bhk->bhv", S, k[:, :, t])  # alpha_t S^T k_t
        delta = beta[:, :, t, None] * (v[:, :, t] - predicted)  # delta_t     (B, H, d_v)
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]  # + k_t delta_t^T
        outputs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))  # S_t^T q_t
    out = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape)
    return out, S


def _chunk(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor, S: Tensor
) -> tuple[Tensor, Tensor]:
    """One chunk of the WY/UT form (the module's equations): outputs `(B, H, C, d_v)` and
    the state after it."""
    C = q.shape[2]
    log_gamma = g.cumsum(-1)  # log Gamma_i                                   (B, H, C)
    # D_ij = Gamma_i / Gamma_j for j <= i, else 0                           (B, H, C, C)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    D = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(~causal, -torch.inf).exp()
    # (I + L) Delta = diag(beta) V - diag(beta Gamma) K S_0, L strictly lower
    L = (beta[..., None] * (k @ k.transpose(-1, -2)) * D).tril(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    rhs = beta[..., None] * (v - log_gamma.exp()[..., None] * (k @ S))  # (B, H, C, d_v)
    Delta = torch.linalg.solve_triangular(eye + L, rhs, upper=False, unitriangular=True)
    # O = diag(Gamma) Q S_0 + (Q K^T . D) Delta
    out = log_gamma.exp()[..., None] * (q @ S) + ((q @ k.transpose(-1, -2)) * D) @ Delta
    # S_C = Gamma_C S_0 + sum_j (Gamma_C / Gamma_j) k_j delta_j^T
    to_end = (log_gamma[..., -1:] - log_gamma).exp()  # Gamma_C / Gamma_j     (B, H, C)
    S = log_gamma[..., -1, None, None].exp() * S + (to_end[..., None] * k).transpose(-1, -2) @ Delta
    return out, S


def delta_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    state: Tensor | None = None,
    *,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    r"""The gated delta rule in chunks of `chunk_size` (the last may be shorter): inside a
    chunk one triangular solve and matrix products, across chunks the state.

    Args:
        q: queries `(B, H, T, d_k)`.
        k: keys `(B, H, T, d_k)`.
        v: values `(B, H, T, d_v)`.
        beta: write strengths `(B, H, T)`.
        g: log decays `(B, H, T)`; None: 0, DeltaNet.
        state: $S$ before these tokens `(B, H, d_k, d_v)`; None: zeros. Not modified.
        chunk_size: tokens per chunk, at least 1.

    Returns:
        The outputs `(B, H, T, d_v)` and the state after the last token.
    """
    q, k, v = check_qkv(q, k, v)
    beta, g, S = check_gates(q, beta, g, state, v.shape[-1])
    chunk_size = check_size("chunk_size", chunk_size)
    outputs = []
    for start in range(0, q.shape[2], chunk_size):
        part = slice(start, start + chunk_size)
        out, S = _chunk(
            q[:, :, part], k[:, :, part], v[:, :, part], beta[:, :, part], g[:, :, part], S
        )
        outputs.append(out)
    out = torch.cat(outputs, dim=2) if outputs else v.new_zeros(v.shape)
    return out, S


def delta_parallel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule over the whole sequence at once: the chunked form with one chunk
    of all `T` tokens (a `T x T` triangular solve). Arguments as
    [`delta_recurrent`][attention.layer.delta.delta_recurrent]'s."""
    return delta_chunked(q, k, v, beta, g, state, chunk_size=max(1, q.shape[2]))
