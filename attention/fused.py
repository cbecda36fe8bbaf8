r"""The fused path: the least mask each case needs, derived from the visibility rule.

`torch.nn.functional.scaled_dot_product_attention` (SDPA) never materialises the
$T \times T$ weights, but it takes `is_causal=True` *or* a mask, and a mask costs a tensor of
its size. [`fused_attention`][attention.fused.fused_attention] asks what the rule
([`attention.visibility`][attention.visibility]) implies for the positions at hand and hands
the kernel the least it needs:

| case | what reaches the kernel |
| --- | --- |
| not causal, one segment | nothing |
| causal, queries from position 0, every query sees all earlier keys | `is_causal` |
| causal, padding after the real tokens | `is_causal`, padded rows zeroed |
| causal without sinks, one run of real tokens (left padding) | the same, each row rolled until its run starts at 0 |
| one new query that sees every key it is given (decode) | nothing |
| causal with a window $w$, queries from position 0, $T > w$ | blocks of $w$ queries, each with its own $(w, \le 2w)$ mask ([`sliding_window_attention`][attention.fused.sliding_window_attention]) |
| anything else (padding, documents, chunks after a cache) | the bool mask [`visible`][attention.visibility.visible] |

Every mask that is built comes from [`visible`][attention.visibility.visible]; the cases
without one are those in which it would be all True, or exactly `is_causal`'s triangle. The
tests check each case against the explicit path, and which kernel call each case makes.
Grouped key/value heads reach the kernel as they are (`enable_gqa`); a padded query attends
to nothing and its context vector is zero.
"""  # noqa: E501

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.sinks import with_sink
from attention.visibility import Visibility, same_segment, visible

__all__ = [
    "cross_attention",
    "fused_attention",
    "roll_tokens",
    "sdpa",
    "sliding_window_attention",
]


def fused_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Visibility,
    *,
    start: int = 0,
    key_positions: Tensor | None = None,
    q_seg: Tensor | None = None,
    k_seg: Tensor | None = None,
    padding: bool = False,
    right_padded: bool = False,
    run_start: Tensor | None = None,
    dropout_p: float = 0.0,
    sink_logits: Tensor | None = None,
) -> Tensor:
    """Attention on the fused kernel with the least mask the case needs (table above).

    Inner function: the module checked its inputs; nothing is checked here.

    Args:
        queries: `(b, h, T, d_h)`, at positions `start ... start + T - 1`.
        keys: `(b, h_kv, S, d_h)`, `h` a multiple of `h_kv`.
        values: `(b, h_kv, S, d_v)`.
        rule: the layer's visibility.
        start: the first query's position.
        key_positions: `(S,)` the keys' positions; None for `0 ... S - 1` in order.
        q_seg: `(b, T)` the queries' segments (document id, -1 for padding), or None.
        k_seg: `(b, S)` the keys' segments, given with `q_seg`.
        padding: the segments are only padding (no documents): for a rule that is not
            causal the mask is then one row per sequence, `(b, 1, 1, S)`.
        right_padded: besides, the padding comes after each row's real tokens, and the keys
            are the queries: under a causal rule no real query can reach a padded key (each
            comes after it), so the kernel needs no mask at all.
        run_start: or `(b,)`: each row's real tokens are one run starting there (left
            padding). A rule of distances alone (causal, a window, no sinks) sees the same
            pairs once every position of a row shifts by one amount, so each row's queries,
            keys and values are rolled until the run starts at 0, attended as right padding,
            and rolled back ([`roll_tokens`][attention.fused.roll_tokens]).
        dropout_p: dropout on the weights.
        sink_logits: `(h,)` a learned logit per head for "attend to nothing", or None.

    Returns:
        `(b, h, T, d_v)`; zero at padded queries.
    """
    if q_seg is not None and padding:  # only padding: zero its rows after the kernel
        padded = (q_seg < 0)[:, None, :, None]  # (b, 1, T, 1)
        if run_start is not None and rule.causal and not rule.sinks:  # roll into right padding
            queries, keys, values = (roll_tokens(t, run_start) for t in (queries, keys, values))
            context_vec = fused_attention(queries, keys, values, rule, dropout_p=dropout_p,
                                          sink_logits=sink_logits)  # fmt: skip
            return roll_tokens(context_vec, -run_start).masked_fill(padded, 0.0)
        if right_padded and rule.causal:  # no real query reaches a padded key: no segments
            context_vec = fused_attention(queries, keys, values, rule, dropout_p=dropout_p,
                                          sink_logits=sink_logits)  # fmt: skip
            return context_vec.masked_fill(padded, 0.0)
        if not rule.causal:  # the rule hides no position: a real query sees the real keys
            assert k_seg is not None
            mask = same_segment(torch.zeros_like(q_seg[:, :1]), k_seg)  # (b, 1, 1, S)
            mask = mask | ~mask.any(-1, keepdim=True)  # an all-padding row: any, then 0
            return sdpa(queries, keys, values, mask, dropout_p=dropout_p,
                        sink_logits=sink_logits).masked_fill(padded, 0.0)  # fmt: skip
    num_tokens, num_keys = queries.shape[-2], keys.shape[-2]
    end = start + num_tokens
    window = rule.window
    in_order = key_positions is None and num_keys == end  # keys at 0 .. end - 1
    if q_seg is None and sink_logits is None:
        if in_order:
            sees_all = not rule.causal or window is None or end <= window
            if not rule.causal or (num_tokens == 1 and sees_all):
                return sdpa(queries, keys, values, dropout_p=dropout_p)
            if start == 0 and sees_all:
                return sdpa(queries, keys, values, is_causal=True, dropout_p=dropout_p)
        elif key_positions is not None and num_tokens == 1:
            # a ring buffer holds exactly the window (and sinks) of its newest token
            return sdpa(queries, keys, values, dropout_p=dropout_p)
    if in_order and start == 0 and window is not None and num_tokens > window:
        return sliding_window_attention(queries, keys, values, rule, segments=q_seg,
                                        dropout_p=dropout_p, sink_logits=sink_logits)  # fmt: skip
    q_pos = torch.arange(start, end, device=queries.device)
    mask = visible(
        rule, q_pos, _positions(keys, key_positions), q_seg, k_seg
    )  # (T, S) | (b, 1, T, S)
    if q_seg is None:
        return sdpa(queries, keys, values, mask, dropout_p=dropout_p, sink_logits=sink_logits)
    padded = (q_seg < 0)[:, None, :, None]  # (b, 1, T, 1): sees nothing; any row, then 0
    context_vec = sdpa(queries, keys, values, mask | padded, dropout_p=dropout_p,
                       sink_logits=sink_logits)  # fmt: skip
    return context_vec.masked_fill(padded, 0.0)


