r"""Attention sinks: somewhere for a head's weight to go that is not a recent token.

A softmax must spend all of a query's weight, and trained heads with nothing to read learn to
park it on tokens every query can see, usually the first ones. Two ways to give them such a
place:

- **sink tokens** (StreamingLLM, Xiao et al. 2023): with a sliding window, the first $k$
  tokens stay visible to every query, $j \le i \wedge (i - j < w \vee j < k)$. This is a
  mask ([`sinks(k)`][attention.layer.masks.sinks], as `causal() & (window(w) | sinks(k))`),
  and a ring-buffer cache keeps those $k$ beside the last $w$
  ([`KVCache`][attention.layer.cache.KVCache]).
- **a learned sink logit** (gpt-oss): each head $h$ learns a logit $z_h$ for a "key" that is
  always visible and carries no value, so its weights may sum to less than 1:

$$
\alpha_{ij} = \frac{e^{s_{ij}}}{e^{z_h} + \sum_{j'} e^{s_{ij'}}}, \qquad
s_{ij} = \frac{\omega_{ij}}{\sqrt{d_k}}.
$$

The explicit path computes the second with
[`softmax_with_sink`][attention.derivation.core.softmax_with_sink]; this module gives the
fused kernel, which has no such term, the sink as one more key
([`with_sink`][attention.layer.sinks.with_sink]).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["with_sink"]


def with_sink(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None,
    sink_logits: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The kernel's inputs with a sink: a zero key and value appended, and a float mask.

    The mask holds 0 where a query sees a token, $-\\infty$ where it does not, and $z_h$ (each
    head's sink logit) in the sink's column.

    Args:
        queries: `(b, h, T, d_h)`.
        keys: `(b, h_kv, S, d_h)`.
        values: `(b, h_kv, S, d_v)`.
        mask: bool, True = may attend, broadcastable to `(b, h, T, S)` (from
            [`visible`][attention.layer.fused.visible]), or float (0 where seen), or None.
        sink_logits: `(h,)`.

    Returns:
        `(queries, keys, values, mask)`: keys and values `S + 1` long, mask `(b, h, T, S + 1)`.
    """
    b, h, num_tokens, _ = queries.shape
    num_keys = keys.shape[-2]
    bias = torch.zeros((), dtype=queries.dtype, device=queries.device)
    if mask is not None and mask.dtype == torch.bool:
        bias = torch.where(mask, bias, float("-inf"))  # (..., T, S)
    elif mask is not None:  # already additive (score modifiers)
        bias = mask.to(queries.dtype)
    bias = bias.expand(b, h, num_tokens, num_keys)
    # the kernel adds the mask after scaling q.k: the zero key's score is exactly z_h
    sink = sink_logits.to(queries.dtype)[None, :, None, None].expand(b, h, num_tokens, 1)
    zero = keys.new_zeros(b, keys.shape[1], 1, keys.shape[-1])
    keys = torch.cat((keys, zero), dim=-2)  # (b, h_kv, S + 1, d_h)
    values = torch.cat((values, zero[..., : values.shape[-1]]), dim=-2)
    return queries, keys, values, torch.cat((bias, sink), dim=-1)  # (b, h, T, S + 1)
