r"""The planner: the least the fused kernel needs, derived from what the mask *is*.

`torch.nn.functional.scaled_dot_product_attention` (SDPA) never materialises the
$T \times T$ weights, but it takes `is_causal=True` *or* a mask, and a mask costs a tensor of
its size. [`plan`][attention.layer.fused.plan] reads only the mask's
[`Bounds`][attention.layer.masks.Bounds] (what is certainly hidden, what is certainly seen) and
the shape of the call, never a mask's name or a layer's flags:

| when | the kernel gets |
| --- | --- |
| a score modifier without an additive form | nothing fused: the explicit path |
| every pair certainly visible, one segment | no mask |
| keys `0 .. end - 1` in order, exactly causal on them, from position 0 | `is_causal` |
| one query, and it certainly sees every key it is given (decode, a ring's window) | no mask |
| causal with a bounded reach $r$, keys in order from 0, $T > r$ | blocks of $B$ = `max(r, MIN_BLOCK)` queries over $\le B + r$ keys (and the anchors), each with its own mask |
| anything else | the mask evaluated at these positions (`(T, S)`, or per row) |
| on CUDA (`flex`), instead of the explicit path, the blocks or a mask of more than one query | FlexAttention: the mask and modifiers as functions, hidden tiles skipped ([`attention.layer.flex`][attention.layer.flex]) |

Without a cache, padding never reaches the table: a padded batch's rows are first
**compacted** (each row's real tokens moved to its front, in order, so positions equal
slots), attended as right padding, and moved back; a mask that hides the future then never
reaches a padded key. After a cache, each row's own positions are compared (a mask). One query (a decode step)
keeps SDPA with its mask's one row, `(b, 1, 1, S)`, on CUDA too: FlexAttention's tiles save
nothing on one row, and the step stays one a CUDA graph can hold
([`attention.model.decode`][attention.model.decode]).
Additive score modifiers (ALiBi) reach the kernel as a float mask. A query that sees nothing
gets a zero context vector on every path.
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.layer import flex as flex_attention
from attention.layer.masks import Mask, evaluate, indices
from attention.layer.score_mods import ScoreMod
from attention.layer.sinks import with_sink

__all__ = [
    "Plan",
    "compact",
    "cross_attention",
    "fused_attention",
    "plan",
    "sdpa",
    "sliding_window_attention",
]


class Plan(NamedTuple):
    """What reaches the kernel: "explicit", "none", "is_causal", "blocked", "mask" or "flex"."""

    kind: str
    why: str


class _Options(NamedTuple):
    """What every kernel call of one attention shares."""

    dropout_p: float
    scale: float | None
    sink_logits: Tensor | None
    score_mods: tuple[ScoreMod, ...]


MIN_BLOCK = 64
"""The fewest queries a block of the blocked path holds: for a smaller window, one kernel
call per few queries costs more in calls than the keys it skips (blocks of 1 were slower than
no window at all)."""

_EXPLICIT = Plan("explicit", "a score modifier without an additive form")
_EVERYTHING = Plan("none", "every pair is certainly visible")
_DECODE = Plan("none", "one query, keys 0 .. end - 1, exactly causal on them")
_CAUSAL = Plan("is_causal", "queries from 0, keys 0 .. T - 1, exactly causal on them")
_RING = Plan("none", "one query that certainly sees every key the ring keeps")
_BLOCKED = Plan("blocked", f"causal, reach r < T, from 0: blocks of max(r, {MIN_BLOCK}) queries")
_MASK = Plan("mask", "anything else: the mask evaluated at these positions")
_FLEX = Plan("flex", "on CUDA, whatever would need the explicit path, blocks or a mask")
PLANS = (_EXPLICIT, _EVERYTHING, _DECODE, _CAUSAL, _RING, _BLOCKED, _MASK, _FLEX)
_FLEX_TAKES = ("explicit", "blocked", "mask")  # what FlexAttention takes over, where it may
"""Every decision the planner can make, in the order it tries them."""


def plan(
    rule: Mask,
    num_tokens: int,
    num_keys: int,
    *,
    start: int = 0,
    in_order: bool = True,
    per_row: bool = False,
    score_mods: Sequence[ScoreMod] = (),
    sink: bool = False,
    flex: bool = False,
) -> Plan:
    """The kernel call for `num_tokens` queries at `start ...` over `num_keys` keys.

    Args:
        rule: the layer's mask; only its bounds are read.
        num_tokens: $T$, the queries.
        num_keys: $S$, the keys.
        start: the first query's position.
        in_order: the keys are positions `0 .. S - 1` (no ring buffer).
        per_row: documents or padding are present (a mask per row).
        score_mods: the layer's score modifiers.
        sink: a learned sink logit (one more key, given a float mask).
        flex: FlexAttention may take the call (CUDA, no dropout): it takes whatever SDPA
            would need a mask, blocks or the explicit path for, but one query's mask.

    Examples:
        >>> from attention.layer.masks import causal, sinks, window
        >>> plan(causal(), 1024, 1024).kind
        'is_causal'
        >>> plan(causal() & (window(256) | sinks(4)), 1024, 1024).kind
        'blocked'
        >>> plan(window(256), 1, 256, start=5000, in_order=False).kind  # decode over a ring
        'none'
        >>> plan(causal() & window(256), 1024, 1024, flex=True).kind  # on CUDA
        'flex'
    """
    chosen = _sdpa_plan(rule, num_tokens, num_keys, start, in_order, per_row, score_mods, sink)
    return _FLEX if flex and _flex_takes(chosen.kind, num_tokens, score_mods) else chosen


def _flex_takes(kind: str, num_tokens: int, score_mods: Sequence[ScoreMod]) -> bool:
    """Whether FlexAttention takes a call SDPA would make as `kind`: the explicit path, blocks
    or a mask, but not one query whose modifiers SDPA's mask can carry (a decode step)."""
    one_row = num_tokens == 1 and all(mod.bias is not None for mod in score_mods)
    return kind in _FLEX_TAKES and not one_row