def cross_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    key_segments: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
) -> Tensor:
    """Queries of one sequence over the keys of another: only the keys' padding is hidden.

    Without padding the kernel gets no mask; with it, one row per sequence, `(b, 1, 1, S)`
    ([`same_segment`][attention.visibility.same_segment] of a real query and each key). A
    sequence whose keys are all padding gets zero context vectors.

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
        return sdpa(queries, keys, values, dropout_p=dropout_p)
    mask = same_segment(key_segments.new_zeros(key_segments.shape[0], 1), key_segments)
    empty = ~mask.any(-1, keepdim=True)  # (b, 1, 1, 1): no real key: any row, then 0
    context_vec = sdpa(queries, keys, values, mask | empty, dropout_p=dropout_p)
    return context_vec.masked_fill(empty, 0.0)


def roll_tokens(t: Tensor, shift: Tensor) -> Tensor:
    """Row `b` of `(b, h, T, d)` rolled back by `shift[b]` tokens: token `(j + shift) mod T` to `j`.

    `roll_tokens(roll_tokens(t, shift), -shift)` is `t`.

    Examples:
        >>> t = torch.arange(4.0).view(1, 1, 4, 1)
        >>> roll_tokens(t, torch.tensor([1])).flatten()
        tensor([1., 2., 3., 0.])
    """
    num_tokens = t.shape[2]
    index = (torch.arange(num_tokens, device=t.device) + shift[:, None]) % num_tokens  # (b, T)
    return t.gather(2, index[:, None, :, None].expand_as(t))


def _positions(keys: Tensor, key_positions: Tensor | None) -> Tensor:
    """The keys' positions: as given, or `0 ... S - 1`."""
    if key_positions is not None:
        return key_positions
    return torch.arange(keys.shape[-2], device=keys.device)


