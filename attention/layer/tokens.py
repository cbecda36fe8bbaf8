r"""One position per token: what every mask, score modifier, RoPE angle and kernel call reads.

Inside the layer a set of tokens (a call's queries, or the keys a cache returns) is one
[`Tokens`][attention.layer.tokens.Tokens]: each token's **position**, `(batch, n)` int64, with
$-1$ meaning *no token* (padding, an empty cache slot), and, where packed documents share a
row, each token's document id. Slots (where a token sits in a tensor) are storage, never
meaning: a padded row's real tokens count from 0 wherever they sit, and a ring buffer's keys
are compared by the positions they hold.

The public arguments, `key_padding_mask`, `document_ids`, `positions` and a cache, are turned
into `Tokens` once, at the edge ([`queries`][attention.layer.tokens.queries]), as Hugging Face
turns padding into one more mask function. Beside the tensor, a `Tokens` carries one fact the
host knows without reading the device: `start`, set when every row holds positions
`start, start + 1, ...` in slot order with no padding. That fact, not the tensor, lets the
planner choose `is_causal` or no mask at all ([`attention.layer.fused`][attention.layer.fused]).

Examples:
    >>> pad = torch.tensor([[True, False, False], [False, False, False]])
    >>> queries(2, 3, pad, None, None, torch.device("cpu")).pos  # padding: -1; rows count their own
    tensor([[-1,  0,  1],
            [ 0,  1,  2]])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attention.layer.masks import Mask, evaluate

if TYPE_CHECKING:
    from attention.layer.cache import KVCache

__all__ = ["Tokens", "queries", "visible"]


@dataclass(frozen=True)
class Tokens:
    """Positions (and document ids) of `n` tokens in each of `batch` rows.

    Attributes:
        pos: `(batch, n)` int64 positions; -1: no token (padding, an empty slot): `given`,
            or built from `start`.
        docs: `(batch, n)` int64 document ids, or None: one document per row.
        given: the positions, `(batch, n)`, or `(n,)` for every row alike; None: from `start`.
        start: where every row's positions start, when they are `start ... start + n - 1` in
            slot order with no padding (the host's knowledge); else None.
        counted: the positions count each row's real tokens from `start` in slot order
            (padding anywhere): moving each row's real tokens to its front makes them `start,
            start + 1, ...` (the planner's compaction).
        ring: the keys a ring buffer keeps of one sequence given in order, no padding: the
            last positions up to the newest, and the sinks.
    """

    batch: int
    n: int
    device: torch.device
    start: int | None = None
    given: Tensor | None = None
    docs: Tensor | None = None
    counted: bool = False
    ring: bool = False

    @property
    def pos(self) -> Tensor:
        """`(batch, n)` int64, -1 for no token."""
        return self.line.expand(self.batch, self.n)

    @property
    def line(self) -> Tensor:
        """The positions with the fewest dimensions: `(n,)` where every row's are the same."""
        if self.given is None:
            assert self.start is not None
            return torch.arange(self.start, self.start + self.n, device=self.device)
        return self.given

    @property
    def padded(self) -> Tensor:
        """`(batch, n)` bool, True where there is no token."""
        return self.pos < 0

    def with_docs(self, docs: Tensor | None) -> Tokens:
        return replace(self, docs=docs)


def queries(
    batch: int,
    num_tokens: int,
    padding: Tensor | None,
    positions: Tensor | None,
    documents: Tensor | None,
    device: torch.device,
    cache: KVCache | None = None,
) -> Tokens:
    """A call's queries as `Tokens`: from `positions`, else counted after what `cache` holds.

    Args:
        batch: rows.
        num_tokens: tokens per row.
        padding: `(batch, T)` bool, True = padding (its position becomes -1), or None.
        positions: `(batch, T)` each token's position, if the caller gave them.
        documents: `(batch, T)` document ids, or None.
        device: where the positions live.
        cache: the layer's cache, whose rows' next positions the chunk continues.

    Returns:
        The queries' `Tokens` (`start` known when nothing sets rows apart).
    """
    docs = None if documents is None else documents.long()
    if positions is not None:
        pos = positions.long()
        if padding is not None:
            pos = pos.masked_fill(padding, -1)
        return Tokens(batch, num_tokens, device, given=pos, docs=docs)
    if cache is not None and not cache.contiguous:  # each row continues from its own next
        first = cache.next[:, None]  # (b, 1)
    else:
        first = None
    start = 0 if cache is None else cache.length
    if padding is None:
        if first is None:
            return Tokens(batch, num_tokens, device, start=start, docs=docs, counted=True)
        line = torch.arange(num_tokens, device=device)
        return Tokens(batch, num_tokens, device, given=first + line, docs=docs)
    counted = (~padding).long().cumsum(dim=1) - 1  # (b, T): each row's real tokens from 0
    pos = (counted + (start if first is None else first)).masked_fill(padding, -1)
    return Tokens(batch, num_tokens, device, given=pos, docs=docs, counted=first is None)


def visible(rule: Mask, q: Tokens, k: Tokens, *, num_heads: int = 1) -> Tensor:
    """The mask at every (query, key) pair of positions, and the documents: `(b or 1, h or 1,
    T, S)` bool, True = may attend; a pair with no token (position -1) is never visible.

    Examples:
        >>> from attention.layer.masks import causal
        >>> q = Tokens(1, 2, torch.device("cpu"), start=3)
        >>> k = Tokens(1, 5, torch.device("cpu"), start=0)
        >>> visible(causal(), q, k)[0, 0].int()  # a chunk at 3, 4 over keys 0 .. 4
        tensor([[1, 1, 1, 1, 0],
                [1, 1, 1, 1, 1]], dtype=torch.int32)
    """
    q_pos, k_pos = q.line, k.line
    seen = evaluate(rule, q_pos, k_pos, num_heads=num_heads, batch=q.batch)
    if q.docs is None and k.docs is None:
        return seen
    q_docs = q.docs if q.docs is not None else q.pos.new_zeros(q.batch, q.n)
    k_docs = k.docs if k.docs is not None else k.pos.new_zeros(k.batch, k.n)
    same = q_docs[:, :, None] == k_docs[:, None, :]  # (b, T, S): ids[b, i] == ids[b, j]
    return seen & same[:, None]