def _sdpa_plan(
    rule: Mask,
    num_tokens: int,
    num_keys: int,
    start: int,
    in_order: bool,
    per_row: bool,
    score_mods: Sequence[ScoreMod],
    sink: bool,
) -> Plan:
    """The plan on SDPA alone (the table above, without FlexAttention)."""
    bounds, end = rule.bounds, start + num_tokens
    if score_mods and any(mod.bias is None for mod in score_mods):
        return _EXPLICIT
    plain = not (per_row or score_mods or sink)
    if plain and bounds.everything:
        return _EVERYTHING
    exactly_causal = bounds.causal and bounds.near >= end  # on positions 0 .. end - 1
    if plain and in_order and num_keys == end and exactly_causal:
        if num_tokens == 1:  # the last query sees every key
            return _DECODE
        if start == 0:
            return _CAUSAL
    if plain and not in_order and num_tokens == 1 and bounds.sees_kept():
        return _RING
    reach = bounds.reach  # a bounded reach r < T, queries from 0: blocks of r
    if in_order and start == 0 and num_keys == end and bounds.causal and reach:
        return _BLOCKED if num_tokens > reach else _MASK
    return _MASK


def fused_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    *,
    start: int = 0,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    q_seg: Tensor | None = None,
    k_seg: Tensor | None = None,
    padded: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    sink_logits: Tensor | None = None,
    score_mods: Sequence[ScoreMod] = (),
) -> Tensor:
    r"""Attention on the fused kernel with the least mask the case needs (the table above).

    Inner function: the module checked its inputs; nothing is checked here, and no value is
    read on the host.

    Args:
        queries: `(b, h, T, d_h)`.
        keys: `(b, h_kv, S, d_h)`, `h` a multiple of `h_kv`.
        values: `(b, h_kv, S, d_v)`.
        rule: the layer's mask.
        start: the first query's position, when every row's queries are at
            `start ... start + T - 1`.
        q_pos: or `(b, T)`, each row's own positions.
        k_pos: `(S,)` or `(b, S)` the keys' positions (below 0: empty); None for `0 .. S - 1`.
        q_seg: `(b, T)` the queries' segments (document id, -1 for padding), or None.
        k_seg: `(b, S)` the keys' segments, given with `q_seg`.
        padded: `(b, T)` True where a token is padding, when the keys are the queries' own
            tokens (no cache): the rows are compacted first. `q_seg` then holds documents
            only (or is None).
        dropout_p: dropout on the weights.
        scale: what $q \cdot k$ is multiplied by; None for $1 / \sqrt{d_h}$.
        sink_logits: `(h,)` a learned logit per head for "attend to nothing", or None.
        score_mods: score modifiers: additive ones (a float mask), or any where FlexAttention
            takes the call (the caller runs the explicit path otherwise).

    Returns:
        `(b, h, T, d_v)`; zero where a query sees nothing (padding, say).
    """
    if padded is not None:
        options = _Options(dropout_p, scale, sink_logits, tuple(score_mods))
        return _compacted(queries, keys, values, rule, padded, q_seg, options)
    num_tokens, num_keys = queries.shape[-2], keys.shape[-2]
    flex = queries.device.type in flex_attention.DEVICES and flex_attention.usable(
        queries.device, dropout_p
    )  # the device test first: no call on the CPU's decode step
    choice = "mask"
    if q_pos is None and (k_pos is None or k_pos.ndim == 1):  # one set of positions: plan()
        choice = _sdpa_plan(rule, num_tokens, num_keys, start, k_pos is None, q_seg is not None,
                            score_mods, sink_logits is not None).kind  # fmt: skip
    if flex and _flex_takes(choice, num_tokens, score_mods):
        choice = "flex"
    if choice == "flex":
        return flex_attention.attend(queries, keys, values, rule, start=start, q_pos=q_pos,
                                     k_pos=k_pos, q_seg=q_seg, k_seg=k_seg, scale=scale,
                                     sink_logits=sink_logits, score_mods=score_mods)  # fmt: skip
    if choice in ("none", "is_causal"):  # the kernel's own call, no mask: a decode step's
        return F.scaled_dot_product_attention(
            queries, keys, values, dropout_p=dropout_p, scale=scale,
            is_causal=choice == "is_causal", enable_gqa=queries.shape[1] != keys.shape[1],
        )  # fmt: skip
    if choice == "blocked":
        return sliding_window_attention(queries, keys, values, rule, seg=q_seg,
                                        dropout_p=dropout_p, scale=scale, sink_logits=sink_logits,
                                        score_mods=score_mods)  # fmt: skip
    device = queries.device
    q_pos = torch.arange(start, start + num_tokens, device=device) if q_pos is None else q_pos
    k_pos = torch.arange(num_keys, device=device) if k_pos is None else k_pos
    return _masked(queries, keys, values, rule, q_pos, k_pos, q_seg, k_seg,
                   dropout_p=dropout_p, scale=scale, sink_logits=sink_logits,
                   score_mods=score_mods)  # fmt: skip


