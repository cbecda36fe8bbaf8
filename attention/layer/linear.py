r"""Linear attention: the softmax's $\exp(q \cdot k)$ replaced by $\phi(q) \cdot \phi(k)$, so
causal attention becomes a recurrence over a fixed-size state, in three equal forms.

Causal softmax attention weighs value $v_s$ for query $q_t$ by $\exp(q_t \cdot k_s)$ over
$s \le t$. Replace that similarity by a product of features, $\phi(q_t) \cdot \phi(k_s)$ with
$\phi(x) = \operatorname{elu}(x) + 1 > 0$ (Katharopoulos et al., 2020), and the sum
reassociates:

$$
\begin{aligned}
o_t &= \frac{\sum_{s \le t} \bigl(\phi(q_t) \cdot \phi(k_s)\bigr)\, v_s}
            {\sum_{s \le t} \phi(q_t) \cdot \phi(k_s)} \\
    &= \frac{S_t^\top \phi(q_t)}{z_t \cdot \phi(q_t)}, \\
S_t &= S_{t-1} + \phi(k_t)\, v_t^\top, \\
z_t &= z_{t-1} + \phi(k_t),
\end{aligned}
$$

with $S_t \in \mathbb{R}^{d_k \times d_v}$ and $z_t \in \mathbb{R}^{d_k}$: everything a query
needs from the past is one matrix and one vector per head, whatever the length. (We keep
$S$ as $d_k \times d_v$, keys down the rows, as [`attention.layer.delta`][attention.layer.delta]
and transformers do; papers often write its transpose.) With `normalize=False` the
denominator is dropped: $o_t = S_t^\top \phi(q_t)$.

The same computation, three ways, each equal to the others (tests, float64, $10^{-10}$):

- [`linear_parallel`][attention.layer.linear.linear_parallel]: the $T \times T$ matrix
  $A = \operatorname{tril}\bigl(\phi(Q) \phi(K)^\top\bigr)$, then $O = A V / (A \mathbf{1})$;
  what training on a GPU does for short sequences;
- [`linear_recurrent`][attention.layer.linear.linear_recurrent]: one token at a time, the
  state $(S, z)$ carried; constant memory, what decoding does;
- [`linear_chunked`][attention.layer.linear.linear_chunked]: the sequence cut into chunks of
  `chunk_size`; inside a chunk the parallel form, across chunks the state
  (for chunk $c$ of rows $Q_c, K_c, V_c$ after $\phi$:
  $O_c = Q_c S + \operatorname{tril}(Q_c K_c^\top) V_c$, then $S \leftarrow S + K_c^\top V_c$).

Shapes: `q`, `k`: `(B, H, T, d_k)`; `v`: `(B, H, T, d_v)`; the state's `S`:
`(B, H, d_k, d_v)` and `z`: `(B, H, d_k)`.

Examples:
    >>> _ = torch.manual_seed(0)
    >>> q, k, v = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 3)
    >>> parallel = linear_parallel(q, k, v)
    >>> recurrent, state = linear_recurrent(q, k, v)
    >>> chunked, _ = linear_chunked(q, k, v, chunk_size=4)
    >>> torch.allclose(parallel, recurrent, atol=1e-5), torch.allclose(parallel, chunked, atol=1e-5)
    (True, True)
    >>> state.S.shape, state.z.shape  # (B, H, d_k, d_v), (B, H, d_k): whatever T was
    (torch.Size([1, 2, 4, 3]), torch.Size([1, 2, 4]))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.checks import check_flag, check_size, check_tensor

__all__ = [
    "LinearCache",
    "LinearState",
    "check_qkv",
    "elu_plus_one",
    "linear_chunked",
    "linear_parallel",
    "linear_recurrent",
]

FeatureMap = Callable[[Tensor], Tensor]


def elu_plus_one(x: Tensor) -> Tensor:
    r"""$\phi(x) = \operatorname{elu}(x) + 1$: positive, so every weight and denominator is."""
    return F.elu(x) + 1


@dataclass
class LinearState:
    """What causal linear attention remembers of the past: $S = \\sum_s \\phi(k_s) v_s^\\top$
    `(B, H, d_k, d_v)` and $z = \\sum_s \\phi(k_s)$ `(B, H, d_k)`; its size does not depend on
    how many tokens were read."""

    S: Tensor
    z: Tensor

    @classmethod
    def zeros(cls, q: Tensor, v: Tensor) -> LinearState:
        """The empty state for queries `q` `(B, H, T, d_k)` and values `v` `(B, H, T, d_v)`."""
        B, H, _, d_k = q.shape
        S = q.new_zeros(B, H, d_k, v.shape[-1])
        return cls(S, q.new_zeros(B, H, d_k))

    @property
    def nbytes(self) -> int:
        """The bytes the state holds."""
        return self.S.nbytes + self.z.nbytes


class LinearCache:
    """A linear-attention layer's memory while a model decodes: its
    [`LinearState`][attention.layer.linear.LinearState] after the tokens read, and how many
    they were. `update` replaces the state with one of the same shapes: it never grows.
    `length` counts the tokens read, so a model's caches agree on where the next token stands
    (a [`KVCache`][attention.layer.cache.KVCache]'s `length`, one position per row).

    Examples:
        >>> cache = LinearCache(LinearState.zeros(torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)))
        >>> cache.batch_size, cache.length, cache.nbytes  # (2 * 4 * 8 * 8 + 2 * 4 * 8) floats
        (2, 0, 2304)
    """

    contiguous: ClassVar[bool] = True  # every row at `length`: no padding is taken
    max_tokens: ClassVar[None] = None  # no limit: the state has no slots to fill

    def __init__(self, state: LinearState, length: int = 0) -> None:
        if not isinstance(state, LinearState):
            raise TypeError(f"state must be a LinearState, got {type(state).__name__}")
        self.state, self.length = state, check_size("length", length, minimum=0)

    @property
    def batch_size(self) -> int:
        """Sequences held."""
        return self.state.S.shape[0]

    def update(self, state: LinearState, num_tokens: int) -> None:
        """Keep `state`, the state after `num_tokens` more tokens; its shapes, dtype and device
        must not change (checked before anything is kept)."""
        if not isinstance(state, LinearState):
            raise TypeError(f"state must be a LinearState, got {type(state).__name__}")
        num_tokens = check_size("num_tokens", num_tokens, minimum=0)
        for name in ("S", "z"):
            old, new = getattr(self.state, name), getattr(state, name)
            check_tensor(f"state.{name}", new, like=old)
            if new.shape != old.shape:
                raise ValueError(
                    f"state.{name} must keep shape {tuple(old.shape)}, got {tuple(new.shape)}"
                )
        self.state = state
        self.length += num_tokens

    def reset(self) -> None:
        """Forget every token: zeros, `length` 0 (as a new cache)."""
        self.state = LinearState(torch.zeros_like(self.state.S), torch.zeros_like(self.state.z))
        self.length = 0

    @property
    def nbytes(self) -> int:
        """The bytes the state holds, whatever the number of tokens read."""
        return self.state.nbytes


def check_qkv(q: object, k: object, v: object) -> tuple[Tensor, Tensor, Tensor]:
    """Check queries and keys `(B, H, T, d_k)` and values `(B, H, T, d_v)`, one dtype."""
    q = check_tensor("q", q, ndim=4, floating=True)
    k = check_tensor("k", k, ndim=4, like=q)
    v = check_tensor("v", v, ndim=4, like=q)
    if k.shape != q.shape:
        raise ValueError(
            f"k must have q's shape (B, H, T, d_k) {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must have q's (B, H, T) {tuple(q.shape[:3])}, got {tuple(v.shape[:3])}"
        )
    return q, k, v


def _check_state(state: object, q: Tensor, v: Tensor) -> LinearState:
    if state is None:
        return LinearState.zeros(q, v)
    if not isinstance(state, LinearState):
        raise TypeError(f"state must be a LinearState, got {type(state).__name__}")
    empty = LinearState.zeros(q, v)
    for name, dims in (("S", "(B, H, d_k, d_v) of q and v"), ("z", "(B, H, d_k) of q")):
        expected = getattr(empty, name).shape
        check_tensor(f"state.{name}", getattr(state, name), like=q, shape=expected, dims=dims)
    return state


def _divided(out: Tensor, denominator: Tensor) -> Tensor:
    """`out / denominator`, with 0 where the denominator is 0: a query whose weights are all 0
    (a feature map such as ReLU can zero them) gets zeros, as a softmax query that sees no
    key, not 0 / 0 = NaN; its numerator is 0 there too."""
    return out / torch.where(denominator == 0, 1.0, denominator)


def linear_parallel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: FeatureMap = elu_plus_one,
    normalize: bool = True,
) -> Tensor:
    r"""Causal linear attention as one masked matrix: $O = AV / (A\mathbf{1})$,
    $A = \operatorname{tril}(\phi(Q)\phi(K)^\top)$.

    Args:
        q: queries `(B, H, T, d_k)`.
        k: keys `(B, H, T, d_k)`.
        v: values `(B, H, T, d_v)`.
        feature_map: $\phi$, applied to every query and key.
        normalize: divide by $\sum_{s \le t} \phi(q_t) \cdot \phi(k_s)$.

    Returns:
        The outputs `(B, H, T, d_v)`.
    """
    q, k, v = check_qkv(q, k, v)
    normalize = check_flag("normalize", normalize)
    T = q.shape[2]
    # A_ts = phi(q_t) . phi(k_s) for s <= t, else 0                      (B, H, T, T)
    A = (feature_map(q) @ feature_map(k).transpose(-1, -2)).tril()
    out = A @ v  # sum_s A_ts v_s                                         (B, H, T, d_v)
    assert out.shape == (*q.shape[:2], T, v.shape[-1])
    return _divided(out, A.sum(-1, keepdim=True)) if normalize else out


def linear_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    feature_map: FeatureMap = elu_plus_one,
    normalize: bool = True,
    state: LinearState | None = None,
) -> tuple[Tensor, LinearState]:
    r"""Causal linear attention one token at a time: $S_t = S_{t-1} + \phi(k_t) v_t^\top$,
    $z_t = z_{t-1} + \phi(k_t)$, $o_t = S_t^\top \phi(q_t) / (z_t \cdot \phi(q_t))$.

    Args:
        q: queries `(B, H, T, d_k)`.
        k: keys `(B, H, T, d_k)`.
        v: values `(B, H, T, d_v)`.
        feature_map: $\phi$.
        normalize: divide by $z_t \cdot \phi(q_t)$.
        state: the state after the tokens before these (zeros if None); not modified.

    Returns:
        The outputs `(B, H, T, d_v)` and the state after the last token.
    """
    q, k, v = check_qkv(q, k, v)
    normalize = check_flag("normalize", normalize)
    state = _check_state(state, q, v)
    S, z = state.S, state.z  # (B, H, d_k, d_v), (B, H, d_k)
    fq, fk = feature_map(q), feature_map(k)
    outputs = []
    for t in range(q.shape[2]):
        S = S + fk[:, :, t, :, None] * v[:, :, t, None, :]  # S += phi(k_t) v_t^T
        z = z + fk[:, :, t]  # z += phi(k_t)
        o = torch.einsum("bhk,bhkv->bhv", fq[:, :, t], S)  # S^T phi(q_t)       (B, H, d_v)
        if normalize:
            o = _divided(o, (fq[:, :, t] * z).sum(-1, keepdim=True))  # / z . phi(q_t)
        outputs.append(o)
    out = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape)
    return out, LinearState(S, z)


def linear_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    chunk_size: int = 64,
    feature_map: FeatureMap = elu_plus_one,
    normalize: bool = True,
    state: LinearState | None = None,
) -> tuple[Tensor, LinearState]:
    r"""Causal linear attention in chunks: parallel inside, the state across.

    For a chunk's rows $Q_c = \phi(q)$, $K_c = \phi(k)$, $V_c$ and the state $(S, z)$ of the
    chunks before: $O_c = Q_c S + \operatorname{tril}(Q_c K_c^\top) V_c$, the denominator
    $Q_c z + \operatorname{tril}(Q_c K_c^\top)\mathbf{1}$, then $S \leftarrow S + K_c^\top V_c$,
    $z \leftarrow z + K_c^\top \mathbf{1}$. The last chunk may be shorter.

    Args:
        q: queries `(B, H, T, d_k)`.
        k: keys `(B, H, T, d_k)`.
        v: values `(B, H, T, d_v)`.
        chunk_size: tokens per chunk, at least 1.
        feature_map: $\phi$.
        normalize: divide by the running $\sum_{s \le t} \phi(q_t) \cdot \phi(k_s)$.
        state: the state after the tokens before these (zeros if None); not modified.

    Returns:
        The outputs `(B, H, T, d_v)` and the state after the last token.
    """
    q, k, v = check_qkv(q, k, v)
    chunk_size = check_size("chunk_size", chunk_size)
    normalize = check_flag("normalize", normalize)
    state = _check_state(state, q, v)
    S, z = state.S, state.z
    fq, fk = feature_map(q), feature_map(k)
    outputs = []
    for start in range(0, q.shape[2], chunk_size):
        Q, K, V = (x[:, :, start : start + chunk_size] for x in (fq, fk, v))  # (B, H, C, .)
        A = (Q @ K.transpose(-1, -2)).tril()  # inside the chunk          (B, H, C, C)
        o = Q @ S + A @ V  # the chunks before + this one                  (B, H, C, d_v)
        if normalize:
            o = _divided(o, (Q @ z.unsqueeze(-1)) + A.sum(-1, keepdim=True))
        outputs.append(o)
        S = S + K.transpose(-1, -2) @ V  # S += K_c^T V_c
        z = z + K.sum(2)  # z += K_c^T 1
    out = torch.cat(outputs, dim=2) if outputs else v.new_zeros(v.shape)
    return out, LinearState(S, z)
