r"""The planner: the least the fused kernel needs, derived from what the mask *is*; and the
one function that runs what it planned.

`torch.nn.functional.scaled_dot_product_attention` (SDPA) never materialises the
$T \times T$ weights, but it takes `is_causal=True` *or* a mask, and a mask costs a tensor of
its size. [`plan`][attention.layer.fused.plan] reads only the mask's
[`Bounds`][attention.layer.masks.Bounds] (what is certainly hidden, what is certainly seen) and
what the host knows of the call's positions, never a mask's name, a layer's flags or a
tensor's values:

| when | the kernel gets |
| --- | --- |
| the weights are asked for, or a score modifier without an additive form | nothing fused: the explicit path |
| every pair certainly visible, one segment | no mask |
| keys `0 .. end - 1` in order, exactly causal on them, from position 0 | `is_causal` |
| one query, and it certainly sees every key it is given (decode, a ring's window) | no mask |
| causal with a bounded reach $r$, keys in order from 0, $T > r$ | blocks of $B$ = `max(r, MIN_BLOCK)` queries over $\le B + r$ keys (and the anchors), each with its own mask |
| anything else (positions that differ by row: padding after a cache, offsets, documents) | the mask evaluated at these positions |
| on CUDA (`flex`), instead of the explicit path, the blocks or a mask of more than one query | FlexAttention: the mask and modifiers as functions, hidden tiles skipped ([`attention.layer.flex`][attention.layer.flex]) |

Without a cache, a padded batch whose positions count each row's real tokens is first
**compacted** (each row's real tokens moved to its front, in order, so positions equal
slots), planned again as right padding, and moved back. One query (a decode step) keeps
SDPA with its mask's one row, `(b, 1, 1, S)`, on CUDA too: FlexAttention's tiles save
nothing on one row, and the step stays one a CUDA graph can hold
([`attention.model.decode`][attention.model.decode]). Additive score modifiers (ALiBi) reach the
kernel as a float mask. A query that sees nothing gets a zero context vector on every path.

[`plan_call`][attention.layer.fused.plan_call] turns a call's
[`Tokens`][attention.layer.tokens.Tokens] into those facts; [`run`][attention.layer.fused.run]
executes the plan it returns, with no decision of its own: the plan printed is the plan run.
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.derivation.core import explicit_attention
from attention.layer import flex as flex_attention
from attention.layer.masks import Mask, indices
from attention.layer.score_mods import ScoreMod
from attention.layer.sinks import with_sink
from attention.layer.tokens import Tokens, visible

__all__ = [
    "PLANS",
    "Options",
    "Plan",
    "compact",
    "cross_attention",
    "plan",
    "plan_call",
    "run",
    "sdpa",
    "sliding_window_attention",
]


@dataclass(frozen=True)
class Plan:
    """What reaches the kernel: "explicit", "none", "is_causal", "blocked", "mask" or "flex",
    and why; `compact`: the padded rows are compacted first (the plan is then the compacted
    call's)."""

    kind: str
    why: str
    compact: bool = False

    def compacted(self) -> Plan:
        return Plan(self.kind, f"{self.why} (rows compacted first)", compact=True)


@dataclass(frozen=True)
class Options:
    """What every kernel call of one attention shares."""

    num_heads: int
    dropout_p: float = 0.0
    scale: float | None = None
    sink_logits: Tensor | None = None
    score_mods: tuple[ScoreMod, ...] = ()
    dropout: nn.Module | None = None  # the explicit path's


MIN_BLOCK = 64
"""The fewest queries a block of the blocked path holds: for a smaller window, one kernel
call per few queries costs more in calls than the keys it skips (blocks of 1 were slower than
no window at all)."""

_WEIGHTS = Plan("explicit", "the weights were asked for")
_EXPLICIT = Plan("explicit", "a score modifier without an additive form")
_EVERYTHING = Plan("none", "every pair is certainly visible")
_DECODE = Plan("none", "one query, keys 0 .. end - 1, exactly causal on them")
_CAUSAL = Plan("is_causal", "queries from 0, keys 0 .. T - 1, exactly causal on them")
_RING = Plan("none", "one query that certainly sees every key the ring keeps")
_BLOCKED = Plan("blocked", f"causal, reach r < T, from 0: blocks of max(r, {MIN_BLOCK}) queries")
_MASK = Plan("mask", "anything else: the mask evaluated at these positions")
_FLEX = Plan("flex", "on CUDA, whatever would need the explicit path, blocks or a mask")
PLANS = (_EXPLICIT, _EVERYTHING, _DECODE, _CAUSAL, _RING, _BLOCKED, _MASK, _FLEX)
"""Every decision the planner can make, in the order it tries them."""
_FLEX_TAKES = ("explicit", "blocked", "mask")  # what FlexAttention takes over, where it may


def plan(
    rule: Mask,
    num_tokens: int,
    num_keys: int,
    *,
    start: int | None = 0,
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
        start: the first query's position, the same in every row; None where rows differ.
        in_order: the keys are positions `0 .. S - 1` in slot order; False: a ring's window.
        per_row: documents or padding set rows apart (a mask per row).
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
    start: int | None,
    in_order: bool,
    per_row: bool,
    score_mods: Sequence[ScoreMod],
    sink: bool,
) -> Plan:
    """The plan on SDPA alone (the table above, without FlexAttention)."""
    if score_mods and any(mod.bias is None for mod in score_mods):
        return _EXPLICIT
    bounds = rule.bounds
    if start is None:  # positions that differ by row (padding, offsets): only the mask knows
        return _MASK
    plain = not (per_row or score_mods or sink)
    if plain and bounds.everything:
        return _EVERYTHING
    end = start + num_tokens
    causal = bounds.causal_from == 0
    exactly_causal = causal and bounds.near >= end  # on positions 0 .. end - 1
    if plain and in_order and num_keys == end and exactly_causal:
        if num_tokens == 1:  # the last query sees every key
            return _DECODE
        if start == 0:
            return _CAUSAL
    if plain and not in_order and num_tokens == 1 and bounds.sees_kept():
        return _RING
    reach = bounds.reach  # a bounded reach r < T, queries from 0: blocks of r
    if in_order and start == 0 and num_keys == end and causal and reach:
        return _BLOCKED if num_tokens > reach else _MASK
    return _MASK


def plan_call(
    rule: Mask,
    q: Tokens,
    k: Tokens,
    options: Options,
    *,
    own: bool,
    need_weights: bool = False,
    flex: bool = False,
) -> Plan:
    """The plan for one call: the facts `plan` reads, taken from the call's `Tokens`.

    Args:
        rule: the layer's mask.
        q: the queries' positions.
        k: the keys' positions.
        options: the call's heads, dropout, sink and score modifiers.
        own: the keys are the queries' own tokens (no cache before them).
        need_weights: the weights were asked for: the explicit path.
        flex: FlexAttention may take the call.
    """
    if need_weights:
        return _WEIGHTS
    bounds = rule.bounds
    sees_all = bounds.everything and q.docs is None and not options.score_mods  # no mask at all
    if own and q.start is None and q.counted and not sees_all:
        q = k = _compacted_tokens(rule, q)  # padding, no cache: compact the rows first
        compacted = True
    else:
        compacted = False
    keys = k
    start = q.start  # keys whose positions only the device knows: a mask per row
    if start is not None and keys.start is None and not (keys.ring and q.n == 1):
        start = None
    mods = options.score_mods  # plan(), its two steps: SDPA's plan, then FlexAttention's
    per_row = q.docs is not None or keys.docs is not None  # documents: a mask per row
    sink = options.sink_logits is not None
    chosen = _sdpa_plan(rule, q.n, keys.n, start, keys.start == 0, per_row, mods, sink)
    if flex and _flex_takes(chosen.kind, q.n, mods):
        chosen = _FLEX
    return chosen.compacted() if compacted else chosen


def _compacted_tokens(rule: Mask, q: Tokens) -> Tokens:
    """The queries after compaction: positions from 0 in slot order. The padding behind each
    row's real tokens is in their future: a causal mask never shows it; any other mask gets
    it as positions -1 (a mask per row)."""
    if rule.bounds.causal and q.docs is None:
        return Tokens(q.batch, q.n, q.device, start=0)
    order, _ = compact(q.padded)
    pos = q.pos.gather(1, order)
    docs = None if q.docs is None else q.docs.gather(1, order)
    return Tokens(q.batch, q.n, q.device, given=pos, docs=docs)


def run(
    chosen: Plan,
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    q: Tokens,
    k: Tokens,
    options: Options,
) -> tuple[Tensor, Tensor | None]:
    r"""Run `chosen` (from [`plan_call`][attention.layer.fused.plan_call]) on these tensors.

    Args:
        chosen: the plan.
        queries: `(b, h, T, d_h)`.
        keys: `(b, h_kv, S, d_h)`, `h` a multiple of `h_kv`.
        values: `(b, h_kv, S, d_v)`.
        rule: the layer's mask.
        q: the queries' positions.
        k: the keys' positions.
        options: heads, dropout, scale, sink and score modifiers.

    Returns:
        `(context_vec, attn_weights)`: `(b, h, T, d_v)`, zero where a query sees nothing; the
        weights `(b, h, T, S)` on the explicit path, else None.
    """
    if chosen.compact:
        return _run_compacted(chosen, queries, keys, values, rule, q, options), None
    kind = chosen.kind
    if kind == "explicit":
        return _explicit(queries, keys, values, rule, q, k, options)
    if kind in ("none", "is_causal"):  # the kernel's own call, no mask: a decode step's
        out = F.scaled_dot_product_attention(
            queries,
            keys,
            values,
            dropout_p=options.dropout_p,
            scale=options.scale,
            is_causal=kind == "is_causal",
            enable_gqa=queries.shape[1] != keys.shape[1],
        )
        return out, None
    if kind == "blocked":
        out = sliding_window_attention(queries, keys, values, rule, docs=q.docs, options=options)
        return out, None
    if kind == "flex":
        out = flex_attention.attend(
            queries,
            keys,
            values,
            rule,
            q,
            k,
            scale=options.scale,
            sink_logits=options.sink_logits,
            score_mods=options.score_mods,
        )
        return out, None
    return _masked(queries, keys, values, rule, q, k, options), None


def _run_compacted(
    chosen: Plan,
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    q: Tokens,
    options: Options,
) -> Tensor:
    """A padded batch: each row's real tokens moved to its front, attended, moved back."""
    padded = q.padded  # (b, T)
    order, inverse = compact(padded)  # (b, T) each
    queries, keys, values = (gather_tokens(t, order) for t in (queries, keys, values))
    tokens = _compacted_tokens(rule, q)
    inner = Plan(chosen.kind, chosen.why)
    out, _ = run(inner, queries, keys, values, rule, tokens, tokens, options)
    return gather_tokens(out, inverse).masked_fill(padded[:, None, :, None], 0.0)


def _explicit(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    q: Tokens,
    k: Tokens,
    options: Options,
) -> tuple[Tensor, Tensor]:
    """The explicit path: each query head reads its key/value head, repeated per group."""
    group = queries.shape[1] // keys.shape[1]  # query head i reads kv head i // group
    keys = keys.repeat_interleave(group, dim=1)  # (b, h, S, d_h)
    values = values.repeat_interleave(group, dim=1)  # (b, h, S, d_h)
    seen = visible(rule, q, k, num_heads=options.num_heads)
    sink = None if options.sink_logits is None else options.sink_logits[:, None, None]
    score_mod = None
    if options.score_mods:
        score_mod = bind(options.score_mods, q.line, k.line, queries.shape[0], options.num_heads)
    return explicit_attention(
        queries,
        keys,
        values,
        seen,
        dropout=options.dropout,
        sink_logits=sink,
        score_mod=score_mod,
        scale=options.scale,
    )


def bind(
    score_mods: Sequence[ScoreMod], q_pos: Tensor, k_pos: Tensor, batch: int, num_heads: int
) -> Callable[[Tensor], Tensor]:
    """The score modifiers as one function of the scores `(b, h, T, S)`, positions bound."""
    b, h, q, kv = indices(q_pos, k_pos, batch=batch, num_heads=num_heads)

    def modify(scores: Tensor) -> Tensor:
        for mod in score_mods:  # f_n(... f_1(s) ...), in list order
            scores = mod(scores, b, h, q, kv)
        return scores

    return modify


def _masked(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    q: Tokens,
    k: Tokens,
    options: Options,
) -> Tensor:
    """The general case: the mask (and the additive modifiers) at every pair, then SDPA."""
    everything = rule.bounds.everything and q.docs is None and k.docs is None
    if everything and not options.score_mods:  # every real key: (b, 1, 1, S), padding aside
        seen = (k.pos >= 0)[:, None, None, :]
    else:
        seen = visible(rule, q, k, num_heads=queries.shape[1])
    if seen.shape[:2] == (1, 1):  # one mask for every row and head: (T, S)
        seen = seen[0, 0]
    empty = ~seen.any(-1, keepdim=True)  # a query that sees nothing: any row, then 0
    mask: Tensor = seen | empty
    if everything and q.given is not None:  # a padded query sees nothing either
        empty = empty | (q.pos < 0)[:, None, :, None]
    if options.score_mods:
        heads = (queries.shape[0], queries.shape[1])
        mask = bias_mask(mask, options.score_mods, q.line, k.line, heads, queries.dtype)
    context_vec = sdpa(
        queries,
        keys,
        values,
        mask,
        dropout_p=options.dropout_p,
        scale=options.scale,
        sink_logits=options.sink_logits,
    )
    return context_vec.masked_fill(empty, 0.0)


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
    key_positions: Tensor | None = None,
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
        key_positions: `(b, S)`, -1 for padding, or None.
        dropout_p: dropout on the weights.

    Returns:
        `(b, h, T, d_v)`.
    """
    if key_positions is None:
        return sdpa(queries, keys, values, dropout_p=dropout_p, scale=scale)
    mask = (key_positions >= 0)[:, None, None, :]  # (b, 1, 1, S)
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
        queries,
        keys,
        values,
        attn_mask=mask,
        dropout_p=dropout_p,
        scale=scale,
        is_causal=is_causal,
        enable_gqa=gqa,
    )


def sliding_window_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    *,
    docs: Tensor | None = None,
    options: Options | None = None,
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
        docs: `(b, T)` the tokens' document ids, or None.
        options: dropout, scale, sink logits and additive score modifiers (default none).

    Returns:
        The context vectors, `(b, h, T, d_v)`.

    Raises:
        ValueError: `rule` is not certainly causal with a bounded reach.

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
    if not (reach and rule.bounds.causal):
        raise ValueError(
            f"sliding_window_attention needs a rule that is causal with a bounded "
            f"reach (a window); rule={rule!r} has causal={rule.bounds.causal}, "
            f"reach={reach}"
        )
    options = Options(queries.shape[1]) if options is None else options
    b, num_tokens = queries.shape[0], queries.shape[-2]
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
        q_tok = Tokens(b, hi - lo, device, start=lo, docs=None if docs is None else docs[:, lo:hi])
        k_tok = Tokens(
            b,
            keep.shape[0],
            device,
            given=keep,
            docs=None if docs is None else docs.index_select(1, keep),
        )
        out[:, :, lo:hi] = _masked(queries[:, :, lo:hi], k, v, rule, q_tok, k_tok, options)
    return out


def _slice(t: Tensor, first: int, hi: int, before: int) -> Tensor:
    """Tokens `first .. hi - 1` of `(b, h, T, d)`, after tokens `0 .. before - 1` if any."""
    if not before:
        return t[:, :, first:hi]  # a view
    return torch.cat((t[:, :, :before], t[:, :, first:hi]), dim=2)