def _compacted(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    padded: Tensor,
    documents: Tensor | None,
    options: _Options,
) -> Tensor:
    """A padded batch: each row's real tokens moved to its front, attended, moved back.

    After the move a row's real tokens sit at slots `0 .. n - 1`, their positions, so the
    planner sees one set of positions from 0. A mask that hides the future never lets a real
    query reach the padding behind it; any other gets the padding as a segment.
    """
    padded_rows = padded[:, None, :, None]  # (b, 1, T, 1)
    if rule.bounds.everything and documents is None and not options.score_mods:
        seen = ~padded[:, None, None, :]  # (b, 1, 1, S): positions do not matter
        empty = ~seen.any(-1, keepdim=True)
        out = sdpa(queries, keys, values, seen | empty, dropout_p=options.dropout_p,
                   scale=options.scale, sink_logits=options.sink_logits)  # fmt: skip
        return out.masked_fill(empty | padded_rows, 0.0)
    order, inverse = compact(padded)  # (b, T) each
    queries, keys, values = (gather_tokens(t, order) for t in (queries, keys, values))
    seg = None
    if documents is not None:
        seg = documents.gather(1, order).masked_fill(padded.gather(1, order), -1)
    elif not rule.bounds.causal:
        seg = padded.gather(1, order).long().neg()  # 0 real, -1 padding (at each row's end)
    out = fused_attention(queries, keys, values, rule, q_seg=seg, k_seg=seg, **options._asdict())
    return gather_tokens(out, inverse).masked_fill(padded_rows, 0.0)


def _masked(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    q_pos: Tensor,
    k_pos: Tensor,
    q_seg: Tensor | None,
    k_seg: Tensor | None,
    *,
    dropout_p: float,
    scale: float | None,
    sink_logits: Tensor | None,
    score_mods: Sequence[ScoreMod],
) -> Tensor:
    """The general case: the mask (and the additive modifiers) at every pair, then SDPA."""
    seen = visible(rule, q_pos, k_pos, q_seg, k_seg, num_heads=queries.shape[1],
                   batch=queries.shape[0])  # fmt: skip
    if seen.shape[:2] == (1, 1):  # one mask for every row and head: (T, S)
        seen = seen[0, 0]
    empty = ~seen.any(-1, keepdim=True)  # a query that sees nothing: any row, then 0
    mask: Tensor = seen | empty
    if score_mods:
        heads = (queries.shape[0], queries.shape[1])
        mask = bias_mask(mask, score_mods, q_pos, k_pos, heads, queries.dtype)
    context_vec = sdpa(
        queries, keys, values, mask, dropout_p=dropout_p, scale=scale, sink_logits=sink_logits
    )
    return context_vec.masked_fill(empty, 0.0)