def sdpa(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    sink_logits: Tensor | None = None,
) -> Tensor:
    r"""The one call of the kernel: `mask` True = may attend (SDPA's convention).

    With `sink_logits` $z_h$ (gpt-oss), each head's softmax gets one more term, $e^{z_h}$,
    for a key that is always visible and whose value is zero, so a head can give less than
    all of its weight to the tokens ([`attention.sinks`][attention.sinks]). It enters the
    kernel as a zero key and value and a float mask whose sink column holds $z_h$.
    """
    gqa = queries.shape[1] != keys.shape[1]
    if sink_logits is not None:  # the dispatch hands a sink its mask, never is_causal
        queries, keys, values, mask = with_sink(queries, keys, values, mask, sink_logits)
    return F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
        enable_gqa=gqa,
    )  # fmt: skip


def sliding_window_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Visibility,
    *,
    segments: Tensor | None = None,
    dropout_p: float = 0.0,
    sink_logits: Tensor | None = None,
) -> Tensor:
    r"""Causal attention in which query $i$ sees keys $i - w < j \le i$, in $O(T w)$, not $O(T^2)$.

    The queries are cut into blocks of $w$; block $n$ (queries $nw \dots nw + w - 1$) can only
    see keys $nw - w + 1 \dots nw + w - 1$ (and the sinks), a slice of the keys, so each block
    meets at most $2w$ keys under its own mask from
    [`visible`][attention.visibility.visible]. The blocks run one after another into one
    output: nothing $T \times T$ is built, no copy of the keys is made, and the memory beyond
    the output is one block's.

    Args:
        queries: `(b, h, T, d_h)`, at positions `0 ... T - 1`.
        keys: `(b, h_kv, T, d_h)`, `h` a multiple of `h_kv`.
        values: `(b, h_kv, T, d_v)`.
        rule: a causal [`Visibility`][attention.visibility.Visibility] with a window.
        segments: `(b, T)` the tokens' segments (document id, -1 for padding), or None.
        dropout_p: dropout on the weights (the kernel's own).
        sink_logits: `(h,)` learned sink logits ([`sdpa`][attention.fused.sdpa]), or None.

    Returns:
        The context vectors, `(b, h, T, d_v)`.

    Examples:
        >>> from attention.core import explicit_attention
        >>> q, k, v = torch.randn(3, 1, 2, 10, 4).unbind(0)  # (b, h, T, d_h) each
        >>> rule = Visibility(window=3)
        >>> fused = sliding_window_attention(q, k, v, rule)
        >>> pos = torch.arange(10)
        >>> explicit, _ = explicit_attention(q, k, v, mask=~rule(pos[:, None], pos))
        >>> torch.allclose(fused, explicit, atol=1e-6)
        True
    """
    assert rule.window is not None
    w, sinks = rule.window, rule.sinks
    num_tokens = queries.shape[-2]
    out = queries.new_empty(*queries.shape[:-1], values.shape[-1])  # (b, h, T, d_v)
    device = queries.device
    for lo in range(0, num_tokens, w):
        hi = min(lo + w, num_tokens)  # queries lo .. hi - 1
        first = max(lo - w + 1, 0)  # the first key any of them sees (sinks aside)
        keep = torch.arange(first, hi, device=device)  # the keys' positions
        reach = min(sinks, first)  # sinks 0 .. reach - 1 lie before the slice
        if reach:
            keep = torch.cat((torch.arange(reach, device=device), keep))
        k, v = _slice(keys, first, hi, reach), _slice(values, first, hi, reach)  # (b, h_kv, S, d)
        q_pos = torch.arange(lo, hi, device=device)
        if segments is None:
            mask = visible(rule, q_pos, keep)  # (hi - lo, S)
            out[:, :, lo:hi] = sdpa(queries[:, :, lo:hi], k, v, mask, dropout_p=dropout_p,
                                    sink_logits=sink_logits)  # fmt: skip
            continue
        q_seg, k_seg = segments[:, lo:hi], segments.index_select(1, keep)
        padded = (q_seg < 0)[:, None, :, None]  # (b, 1, hi - lo, 1): any row, then 0
        mask = visible(rule, q_pos, keep, q_seg, k_seg) | padded  # (b, 1, hi - lo, S)
        block = sdpa(queries[:, :, lo:hi], k, v, mask, dropout_p=dropout_p, sink_logits=sink_logits)
        out[:, :, lo:hi] = block.masked_fill(padded, 0.0)
    return out


def _slice(t: Tensor, first: int, hi: int, reach: int) -> Tensor:
    """Tokens `first .. hi - 1` of `(b, h, T, d)`, after tokens `0 .. reach - 1` if any."""
    if not reach:
        return t[:, :, first:hi]  # a view
    return torch.cat((t[:, :, :reach], t[:, :, first:hi]), dim=2)
