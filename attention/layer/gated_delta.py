r"""Qwen3-Next's linear-attention layer, `GatedDeltaNet`: projections, a short causal
convolution, the gated delta rule, a gated RMSNorm; and a decode state of fixed size.

For the input $x_t \in \mathbb{R}^{D}$ of token $t$, with $H_k$ query/key heads of width
$d_k$ and $H_v$ value heads of width $d_v$ ($H_v$ a multiple of $H_k$):

$$
\begin{aligned}
[q; k; v; z] &= W_{qkvz}\, x_t, \\
[b; a] &= W_{ba}\, x_t, \\
c_t &= \textstyle\sum_{j=0}^{K-1} w_j \odot [q; k; v]_{t-K+1+j}, \\
[q; k; v] &\leftarrow \operatorname{SiLU}(c_t), \\
q &\leftarrow \frac{q}{\lVert q \rVert \sqrt{d_k}}, \\
k &\leftarrow \frac{k}{\lVert k \rVert}, \\
\beta_t &= \sigma(b), \\
g_t &= -e^{A_{\log}} \operatorname{softplus}(a + \Delta_{\text{bias}}), \\
o_t &= \text{the gated delta rule } (S_t^\top q_t), \\
\tilde o_t &= \operatorname{RMSNorm}(o_t) \odot w \odot \operatorname{SiLU}(z), \\
y_t &= W_{\text{out}}\, \tilde o_t.
\end{aligned}
$$

The convolution $c_t$ is depthwise and causal, with a kernel of $K$ inputs; $q$ and $k$ are
normalised per head, then each repeated to its $H_v / H_k$ value heads.

Parameter names and layouts are transformers' `Qwen3NextGatedDeltaNet`'s (`in_proj_qkvz`
and `in_proj_ba` interleaved per key head, `conv1d`, `dt_bias`, `A_log`, `norm.weight`,
`out_proj`), so its state dict loads as it is
([`from_transformers`][attention.layer.gated_delta.from_transformers]).

Decoding keeps a [`GatedDeltaState`][attention.layer.gated_delta.GatedDeltaState]: the last
$K - 1$ convolution inputs and the delta rule's $S$ per value head. Its size is fixed by the
layer, not by the number of tokens read, unlike a key/value cache.

Examples:
    >>> _ = torch.manual_seed(0)
    >>> layer = GatedDeltaNet(32, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8)
    >>> x = torch.randn(1, 6, 32)
    >>> state = layer.init_state(batch_size=1)
    >>> steps = torch.cat([layer(x[:, t : t + 1], state=state) for t in range(6)], dim=1)
    >>> torch.allclose(steps, layer(x), atol=1e-5)
    True
    >>> state.conv.shape, state.recurrent.shape  # (B, 2 H_k d_k + H_v d_v, K - 1), (B, H_v, d_k, d_v)
    (torch.Size([1, 64, 3]), torch.Size([1, 4, 8, 8]))
"""  # noqa: E501

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.checks import check_input, check_positive, check_size, check_tensor
from attention.layer.delta import delta_chunked, delta_recurrent

__all__ = ["GatedDeltaNet", "GatedDeltaState", "from_transformers"]


@dataclass
class GatedDeltaState:
    """A [`GatedDeltaNet`][attention.layer.gated_delta.GatedDeltaNet]'s memory of the tokens
    read: `conv` `(B, conv_dim, K - 1)`, the last inputs of the causal convolution, and
    `recurrent` `(B, H_v, d_k, d_v)`, the delta rule's state. `update` replaces both with
    tensors of the same shapes: the state never grows. `length` counts the tokens read, so a
    model's caches agree on where the next token stands (a
    [`KVCache`][attention.layer.cache.KVCache]'s `length`, with one position per row)."""

    conv: Tensor
    recurrent: Tensor
    length: int = 0

    contiguous: ClassVar[bool] = True  # every row at `length`: no padding is taken

    @property
    def batch_size(self) -> int:
        """Sequences held."""
        return self.conv.shape[0]

    @property
    def max_tokens(self) -> None:
        """No limit: the state has no slots to fill."""
        return None

    def update(self, conv: Tensor, recurrent: Tensor, num_tokens: int = 0) -> None:
        """Store the state after a forward of `num_tokens` tokens; shapes must not change."""
        for name, old, new in (("conv", self.conv, conv), ("recurrent", self.recurrent, recurrent)):
            if new.shape != old.shape:
                raise ValueError(
                    f"state.{name} must keep shape {tuple(old.shape)}, got {tuple(new.shape)}"
                )
        self.conv, self.recurrent = conv, recurrent
        self.length += num_tokens

    def reset(self) -> None:
        """Forget every token: zeros, `length` 0 (as a new state)."""
        self.conv, self.recurrent = torch.zeros_like(self.conv), torch.zeros_like(self.recurrent)
        self.length = 0

    @property
    def nbytes(self) -> int:
        """The bytes the state holds."""
        return self.conv.nbytes + self.recurrent.nbytes


