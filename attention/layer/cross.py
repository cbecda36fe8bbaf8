r"""Cross-attention: queries from one sequence, keys and values from another.

$Q = X W_q$, $K = M_k W_k$, $V = M_v W_v$ for the other sequence $M$ (an encoder's output, in
an encoder-decoder); every query sees every real key (nothing is causal between two
sequences), none of the keys' padding. A cache holds the other sequence's keys and values
once: the first call, with `key`, fills it; later calls pass `key=None` and read them.
[`MultiHeadAttention.forward`][attention.layer.multihead.MultiHeadAttention.forward] sends a call
here when it gets `key` (or a cache on a layer whose mask sees everything).

Examples:
    >>> import torch
    >>> from attention import MultiHeadAttention
    >>> layer = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, causal=False, kdim=6, vdim=6)
    >>> memory = torch.randn(2, 5, 6)  # (batch, num_keys, kdim): an encoder's output
    >>> cache = layer.init_cache(batch_size=2, max_tokens=5)
    >>> first = layer(torch.randn(2, 3, 8), key=memory, cache=cache)  # fills the cache
    >>> step = layer(torch.randn(2, 1, 8), cache=cache)  # reads it: (2, 1, 8)
    >>> cache.length  # the 5 keys, stored once
    5
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from attention.checks import check_padding_mask
from attention.derivation.core import explicit_attention
from attention.layer.arguments import check_memory
from attention.layer.cache import KVCache
from attention.layer.fused import cross_attention
from attention.layer.tokens import queries as token_positions

if TYPE_CHECKING:
    from attention.layer.multihead import MultiHeadAttention

__all__ = ["attend", "check"]


def attend(
    layer: MultiHeadAttention,
    x: Tensor,
    key: Tensor | None,
    value: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    cache: KVCache | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    r"""Cross-attention: queries from `x`, keys and values from another sequence.

    $Q = X W_q$, $K = M_k W_k$, $V = M_v W_v$ for the other sequence $M$ (`key`,
    `value`: an encoder's output, in an encoder-decoder); every query sees every real key
    (nothing is causal between two sequences), none of the keys' padding. A cache holds
    the keys and values once: the first call, with `key`, fills it; later calls pass
    `key=None` and read them. `forward` checked the arguments.

    Returns:
        `(context_vec, attn_weights)`, the weights None without `need_weights`.
    """
    b, num_tokens, _ = x.shape
    queries = layer.W_query(x).view(b, num_tokens, layer.num_heads, layer.head_dim)
    queries = queries.transpose(1, 2)  # (b, h, T, d_h)
    keys, values, key_pos = _memory(layer, key, value, key_padding_mask, cache)  # (b, h_kv, S, d_h)
    if need_weights:
        seen = None if key_pos is None else (key_pos >= 0)[:, None, None, :]  # (b, 1, 1, S)
        context_vec, attn_weights = _explicit(layer, queries, keys, values, seen)
    else:
        dropout_p = layer.dropout.p if layer.training else 0.0
        context_vec = cross_attention(
            queries, keys, values, key_pos, dropout_p=dropout_p, scale=layer.scale
        )
        attn_weights = None
    context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, layer.d_out)  # (b, T, d_out)
    return layer.out_proj(context_vec), attn_weights


def refuse_self_attention(layer: MultiHeadAttention) -> None:
    """A layer of other key and value widths than `d_in` attends to another sequence only."""
    raise ValueError(
        f"this module projects keys from kdim={layer.kdim} and values from "
        f"vdim={layer.vdim} wide inputs: pass key= (and value=), the sequence to "
        "attend to"
    )


def check(
    layer: MultiHeadAttention,
    batch: int,
    key: object,
    value: object,
    key_padding_mask: object,
    cache: object,
    *,
    document_ids: object = None,
    positions: object = None,
    angles: object = None,
) -> None:
    """Raise an error naming the argument unless cross-attention can run on these;
    `document_ids`, `positions` and `angles` belong to self-attention and are refused."""
    if document_ids is not None or positions is not None or angles is not None:
        raise ValueError(
            "document_ids pack one sequence's documents (positions and angles "
            "place its tokens): not for cross-attention (key given)"
        )
    plain = layer.rule.bounds.everything and not layer.score_mods
    gated, normed = layer.W_gate is not None, layer.q_norm is not None
    if layer.causal or layer.rope or layer.sink_logits is not None or not plain or gated or normed:
        raise ValueError(
            "cross-attention (key and value from another sequence, or a cache on a module "
            "with causal=False) needs causal=False, rope=False, no sink logit, output gate, "
            f"QK-norm, mask or score modifier; this module has causal={layer.causal}, "
            f"rope={layer.rope}, sink_logit={layer.sink_logits is not None}, "
            f"output_gate={gated}, qk_norm={layer.spec.qk_norm!r}, mask={layer.rule!r}, "
            f"score_mods={list(layer.score_mods)}"
        )
    if cache is not None:
        _check_cache(layer, cache, batch, key)
    if key is None:
        if value is not None or key_padding_mask is not None:
            raise ValueError(
                "value and key_padding_mask come with key (without key, the "
                "cache's keys, values and padding are read)"
            )
        return
    w = layer.W_key.weight
    k = check_memory("key", key, layer.kdim, "kdim", batch, w)
    if value is None and layer.vdim != layer.kdim:
        raise ValueError(
            f"value defaults to key, but values are projected from "
            f"vdim={layer.vdim} and keys from kdim={layer.kdim}: pass "
            "value="
        )
    v = k if value is None else check_memory("value", value, layer.vdim, "vdim", batch, w)
    if v.shape[1] != k.shape[1]:
        raise ValueError(
            f"key and value must have one length (num_keys), got {k.shape[1]} and {v.shape[1]}"
        )
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask, batch, k.shape[1], k.device)
    if isinstance(cache, KVCache) and not 0 < k.shape[1] <= cache.slots:
        raise ValueError(
            f"cache holds 1 to {cache.slots} keys (max_tokens), got key with {k.shape[1]}"
        )


def _check_cache(layer: MultiHeadAttention, cache: object, batch: int, key: object) -> None:
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache (from init_cache), got {type(cache).__name__}")
    weight, keys = layer.W_key.weight, cache.keys
    made = (keys.shape[1], keys.shape[3], keys.dtype, keys.device)
    if made != (layer.num_kv_heads, layer.head_dim, weight.dtype, weight.device):
        raise ValueError(
            f"cache was made for num_kv_heads={made[0]}, head_dim={made[1]}, "
            f"{made[2]} on {made[3]}: use this module's init_cache"
        )
    if batch != cache.batch_size:
        raise ValueError(
            f"cache was made for batch_size={cache.batch_size}, got a batch of {batch}"
        )
    if key is not None and cache.length:
        raise ValueError(
            f"cache already holds {cache.length} keys of the other sequence: "
            "call without key to read them, or reset it first"
        )
    if key is None and not cache.length:
        raise ValueError(
            "cache is empty: the first cross-attention call passes key= (and value=) to fill it"
        )


def _memory(
    layer: MultiHeadAttention,
    key: Tensor | None,
    value: Tensor | None,
    key_padding_mask: Tensor | None,
    cache: KVCache | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The other sequence's keys and values `(b, h_kv, S, d_h)` and segments `(b, S)`."""
    if key is None:  # the cache holds them (checked)
        assert cache is not None
        n = cache.length
        pos = cache.positions[:, :n]
        return cache.keys[:, :, :n], cache.values[:, :, :n], None if cache.contiguous else pos
    value = key if value is None else value
    if key_padding_mask is not None:  # a NaN in padding must not reach a real output
        key = key.masked_fill(key_padding_mask[..., None], 0.0)
        value = value.masked_fill(key_padding_mask[..., None], 0.0)
    b, num_keys, _ = key.shape
    keys = layer.W_key(key).view(b, num_keys, layer.num_kv_heads, layer.head_dim)
    values = layer.W_value(value).view(b, num_keys, layer.num_kv_heads, layer.head_dim)
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # (b, h_kv, S, d_h)
    tokens = token_positions(b, num_keys, key_padding_mask, None, None, keys.device)  # -1: padding
    if cache is not None:
        keys, values, tokens = cache.update(tokens, keys, values)
        if not cache.contiguous:  # padding was not stored: each row's keys at its front
            return keys, values, tokens.pos
    return keys, values, None if key_padding_mask is None else tokens.pos


def _explicit(
    layer: MultiHeadAttention, queries: Tensor, keys: Tensor, values: Tensor, seen: Tensor | None
) -> tuple[Tensor, Tensor]:
    """The explicit path, for the weights: each query head reads its key/value head."""
    group = layer.num_heads // layer.num_kv_heads
    keys = keys.repeat_interleave(group, dim=1)  # (b, h, S, d_h)
    values = values.repeat_interleave(group, dim=1)
    return explicit_attention(queries, keys, values, seen, dropout=layer.dropout, scale=layer.scale)
