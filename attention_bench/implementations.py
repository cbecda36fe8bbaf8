r"""What is compared: every attention implementation as one module, `forward(x) -> (b, T, d)`.

| name | what |
| --- | --- |
| `sdpa_reference` | [`SDPAReference`][attention_bench.implementations.SDPAReference]: three `Linear`s, SDPA `is_causal=True`, `out_proj` |
| `production` | production `MultiHeadAttention` (fused `scaled_dot_product_attention`) |
| `explicit` | production `MultiHeadAttention(..., need_weights=True)`: the explicit path |
| `wrapper` | `MultiHeadAttentionWrapper`: one `CausalAttention` per head, concatenated |
| `torch_mha` | `torch.nn.MultiheadAttention(need_weights=False)`, causal |
| `torch_mha_weights` | `torch.nn.MultiheadAttention` with its default `need_weights=True` |
| `production_padded` | production with a `key_padding_mask`: right padding, the last eighth of each row |
| `production_left_padded` | the same with left padding: the first eighth of each row |
| `torch_mha_padded` | `torch.nn.MultiheadAttention(need_weights=False)` + the right padding |
| `production_gqa` | production with `num_kv_heads = num_heads / 4` (grouped-query attention) |
| `production_window` | production with a sliding `window` of 1,024 tokens |

Every module has biases on the query/key/value and output projections (GPT-2's choice), so
all do the same arithmetic (the wrapper has no output projection).
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from attention import MultiHeadAttention, MultiHeadAttentionWrapper, causal_mask
from attention.layer.testing import padding_mask
from attention_bench.flops import attention_flops

__all__ = [
    "MODES",
    "REFERENCE",
    "Impl",
    "SDPAReference",
    "Shape",
    "cuda_backend_impls",
    "implementations",
]

REFERENCE = "sdpa_reference"
MODES = ("forward", "forward_backward")
SDPA_BACKENDS = ("flash", "efficient", "math")


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: `batch` sequences of `num_tokens` tokens, `d_model` wide."""

    batch: int
    num_tokens: int
    d_model: int
    num_heads: int


class SDPAReference(nn.Module):
    r"""The minimal causal multi-head attention on the fused kernel: what ours must match.

    $$
    \begin{aligned}
    \text{out} = \big[\operatorname{SDPA}( & Q^{(i)}, K^{(i)}, V^{(i)}, \\
    & \text{is\_causal})\big]_{i=1}^{h} W_o + b_o
    \end{aligned}
    $$

    with three separate projections (like the production module, so both do the same work).

    Args:
        d_in: width of each input embedding.
        d_out: total output width, `num_heads * head_dim`.
        num_heads: number of heads $h$.
        qkv_bias: whether the query/key/value projections have a bias.

    Examples:
        >>> import torch
        >>> ref = SDPAReference(8, 8, num_heads=2)
        >>> ref(torch.randn(3, 5, 8)).shape  # (batch, num_tokens, d_out)
        torch.Size([3, 5, 8])
    """

    def __init__(self, d_in: int, d_out: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)

    def forward(self, x: Tensor) -> Tensor:
        b, T, _ = x.shape
        split = (b, T, self.num_heads, self.head_dim)
        queries = self.W_query(x).view(split).transpose(1, 2)  # (b, h, T, d_h)
        keys = self.W_key(x).view(split).transpose(1, 2)  # (b, h, T, d_h)
        values = self.W_value(x).view(split).transpose(1, 2)  # (b, h, T, d_h)
        context_vec = F.scaled_dot_product_attention(queries, keys, values, is_causal=True)
        context_vec = context_vec.transpose(1, 2).reshape(b, T, -1)  # (b, T, d_out)
        out: Tensor = self.out_proj(context_vec)  # (b, T, d_out)
        return out


