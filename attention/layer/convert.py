"""Conversions into the production layer: the book's wrapper of heads, and the book's checkpoints.

- [`from_wrapper`][attention.layer.convert.from_wrapper]: the fused module that computes what
  chapter 8's `MultiHeadAttentionWrapper` computes;
- [`drop_book_mask`][attention.layer.convert.drop_book_mask]: a load hook that accepts the book's
  `mask` buffer after checking it is the causal mask the layer computes.

Out of the layer, to PyTorch's `nn.MultiheadAttention`, is
[`to_torch_mha`][attention.layer.testing.to_torch_mha].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attention.derivation.causal import CausalAttention
from attention.derivation.core import causal_mask
from attention.derivation.wrapper import MultiHeadAttentionWrapper

if TYPE_CHECKING:
    from attention.layer.multihead import MultiHeadAttention

__all__ = ["drop_book_mask", "from_wrapper"]


def from_wrapper(
    cls: type[MultiHeadAttention], wrapper: MultiHeadAttentionWrapper
) -> MultiHeadAttention:
    """The fused module that computes exactly what `wrapper` computes.

    Head $i$'s `W_query` becomes rows $i d_h \\dots (i+1) d_h$ of the fused `W_query` (and
    likewise for keys and values), which is the slice that the head split's `view` hands
    to head $i$; `out_proj` is the identity with zero bias, since the wrapper has none.
    The new module is in the wrapper's mode (`training` or `eval`).

    Args:
        wrapper: a `MultiHeadAttentionWrapper` of `num_heads` heads, each `d_out` wide.

    Returns:
        A `MultiHeadAttention` with `d_out * num_heads` outputs, same device, dtype and
        mode.

    Raises:
        TypeError: `wrapper` is not a `MultiHeadAttentionWrapper`.

    Examples:
        >>> from attention import MultiHeadAttention
        >>> _ = torch.manual_seed(0)
        >>> wrapper = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0, num_heads=2)
        >>> fused = from_wrapper(MultiHeadAttention, wrapper.eval())
        >>> fused.training
        False
        >>> x = torch.randn(2, 6, 3)
        >>> torch.allclose(wrapper(x), fused(x), atol=1e-6)
        True
    """
    if not isinstance(wrapper, MultiHeadAttentionWrapper):
        raise TypeError(f"expected a MultiHeadAttentionWrapper, got {type(wrapper).__name__}")
    heads: list[CausalAttention] = list(wrapper.heads)  # type: ignore[arg-type]
    first = heads[0]
    qkv_bias = first.W_query.bias is not None
    weight = first.W_query.weight
    fused = cls(
        first.d_in,
        first.d_out * len(heads),
        first.context_length,
        first.dropout.p,
        num_heads=len(heads),
        qkv_bias=qkv_bias,
    ).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        for name in ("W_query", "W_key", "W_value"):
            target: nn.Linear = getattr(fused, name)
            target.weight.copy_(torch.cat([getattr(h, name).weight for h in heads], dim=0))
            if qkv_bias:
                target.bias.copy_(torch.cat([getattr(h, name).bias for h in heads], dim=0))
        fused.out_proj.weight.copy_(torch.eye(fused.d_out))
        fused.out_proj.bias.zero_()
    return fused.train(wrapper.training)


def drop_book_mask(
    module: nn.Module,
    state_dict: dict[str, Tensor],
    prefix: str,
    *args: object,
) -> None:
    """A load hook: accept a book checkpoint's `mask` buffer, after checking it is causal.

    The book's class stores `triu(ones(context_length, context_length), 1)` (a float buffer
    of 1.0 above the diagonal; a bool one is taken too); this module computes the mask
    instead, so the entry is checked and dropped. Any other mask would change what the module
    computes, and is refused rather than silently ignored.
    """
    key = prefix + "mask"
    if key not in state_dict:
        return
    mask = state_dict.pop(key)
    causal = getattr(module, "causal", True)
    if not isinstance(mask, Tensor) or mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"the state_dict's {key!r} must be a square (n, n) tensor, got {shape}")
    if mask.device.type != "meta" and not torch.equal(
        mask.bool(),
        ~causal_mask(mask.shape[0], device=mask.device),  # the book's: True hidden
    ):
        raise ValueError(
            f"the state_dict's {key!r} is not the causal mask triu(ones(n, n), diagonal=1) "
            "that a book checkpoint holds: MultiHeadAttention computes its mask (causal or "
            "none, by `causal`) and cannot load another"
        )
    if not causal:
        raise ValueError(
            f"the state_dict's {key!r} is a causal mask, but this module has causal=False: "
            "load it into a causal module, or delete the entry to reuse the weights "
            "without the mask"
        )
