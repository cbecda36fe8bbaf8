"""The layer's argument checks: each raises an error that names the argument, what it must be
and what it got, before anything is computed or stored.

The forward's own fast test reads only shapes, dtypes and devices; these run when it fails
(or when an optional argument is given), so a decode step pays for none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import torch
from torch import Tensor

from attention.checks import (
    check_flag,
    check_padding_mask,
    check_size,
    check_tensor,
)
from attention.layer.cache import KVCache
from attention.layer.masks import Mask, as_mask, from_flags
from attention.layer.tokens import Tokens

if TYPE_CHECKING:
    from attention.layer.spec import Specified

__all__ = [
    "ForwardOptions",
    "Positions",
    "check_angles",
    "check_cache",
    "check_cross_options",
    "check_documents",
    "check_memory",
    "check_prefill",
    "check_qkv",
    "check_rows",
    "check_sizes",
    "layer_mask",
    "padding_zeroed",
    "positions_line",
    "readable",
]


class ForwardOptions(TypedDict, total=False):
    """`MultiHeadAttention.forward`'s keyword-only arguments, as its overloads take them."""

    cache: KVCache | None
    document_ids: Tensor | None
    key: Tensor | None
    value: Tensor | None
    positions: Tensor | None
    angles: tuple[Tensor, Tensor] | None


def layer_mask(causal: bool | None, window: int | None, sinks: int, mask: object) -> Mask:
    """The layer's mask: `mask` (with `causal=True`, `causal() & mask`), or the shorthand's."""
    if causal is not None:
        check_flag("causal", causal)
    if mask is None:
        return from_flags(True if causal is None else causal, window, sinks)
    if window is not None or sinks:
        raise ValueError(
            f"pass mask= or window=/sinks=, not both: got mask={mask!r:.60}, "
            f"window={window}, sinks={sinks} (write window(w) | sinks(k) into "
            "the mask)"
        )
    rule = as_mask(mask)
    if causal is False and rule.bounds.causal:
        raise ValueError(f"causal=False, but mask={rule!r} hides the future: drop causal=")
    return from_flags(True, None, 0) & rule if causal else rule


def check_cross_options(kdim: int, vdim: int, d_in: int, **options: object) -> None:
    """Other widths than `d_in` are for cross-attention: no causal mask, RoPE, sink, QK-norm or
    mask."""
    if any(value not in (False, None, ()) for value in options.values()):
        got = ", ".join(f"{k}={v}" for k, v in options.items())
        raise ValueError(
            f"kdim={kdim}, vdim={vdim} (other than d_in={d_in}) are for cross-attention, "
            f"which needs causal=False, rope=False, no sink_logit, qk_norm, mask or score_mods; "
            f"got {got}"
        )


def check_sizes(
    d_in: object, d_out: object, context_length: object, num_heads: object, num_kv_heads: object
) -> tuple[int, int, int, int, int]:
    """The layer's sizes as ints (NumPy's too), each at least 1, the heads dividing evenly;
    `num_kv_heads` None is `num_heads`."""
    names = ("d_in", "d_out", "context_length", "num_heads", "num_kv_heads")
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    values = (d_in, d_out, context_length, num_heads, kv_heads)
    d_in, d_out, context_length, num_heads, num_kv_heads = (
        check_size(name, value) for name, value in zip(names, values, strict=True)
    )
    if d_out % num_heads != 0:
        raise ValueError(
            f"d_out must be divisible by num_heads: got d_out={d_out}, num_heads={num_heads}"
        )
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            "num_heads must be divisible by num_kv_heads (each key/value head serves a "
            f"group of query heads): got num_heads={num_heads}, num_kv_heads={num_kv_heads}"
        )
    return d_in, d_out, context_length, num_heads, num_kv_heads