def visible(
    rule: Mask,
    q_pos: Tensor,
    k_pos: Tensor,
    q_seg: Tensor | None = None,
    k_seg: Tensor | None = None,
    *,
    num_heads: int = 1,
    batch: int = 1,
) -> Tensor:
    """The mask at every pair and the segments: `(b or 1, h or 1, T, S)`, True = may attend.

    Segments (document ids, -1 for padding) hide other documents' keys and padding.

    Examples:
        >>> from attention.layer.masks import causal
        >>> visible(causal(), torch.arange(3, 5), torch.arange(5))[0, 0].int()  # a chunk
        tensor([[1, 1, 1, 1, 0],
                [1, 1, 1, 1, 1]], dtype=torch.int32)
    """
    seen = evaluate(rule, q_pos, k_pos, num_heads=num_heads, batch=batch)  # (b | 1, h | 1, T, S)
    if q_seg is None or k_seg is None:
        return seen
    same = (q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg >= 0)[:, None, :]  # (b, T, S)
    return seen & same[:, None]


def bias_mask(
    seen: Tensor,
    score_mods: Sequence[ScoreMod],
    q_pos: Tensor,
    k_pos: Tensor,
    heads: tuple[int, int],
    dtype: torch.dtype,
) -> Tensor:
    r"""A float mask: the additive modifiers' $\sum \beta$ where `seen`, $-\infty$ elsewhere.

    `heads` is `(batch, num_heads)`, the ranges of `b` and `h`.
    """
    b, h, q, kv = indices(q_pos, k_pos, batch=heads[0], num_heads=heads[1])
    total = torch.zeros((), dtype=dtype, device=seen.device)
    for mod in score_mods:
        assert mod.bias is not None  # the planner sends the others to the explicit path
        total = total + mod.bias(b, h, q, kv).to(dtype)
    return torch.where(seen, total, float("-inf")).to(dtype)


def cross_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    key_segments: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Queries of one sequence over the keys of another: only the keys' padding is hidden.

    Without padding the kernel gets no mask; with it, one row per sequence, `(b, 1, 1, S)`.
    A sequence whose keys are all padding gets zero context vectors.

    Args:
        queries: `(b, h, T, d_h)`.
        keys: `(b, h_kv, S, d_h)`.
        values: `(b, h_kv, S, d_v)`.
        key_segments: `(b, S)`, -1 for padding, or None.
        dropout_p: dropout on the weights.

    Returns:
        `(b, h, T, d_v)`.
    """
    if key_segments is None:
        return sdpa(queries, keys, values, dropout_p=dropout_p, scale=scale)
    mask = (key_segments >= 0)[:, None, None, :]  # (b, 1, 1, S)
    empty = ~mask.any(-1, keepdim=True)  # (b, 1, 1, 1): no real key: any row, then 0
    context_vec = sdpa(queries, keys, values, mask | empty, dropout_p=dropout_p, scale=scale)
    return context_vec.masked_fill(empty, 0.0)


def compact(padded: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's real tokens first, in order, then its padding: the gather index and its inverse.

    Args:
        padded: `(b, T)` bool, True = padding.

    Returns:
        `(order, inverse)`, `(b, T)` each: `t.gather(order)` compacts, `.gather(inverse)`
        puts back.

    Examples:
        >>> order, inverse = compact(torch.tensor([[True, False, True, False]]))
        >>> order
        tensor([[1, 3, 0, 2]])
        >>> order.gather(1, inverse)
        tensor([[0, 1, 2, 3]])
    """
    order = torch.sort(padded.to(torch.uint8), dim=1, stable=True).indices  # (b, T)
    return order, torch.argsort(order, dim=1)


def gather_tokens(t: Tensor, index: Tensor) -> Tensor:
    """Tokens of `(b, h, T, d)` taken per row by `index` `(b, T)`."""
    return t.gather(2, index[:, None, :, None].expand_as(t))