class GatedRMSNorm(nn.Module):
    r"""$\operatorname{RMSNorm}(o) \odot w \odot \operatorname{SiLU}(z)$ over the last
    dimension (Qwen3-Next's `Qwen3NextRMSNormGated`)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o: Tensor, z: Tensor) -> Tensor:
        normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed * F.silu(z)


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    r"""$x / \sqrt{\lVert x \rVert^2 + \epsilon}$ over the last dimension (the FLA library's,
    which transformers matches)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's Gated DeltaNet layer (the module's equations).

    Args:
        d_in: the model width $D$.
        num_k_heads: query/key heads $H_k$.
        num_v_heads: value heads $H_v$, a multiple of $H_k$.
        head_k_dim: $d_k$.
        head_v_dim: $d_v$.
        conv_kernel_size: $K$, the causal convolution's width.
        eps: the gated RMSNorm's epsilon.
        chunk_size: the chunked delta rule's chunk, for more than one token at a time.
    """

    def __init__(
        self,
        d_in: int,
        *,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel_size: int = 4,
        eps: float = 1e-6,
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        self.d_in = check_size("d_in", d_in)
        self.num_k_heads = check_size("num_k_heads", num_k_heads)
        self.num_v_heads = check_size("num_v_heads", num_v_heads)
        if num_v_heads % num_k_heads:
            raise ValueError(
                f"num_v_heads must be a multiple of num_k_heads ({num_k_heads}), got {num_v_heads}"
            )
        self.head_k_dim = check_size("head_k_dim", head_k_dim)
        self.head_v_dim = check_size("head_v_dim", head_v_dim)
        self.conv_kernel_size = check_size("conv_kernel_size", conv_kernel_size)
        self.chunk_size = check_size("chunk_size", chunk_size)
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim  # q, k, v pass the convolution
        self.in_proj_qkvz = nn.Linear(d_in, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(d_in, 2 * num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            conv_kernel_size,
            bias=False,
            groups=self.conv_dim,
            padding=conv_kernel_size - 1,
        )
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.empty(num_v_heads).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(head_v_dim, eps=check_positive("eps", eps))
        self.out_proj = nn.Linear(self.value_dim, d_in, bias=False)

    rotary = None  # no positions enter the layer: a model makes no RoPE angles for it
    window = None  # its state is fixed: no window bounds what it keeps

    def init_cache(self, batch_size: int, max_tokens: int | None = None) -> GatedDeltaState:
        """[`init_state`][attention.layer.gated_delta.GatedDeltaNet.init_state], under the name
        a model calls on every layer: `max_tokens` (checked) sizes nothing, the state never
        grows."""
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
        return self.init_state(batch_size)

    def check_cache(self, cache: object, batch_size: int, num_tokens: int) -> None:
        """Raise an error naming `cache` unless it is this layer's state for `batch_size` rows.

        Raises:
            TypeError: not a `GatedDeltaState`, or another dtype.
            ValueError: other shapes (another layer's, or another batch size) or device.
        """
        like = self.out_proj.weight.new_empty(batch_size, 1, self.d_in)
        if not isinstance(cache, GatedDeltaState):
            raise TypeError(
                f"cache must be this GatedDeltaNet layer's GatedDeltaState (from init_cache), "
                f"got {type(cache).__name__}"
            )
        self._check_state(cache, like)

    def init_state(self, batch_size: int) -> GatedDeltaState:
        """The empty state (zeros) for decoding `batch_size` sequences."""
        like = self.out_proj.weight
        conv = like.new_zeros(
            check_size("batch_size", batch_size), self.conv_dim, self.conv_kernel_size - 1
        )
        shape = (batch_size, self.num_v_heads, self.head_k_dim, self.head_v_dim)
        return GatedDeltaState(conv, like.new_zeros(shape))

    def _check_state(self, state: object, x: Tensor) -> GatedDeltaState:
        """`state` (None: the empty state) checked against the input `x` `(B, T, D)`."""
        empty = self.init_state(x.shape[0])
        if state is None:
            return empty
        if not isinstance(state, GatedDeltaState):
            raise TypeError(f"state must be a GatedDeltaState, got {type(state).__name__}")
        for name in ("conv", "recurrent"):
            expected = getattr(empty, name).shape
            check_tensor(f"state.{name}", getattr(state, name), like=x, shape=expected)
        return state

    def _split(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The projections, per key head `[q, k, v, z]` and `[b, a]` as transformers lays them
        out -> the convolution's input `(B, conv_dim, T)`, z `(B, T, H_v, d_v)`, b, a `(B, T, H_v)`."""  # noqa: E501
        B, T, _ = x.shape
        r, d_k, d_v = self.num_v_heads // self.num_k_heads, self.head_k_dim, self.head_v_dim
        qkvz = self.in_proj_qkvz(x).view(B, T, self.num_k_heads, 2 * d_k + 2 * r * d_v)
        q, k, v, z = qkvz.split([d_k, d_k, r * d_v, r * d_v], dim=-1)
        b, a = self.in_proj_ba(x).view(B, T, self.num_k_heads, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], dim=-1).transpose(1, 2)
        z = z.reshape(B, T, self.num_v_heads, d_v)
        return mixed, z, b.reshape(B, T, -1), a.reshape(B, T, -1)

    def forward(self, x: Tensor, state: GatedDeltaState | None = None) -> Tensor:
        """`x` `(B, T, D)` -> `(B, T, D)`. With `state`, continue from it and store the new
        one in it (`state.update`): one token at a time is decoding."""
        check_input(x, self.d_in, batched=True, like=self.out_proj.weight)
        B, T, _ = x.shape
        if B == 0 or T == 0:  # nothing read: an empty output, the state as it was
            if state is not None and B:
                self._check_state(state, x)
            return x.new_zeros(B, T, self.out_proj.out_features)
        keep = state is not None
        state = self._check_state(state, x)
        mixed, z, b, a = self._split(x)
        # the causal depthwise convolution over [the K - 1 inputs before; these T]
        window = torch.cat([state.conv, mixed], dim=-1)  # (B, conv_dim, K - 1 + T)
        # out_t = sum_j w_j * x_{t-K+1+j}, per channel (what nn.Conv1d(groups=conv_dim) computes)
        taps = window.unfold(-1, self.conv_kernel_size, 1)  # (B, conv_dim, T, K)
        conv = F.silu((taps * self.conv1d.weight[:, None, 0, :]).sum(-1))  # (B, conv_dim, T)
        q, k, v = conv.transpose(1, 2).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        # heads first: (B, H, T, d); q, k normalised, q scaled, then repeated to the value heads
        r = self.num_v_heads // self.num_k_heads
        q, k = (t.view(B, T, self.num_k_heads, self.head_k_dim).transpose(1, 2) for t in (q, k))
        q = l2_normalize(q) * self.head_k_dim**-0.5
        q, k = q.repeat_interleave(r, dim=1), l2_normalize(k).repeat_interleave(r, dim=1)
        v = v.view(B, T, self.num_v_heads, self.head_v_dim).transpose(1, 2)  # (B, H_v, T, d_v)
        beta = b.sigmoid().transpose(1, 2)  # beta = sigma(b)                    (B, H_v, T)
        g = (-self.A_log.exp() * F.softplus(a + self.dt_bias)).transpose(1, 2)  # log alpha
        if T == 1:
            o, S = delta_recurrent(q, k, v, beta, g, state.recurrent)
        else:
            o, S = delta_chunked(q, k, v, beta, g, state.recurrent, chunk_size=self.chunk_size)
        if keep:
            state.update(window[..., window.shape[-1] - state.conv.shape[-1] :], S, T)
        y = self.norm(o.transpose(1, 2), z)  # (B, T, H_v, d_v)
        out: Tensor = self.out_proj(y.reshape(B, T, self.value_dim))  # W_out [...]  (B, T, D)
        return out


def from_transformers(module: nn.Module) -> GatedDeltaNet:
    """transformers' `Qwen3NextGatedDeltaNet` as a
    [`GatedDeltaNet`][attention.layer.gated_delta.GatedDeltaNet] with the same weights (copies),
    in their dtype and on their device.

    Raises:
        ValueError: an activation other than SiLU, or a tensor the layer does not have.
    """
    theirs: Any = module  # transformers' attributes, read by name
    if theirs.activation not in ("silu", "swish"):
        raise ValueError(f"the convolution's activation must be silu, got {theirs.activation!r}")
    names = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel_size")
    sizes = {name: int(getattr(theirs, name)) for name in names}
    weight = theirs.out_proj.weight
    layer = GatedDeltaNet(int(theirs.hidden_size), eps=float(theirs.layer_norm_epsilon), **sizes)
    layer = layer.to(dtype=weight.dtype, device=weight.device)
    layer.load_state_dict(module.state_dict(), strict=True)
    return layer