def check_memory(
    name: str, t: object, width: int, width_name: str, batch: int, like: Tensor
) -> Tensor:
    """Check cross-attention's `key` or `value`: `(batch, num_keys, width)`, like the module."""
    t = check_tensor(name, t, ndim=3, floating=True, like=like)
    if t.shape[0] != batch or t.shape[2] != width:
        raise ValueError(
            f"{name} must have shape (batch, num_keys, {width_name}) = ({batch}, "
            f"num_keys, {width}), got {tuple(t.shape)}"
        )
    return t


def check_documents(
    document_ids: object, batch: int, num_tokens: int, device: torch.device
) -> None:
    ids = check_tensor("document_ids", document_ids)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"document_ids must be integers, got dtype {ids.dtype}")
    if ids.shape != (batch, num_tokens):
        raise ValueError(
            f"document_ids must have shape (batch, num_tokens) = ({batch}, {num_tokens}), "
            f"got {tuple(ids.shape)}"
        )
    if ids.device != device:
        raise ValueError(f"document_ids must be on the input's device {device}, got {ids.device}")
    if readable(ids) and bool((ids < 0).any()):
        raise ValueError(f"document_ids must be >= 0, got {int(ids.min())}")


def readable(t: Tensor) -> bool:
    """Whether a tensor's values may steer Python: not while exporting, not on `meta`."""
    return not torch.compiler.is_exporting() and t.device.type != "meta"


def check_rows(
    batch: int,
    num_tokens: int,
    device: torch.device,
    key_padding_mask: object,
    document_ids: object,
    positions: object,
) -> None:
    """Raise an error naming the argument unless each is `(batch, num_tokens)`, as it must."""
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask, batch, num_tokens, device)
    if document_ids is not None:
        check_documents(document_ids, batch, num_tokens, device)
    if positions is not None:
        pos = check_tensor("positions", positions)
        if pos.is_floating_point() or pos.is_complex() or pos.dtype == torch.bool:
            raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
        if pos.shape != (batch, num_tokens) or pos.device != device:
            raise ValueError(
                f"positions must be integers of shape (batch, num_tokens) = "
                f"({batch}, {num_tokens}) on {device}, got {tuple(pos.shape)} on "
                f"{pos.device}"
            )
        if readable(pos) and pos.numel() and int(pos.min()) < 0:
            raise ValueError(
                f"positions must be >= 0 (padding is key_padding_mask's), got {int(pos.min())}"
            )


def padding_zeroed(
    x: Tensor,
    key_padding_mask: Tensor | None,
    document_ids: Tensor | None,
    positions: Tensor | None,
) -> Tensor:
    """`x` `(b, T, d_in)` with its padded tokens zeroed, once the rows' `key_padding_mask`,
    `document_ids` and `positions` are checked: not even a NaN there may reach a real output."""
    b, num_tokens, _ = x.shape
    check_rows(b, num_tokens, x.device, key_padding_mask, document_ids, positions)
    if key_padding_mask is None:
        return x
    return x.masked_fill(key_padding_mask[..., None], 0.0)  # (b, T, d_in)