def sdpa(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    sink_logits: Tensor | None = None,
) -> Tensor:
    r"""The one call of the kernel: `mask` bool (True = may attend, SDPA's convention) or float.

    With `sink_logits` $z_h$ (gpt-oss), each head's softmax gets one more term, $e^{z_h}$,
    for a key that is always visible and whose value is zero, so a head can give less than
    all of its weight to the tokens ([`attention.layer.sinks`][attention.layer.sinks]). It enters
    the kernel as a zero key and value and a float mask whose sink column holds $z_h$.
    """
    gqa = queries.shape[1] != keys.shape[1]
    if sink_logits is not None:  # the planner hands a sink its mask, never is_causal
        queries, keys, values, mask = with_sink(queries, keys, values, mask, sink_logits)
    return F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale,
        is_causal=is_causal, enable_gqa=gqa,
    )  # fmt: skip


def sliding_window_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    *,
    seg: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    sink_logits: Tensor | None = None,
    score_mods: Sequence[ScoreMod] = (),
) -> Tensor:
    r"""Attention under a mask of bounded reach $r$, in $O(T r)$, not $O(T^2)$.

    The mask's bounds say a query $i$ sees no key $j$ with $i - j \ge r$ except the
    anchors $j < a$ (a window's $r = w$, its sinks' $a = k$). The queries are cut into blocks
    of $B$ = `max(r, MIN_BLOCK)`; block $n$ (queries $nB \dots nB + B - 1$) can only see keys
    $nB - r + 1 \dots nB + B - 1$ and the anchors, so each block meets at most $B + r + a$
    keys under its own mask, evaluated from the mask's function. Nothing $T \times T$ is built, no
    copy of the keys is made (without anchors), and the memory beyond the output is one
    block's.

    Args:
        queries: `(b, h, T, d_h)`, at positions `0 ... T - 1`.
        keys: `(b, h_kv, T, d_h)`, `h` a multiple of `h_kv`.
        values: `(b, h_kv, T, d_v)`.
        rule: a mask whose bounds are causal with a reach.
        seg: `(b, T)` the tokens' segments (document id, -1 for padding), or None.
        dropout_p: dropout on the weights (the kernel's own).
        sink_logits: `(h,)` learned sink logits ([`sdpa`][attention.layer.fused.sdpa]), or None.
        score_mods: additive score modifiers.

    Returns:
        The context vectors, `(b, h, T, d_v)`.

    Examples:
        >>> from attention.derivation.core import explicit_attention
        >>> from attention.layer.masks import window
        >>> q, k, v = torch.randn(3, 1, 2, 10, 4).unbind(0)  # (b, h, T, d_h) each
        >>> fused = sliding_window_attention(q, k, v, window(3))
        >>> pos = torch.arange(10)
        >>> explicit, _ = explicit_attention(q, k, v, mask=window(3).grid(pos, pos))
        >>> torch.allclose(fused, explicit, atol=1e-6)
        True
    """
    reach, anchor = rule.bounds.reach, rule.bounds.anchor
    assert reach is not None and rule.bounds.causal
    num_tokens = queries.shape[-2]
    out = queries.new_empty(*queries.shape[:-1], values.shape[-1])  # (b, h, T, d_v)
    device = queries.device
    size = max(reach, MIN_BLOCK)  # a tiny window: fewer, larger calls
    for lo in range(0, num_tokens, size):
        hi = min(lo + size, num_tokens)  # queries lo .. hi - 1
        first = max(lo - reach + 1, 0)  # the first key any of them sees (anchors aside)
        keep = torch.arange(first, hi, device=device)  # the keys' positions
        before = min(anchor, first)  # anchors 0 .. before - 1 lie before the slice
        if before:
            keep = torch.cat((torch.arange(before, device=device), keep))
        k, v = _slice(keys, first, hi, before), _slice(values, first, hi, before)  # (b, h_kv, S, d)
        q_pos = torch.arange(lo, hi, device=device)
        q_seg = k_seg = None
        if seg is not None:
            q_seg, k_seg = seg[:, lo:hi], seg.index_select(1, keep)
        out[:, :, lo:hi] = _masked(queries[:, :, lo:hi], k, v, rule, q_pos, keep, q_seg, k_seg,
                                   dropout_p=dropout_p, scale=scale, sink_logits=sink_logits,
                                   score_mods=score_mods)  # fmt: skip
    return out


def _slice(t: Tensor, first: int, hi: int, before: int) -> Tensor:
    """Tokens `first .. hi - 1` of `(b, h, T, d)`, after tokens `0 .. before - 1` if any."""
    if not before:
        return t[:, :, first:hi]  # a view
    return torch.cat((t[:, :, :before], t[:, :, first:hi]), dim=2)