class _Call(nn.Module):
    """Adapts a module with another call signature to `forward(x) -> (batch, T, d_out)`."""

    key_padding_mask: Tensor | None
    causal_mask: Tensor | None

    def __init__(
        self,
        inner: nn.Module,
        call: Callable[[_Call, Tensor], Tensor],
        *,
        key_padding_mask: Tensor | None = None,
        causal_mask: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self._call = call
        self.register_buffer("key_padding_mask", key_padding_mask)
        self.register_buffer("causal_mask", causal_mask)

    def forward(self, x: Tensor) -> Tensor:
        return self._call(self, x)


def _padding(shape: Shape, side: Literal["right", "left"]) -> Tensor:
    """An eighth of every sequence is padding (True): its end (right) or its start (left)."""
    lengths = [shape.num_tokens - shape.num_tokens // 8] * shape.batch
    return padding_mask(lengths, shape.num_tokens, side=side)  # (b, T)


def _torch_mha(shape: Shape, *, need_weights: bool, padded: bool) -> nn.Module:
    mha = nn.MultiheadAttention(shape.d_model, shape.num_heads, bias=True, batch_first=True)

    def call(m: _Call, x: Tensor) -> Tensor:
        out, _ = m.inner(
            x,
            x,
            x,
            key_padding_mask=m.key_padding_mask,
            need_weights=need_weights,
            attn_mask=m.causal_mask,
            is_causal=True,
        )
        return out  # type: ignore[no-any-return]

    # nn.MultiheadAttention needs the (T, T) mask even with is_causal=True (it is a hint).
    return _Call(
        mha,
        call,
        key_padding_mask=_padding(shape, "right") if padded else None,
        causal_mask=~causal_mask(shape.num_tokens),  # nn.MultiheadAttention's: True = hidden
    )


WINDOW = 1024
"""The sliding window of `production_window`, in tokens."""


def gqa_kv_heads(num_heads: int) -> int:
    """The key/value heads of `production_gqa`: a quarter of the query heads, at least one."""
    return max(1, num_heads // 4)


def _production(
    shape: Shape,
    *,
    need_weights: bool = False,
    padded: Literal["right", "left"] | None = None,
    num_kv_heads: int | None = None,
    window: int | None = None,
) -> nn.Module:
    d, h = shape.d_model, shape.num_heads
    mha = MultiHeadAttention(
        d, d, shape.num_tokens, 0.0, h, qkv_bias=True, num_kv_heads=num_kv_heads, window=window
    )
    if not need_weights and not padded:
        return mha

    def call(m: _Call, x: Tensor) -> Tensor:
        out = m.inner(x, m.key_padding_mask, need_weights=need_weights)
        return out[0] if need_weights else out  # type: ignore[no-any-return]

    return _Call(mha, call, key_padding_mask=_padding(shape, padded) if padded else None)


def _wrapper(shape: Shape) -> nn.Module:
    head_dim = shape.d_model // shape.num_heads
    return MultiHeadAttentionWrapper(
        shape.d_model, head_dim, shape.num_tokens, 0.0, shape.num_heads, qkv_bias=True
    )


@dataclass(frozen=True)
class Impl:
    """One implementation: how to build it, and up to which length it is worth running."""

    name: str
    build: Callable[[Shape], nn.Module]
    out_proj: bool = True
    modes: tuple[str, ...] = MODES
    max_tokens: int | None = None
    capped_modes: tuple[str, ...] = MODES  # the modes that `max_tokens` limits
    skip_reason: str = ""
    backend: str | None = None  # CUDA only: force one SDPA backend
    kv_heads: Callable[[int], int] | None = None  # num_heads -> key/value heads; None: all
    window: int | None = None  # a sliding window, in tokens

    def flops(self, shape: Shape, *, backward: bool = False) -> int:
        """Useful FLOPs of one call at `shape`: its own key/value width and window counted.

        Examples:
            >>> gpt2 = Shape(batch=8, num_tokens=1024, d_model=768, num_heads=12)
            >>> mha, gqa = implementations(0)[1], implementations(0)[-2]
            >>> round(gqa.flops(gpt2) / mha.flops(gpt2), 3)  # smaller W_k, W_v
            0.719
        """
        head_dim = shape.d_model // shape.num_heads
        kv_heads = shape.num_heads if self.kv_heads is None else self.kv_heads(shape.num_heads)
        b, t, d, d_kv = shape.batch, shape.num_tokens, shape.d_model, kv_heads * head_dim
        return attention_flops(
            b, t, d, d, out_proj=self.out_proj, d_kv=d_kv, window=self.window, backward=backward
        )

    def skipped(self, mode: str, shape: Shape) -> str | None:
        """Why `mode` is not run at `shape`, or None if it is."""
        if self.max_tokens is None or mode not in self.capped_modes:
            return None
        if shape.num_tokens <= self.max_tokens:
            return None
        gib = 4 * shape.batch * shape.num_heads * shape.num_tokens**2 / 2**30
        return self.skip_reason.format(gib=gib, T=shape.num_tokens)


_TT = (
    "materialises (batch, num_heads, T, T) fp32 weights, {gib:.1f} GiB per copy at T={T}, "
    "several copies alive at once: over this run's memory and time budget"
)
_FASTPATH = (
    "nn.MultiheadAttention's inference fast path (eval + no_grad; the causal attn_mask it "
    "requires, or the key_padding_mask, is merged into a mask) " + _TT
)


def implementations(max_explicit_tokens: int) -> list[Impl]:
    """Every implementation compared, the SDPA reference first, production second.

    Args:
        max_explicit_tokens: the longest context at which the paths that build
            $T \\times T$ matrices are run.

    Returns:
        The implementations, in the order of the table above.

    Examples:
        >>> [impl.name for impl in implementations(2048)][:3]
        ['sdpa_reference', 'production', 'explicit']
    """
    n = max_explicit_tokens
    forward = ("forward",)
    return [
        Impl(REFERENCE, lambda s: SDPAReference(s.d_model, s.d_model, s.num_heads)),
        Impl("production", _production),
        Impl(
            "explicit",
            lambda s: _production(s, need_weights=True),
            max_tokens=n,
            skip_reason=_TT,
        ),
        Impl("wrapper", _wrapper, out_proj=False, max_tokens=n, skip_reason=_TT),
        Impl(
            "torch_mha",
            lambda s: _torch_mha(s, need_weights=False, padded=False),
            max_tokens=n,
            capped_modes=forward,
            skip_reason=_FASTPATH,
        ),
        Impl(
            "torch_mha_weights",
            lambda s: _torch_mha(s, need_weights=True, padded=False),
            max_tokens=n,
            skip_reason=_TT,
        ),
        Impl("production_padded", lambda s: _production(s, padded="right"), modes=forward),
        Impl("production_left_padded", lambda s: _production(s, padded="left"), modes=forward),
        Impl(
            "torch_mha_padded",
            lambda s: _torch_mha(s, need_weights=False, padded=True),
            modes=forward,
            max_tokens=n,
            skip_reason=_FASTPATH,
        ),
        Impl(
            "production_gqa",
            lambda s: _production(s, num_kv_heads=gqa_kv_heads(s.num_heads)),
            kv_heads=gqa_kv_heads,
        ),
        Impl("production_window", lambda s: _production(s, window=WINDOW), window=WINDOW),
    ]


def cuda_backend_impls() -> list[Impl]:
    """CUDA only: the reference and production modules with one SDPA backend forced."""
    return [
        Impl(f"{impl.name}[{backend}]", impl.build, backend=backend)
        for impl in implementations(0)[:2]
        for backend in SDPA_BACKENDS
    ]