def check_angles(
    angles: object,
    num_tokens: int,
    head_dim: int,
    rope: bool,
    batch_size: int,
    device: torch.device,
) -> None:
    """RoPE's `(cos, sin)`: two floating-point tensors of one shape on the input's `device`,
    `(num_tokens, head_dim)` (every row's positions the same) or
    `(batch_size or 1, 1, num_tokens, head_dim)` (each row's own), as
    [`RotaryTable.at`][attention.layer.positions.RotaryTable.at] makes them. A
    `(batch, num_tokens, head_dim)` pair (transformers' layout) would broadcast its rows
    against the heads: refused."""
    ok = type(angles) is tuple and len(angles) == 2 and rope
    cos: object = angles[0] if ok else None  # type: ignore[index]
    sin: object = angles[1] if ok else None  # type: ignore[index]
    if not (ok and isinstance(cos, Tensor) and isinstance(sin, Tensor)):
        raise ValueError(
            f"angles must be RoPE's (cos, sin) for {num_tokens} positions and "
            f"head_dim={head_dim}, in a module with rope=True (rope={rope}); got "
            f"{type(angles).__name__}"
        )
    shape = tuple(cos.shape)
    fits = shape == (num_tokens, head_dim) or (
        len(shape) == 4 and shape[0] in (1, batch_size) and shape[1:] == (1, num_tokens, head_dim)
    )
    if not fits or tuple(sin.shape) != shape:
        rows = "1" if batch_size == 1 else f"{batch_size} or 1"
        raise ValueError(
            f"angles must be (cos, sin) of shape ({num_tokens}, {head_dim}) or "
            f"({rows}, 1, {num_tokens}, {head_dim}); got cos {shape} and sin {tuple(sin.shape)}"
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if not t.is_floating_point():
            raise TypeError(f"angles must be floating-point (cos, sin), got {name} of {t.dtype}")
        if t.device != device:
            raise ValueError(
                f"angles must be on the input's device {device}, got {name} on {t.device}"
            )


def check_cache(
    layer: Specified,
    cache: object,
    batch_size: int,
    num_tokens: int,
    like: Tensor,
    widths: tuple[int, int, int] | None = None,
) -> None:
    """Raise an error naming `cache` unless it was made for `layer` and fits the chunk.

    `widths`: the heads, key width and value width the layer stores; default
    `(num_kv_heads, head_dim, head_dim)`.
    """
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache (from init_cache), got {type(cache).__name__}")
    if cache.spoiled is not None:
        raise ValueError(
            f"cache: {cache.spoiled}, so it holds part of that call; reset() it "
            "(or make a new one) before using it again"
        )
    rule = layer.rule
    if rule.bounds.prefix is None:
        raise ValueError(
            f"cache needs a mask that hides the future, at least after a prefix; this "
            f"module's mask {rule!r} does not certainly (causal=False, or a mask_mod without "
            "bounds: pass causal=True with it, or use causal() & mask): a later token would "
            "change what the cached ones attended to"
        )
    keys = cache.keys
    heads, d_k, d_v = widths or (layer.num_kv_heads, layer.head_dim, layer.head_dim)
    made = (keys.shape[1], keys.shape[3], cache.values.shape[3], keys.dtype, keys.device)
    if made != (heads, d_k, d_v, like.dtype, like.device):
        raise ValueError(
            f"cache was made for num_kv_heads={made[0]}, head_dim={made[1]}, "
            f"value_dim={made[2]}, {made[3]} on {made[4]}; this module stores "
            f"num_kv_heads={heads}, head_dim={d_k}, value_dim={d_v}, {like.dtype} on "
            f"{like.device}: use its init_cache"
        )
    if cache.ring and (cache.window, cache.sinks) != (layer.window, layer.sinks):
        raise ValueError(
            f"cache keeps window={cache.window}, sinks={cache.sinks}; this module "
            f"has window={layer.window}, sinks={layer.sinks}"
        )
    if batch_size != cache.batch_size:
        raise ValueError(
            f"cache was made for batch_size={cache.batch_size}, got a batch of {batch_size}"
        )
    limit = cache.max_tokens
    if limit is not None and cache.length + num_tokens > limit:
        raise ValueError(
            f"cache holds {cache.length} of max_tokens={limit} tokens: {num_tokens} more "
            "do not fit (reset it, or make a larger one)"
        )
    check_prefix(rule, cache, num_tokens)


def check_prefill(rule: Mask, q: Tokens) -> None:
    """The first call into a cache of a prefix-LM holds every row's positions `0 ... n - 1`."""
    prefix = rule.bounds.prefix
    assert prefix
    if (q.start == 0 and q.n >= prefix) or not readable(q.pos):
        return
    wanted = torch.arange(prefix, device=q.pos.device)
    held = (q.pos[:, :, None] == wanted).any(dim=1)  # (b, prefix): each row holds each?
    if not bool(held.all()):
        row = int((~held).any(dim=1).nonzero()[0, 0])
        missing = wanted[~held[row]].tolist()
        raise ValueError(
            f"mask {rule!r} lets its first {prefix} positions see each other: "
            f"the first call with a cache must hold that whole prefix in every "
            f"row; row {row} lacks positions {missing[:8]}"
        )


def check_prefix(rule: Mask, cache: KVCache, num_tokens: int) -> None:
    """A mask causal only after a prefix (a prefix-LM) takes a cache once the first call holds
    the whole prefix: every later query is then causal, so no cached output would change."""
    prefix = rule.bounds.prefix
    if prefix and cache.length == 0 and num_tokens < prefix:
        raise ValueError(
            f"mask {rule!r} lets its first {prefix} positions see each other: the first call "
            f"with a cache must hold that whole prefix, got {num_tokens} tokens (give the "
            "prompt in one call)"
        )
    if prefix and 0 < cache.length < prefix:
        raise ValueError(
            f"mask {rule!r}: the cache holds {cache.length} tokens, fewer than "
            f"its prefix of {prefix}; reset it and give the prompt in one "
            "call"
        )


Positions = Tensor | Tokens | None
"""`(T,)` or `(batch, T)` int positions (-1: no token), or `Tokens` (positions, documents)."""


def positions_line(
    name: str, value: Positions, n: int, default_start: int, batch: int, device: torch.device
) -> tuple[Tensor, Tensor | None]:
    """Positions `(n,)` or `(batch, n)` int64, and documents `(batch, n)` or None, from a
    tiled function's `value` ([`flash_attention`][attention.layer.tiled.flash_attention]'s
    `q_positions` or `k_positions`); None: `default_start .. default_start + n - 1`."""
    if value is None:
        return torch.arange(default_start, default_start + n, device=device), None
    if isinstance(value, Tokens):
        if value.n != n or value.batch not in (1, batch):
            raise ValueError(
                f"{name}: Tokens of {value.batch} rows and {value.n} tokens do not "
                f"fit {batch} rows of {n} tokens"
            )
        docs = None if value.docs is None else value.docs.expand(batch, n)
        return value.line, docs
    line = check_tensor(name, value, ndim=(1, 2))
    if line.is_floating_point() or line.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer positions, got dtype {line.dtype}")
    if line.shape[-1] != n or (line.ndim == 2 and line.shape[0] not in (1, batch)):
        want = f"({n},) or ({batch}, {n})"
        raise ValueError(f"{name} must have shape {want}, got {tuple(line.shape)}")
    if line.device != device:
        raise ValueError(f"{name} must be on {device}, got it on {line.device}")
    return line.long(), None


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Q `(b, h, T, d)`, K `(b, h_kv, S, d)`, V `(b, h_kv, S, d_v)`, `h` a multiple of `h_kv`:
    the tiled functions' tensors."""
    check_tensor("q", q, ndim=4, floating=True)
    check_tensor("k", k, ndim=4, like=q)
    check_tensor("v", v, ndim=4, like=q)
    b, h, _, d = q.shape
    if h < 1 or d < 1 or k.shape[1] < 1 or v.shape[-1] < 1:
        raise ValueError(
            f"q, k and v need at least one head and head_dim >= 1, got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[0] != b or k.shape[-1] != d:
        raise ValueError(
            f"k must be (batch, num_kv_heads, num_keys, head_dim) = ({b}, ., ., "
            f"{d}) for q {tuple(q.shape)}, got {tuple(k.shape)}"
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must be (batch, num_kv_heads, num_keys, d_v) = {tuple(k.shape[:3])}"
            f" + (d_v,), got {tuple(v.shape)}"
        )
    if h % k.shape[1]:
        raise ValueError(f"q's heads ({h}) must be a multiple of k's heads ({k.shape[1]})")
