r"""Which keys a query may see: the one definition every attention path derives from.

Whether query $i$ may attend to key $j$ depends on their **positions** $p_i$, $p_j$ (where
each token stands in its sequence, counted from 0, padding included), on the layer's
configuration, and on one integer per token, its **segment** $s$ (which document it belongs
to; $-1$ for padding):

$$
\begin{aligned}
\operatorname{visible}(i, j) = {} & [p_j \le p_i] \\
\wedge {} & \big([p_i - p_j < w] \vee [p_j < k]\big) \\
\wedge {} & [s_i = s_j \ge 0]:
\end{aligned}
$$

causality, then the window (of $w$ positions) and its $k$ sinks, then documents and padding.

The first two factors are [`Visibility`][attention.visibility.Visibility], a function of two
positions in the spirit of FlexAttention's `mask_mod`; the last is
[`same_segment`][attention.visibility.same_segment]; [`visible`][attention.visibility.visible]
is their product for whole tensors of positions. Positions are explicit, so a chunk of
queries starting at position $L$ against a cache of keys is the same computation as a whole
sequence at once: the explicit path, the fused kernels' dispatch (which mask, if any, the
kernel needs), the blocks of a sliding window, the cache's decode step, the heads analysis
and the figures all ask this module.

Examples:
    >>> rule = Visibility(causal=True, window=2)
    >>> positions = torch.arange(4)
    >>> rule(positions[:, None], positions[None, :])  # True = may attend
    tensor([[ True, False, False, False],
            [ True,  True, False, False],
            [False,  True,  True, False],
            [False, False,  True,  True]])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attention.checks import check_flag, check_size

__all__ = ["Visibility", "chunk_mask", "same_segment", "segments", "visible"]


@dataclass(frozen=True)
class Visibility:
    """A layer's rule of which key positions a query position sees, and nothing else.

    Args:
        causal: hide keys after the query ($p_j > p_i$).
        window: with `causal`, the query sees only its last `window` positions, itself
            included ($p_i - p_j < w$); None for all.
        sinks: with a `window`, the first `sinks` positions stay visible to every query
            however far back (StreamingLLM's *attention sinks*).

    Raises:
        TypeError: a switch not a bool, a size not an int.
        ValueError: a window without `causal`, sinks without a window.
    """

    causal: bool = True
    window: int | None = None
    sinks: int = 0

    def __post_init__(self) -> None:
        check_flag("causal", self.causal)
        check_size("sinks", self.sinks, minimum=0)
        if self.window is not None:
            check_size("window", self.window)
            if not self.causal:
                raise ValueError(f"a sliding window needs causal=True, got window={self.window}")
        if self.sinks and self.window is None:
            raise ValueError(
                f"attention sinks keep the first tokens visible beyond a window: sinks="
                f"{self.sinks} needs a window (without one every earlier token is visible)"
            )

    def __call__(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """True where a query at `q_pos` may see a key at `k_pos` (broadcast together).

        A key position below 0 marks an empty slot (of a cache not yet full): never visible.
        """
        seen = (k_pos >= 0) & (q_pos >= 0)  # (T_q, T_k), broadcast
        if self.causal:
            seen = seen & (k_pos <= q_pos)  # p_j <= p_i
        if self.window is not None:
            near = k_pos > q_pos - self.window  # p_i - p_j < w
            if self.sinks:
                near = near | (k_pos < self.sinks)  # p_j < k: a sink
            seen = seen & near
        return seen

    @property
    def span(self) -> int | None:
        """How many key slots a query can see at most (window plus sinks), or None: unbounded."""
        return None if self.window is None else self.window + self.sinks


def same_segment(q_seg: Tensor, k_seg: Tensor) -> Tensor:
    """$[s_i = s_j \\ge 0]$: a query sees keys of its own document, and padding sees nothing.

    Args:
        q_seg: `(batch, num_queries)` segment ids.
        k_seg: `(batch, num_keys)`.

    Returns:
        `(batch, 1, num_queries, num_keys)`, broadcast over heads.
    """
    return ((q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg[:, None, :] >= 0))[:, None]


def visible(
    rule: Visibility,
    q_pos: Tensor,
    k_pos: Tensor,
    q_seg: Tensor | None = None,
    k_seg: Tensor | None = None,
) -> Tensor:
    """The whole bool mask, True = may attend: `rule` at every pair, and the segments.

    Args:
        rule: the layer's [`Visibility`][attention.visibility.Visibility].
        q_pos: `(num_queries,)` positions of the queries.
        k_pos: `(num_keys,)` positions of the keys (below 0: an empty slot).
        q_seg: `(batch, num_queries)` segments of the queries, or None (one segment).
        k_seg: `(batch, num_keys)`, given with `q_seg`.

    Returns:
        `(num_queries, num_keys)`, or `(batch, 1, num_queries, num_keys)` with segments.

    Examples:
        >>> q_pos = torch.arange(3, 5)  # a chunk of two queries after three cached tokens
        >>> visible(Visibility(), q_pos, torch.arange(5))  # the bottom-right triangle
        tensor([[ True,  True,  True,  True, False],
                [ True,  True,  True,  True,  True]])
    """
    seen = rule(q_pos[:, None], k_pos[None, :])  # (T_q, T_k)
    if q_seg is None or k_seg is None:
        return seen
    return seen & same_segment(q_seg, k_seg)  # (b, 1, T_q, T_k)


def segments(
    key_padding_mask: Tensor | None = None, document_ids: Tensor | None = None
) -> Tensor | None:
    """One int64 per token: its document id (0 without documents), or -1 where it is padding.

    Args:
        key_padding_mask: `(batch, num_tokens)` bool, True = padding, or None.
        document_ids: `(batch, num_tokens)` non-negative ints, or None.

    Returns:
        `(batch, num_tokens)`, or None when there is neither (every token in one segment).

    Examples:
        >>> segments(torch.tensor([[False, False, True]]), torch.tensor([[0, 1, 1]]))
        tensor([[ 0,  1, -1]])
    """
    if key_padding_mask is None and document_ids is None:
        return None
    if document_ids is None:
        assert key_padding_mask is not None
        return key_padding_mask.long().neg()  # 0 real, -1 padding
    seg = document_ids.long()
    return seg if key_padding_mask is None else seg.masked_fill(key_padding_mask, -1)


def chunk_mask(
    start: int,
    num_tokens: int,
    rule: Visibility | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """What a chunk of queries at positions `start ...` may not see of keys `0 ... end - 1`.

    In the core's convention, True = hidden (the `mask` of
    [`explicit_attention`][attention.core.explicit_attention]): the negation of
    [`visible`][attention.visibility.visible] for these positions.

    Args:
        start: $S$, the tokens before the chunk (the cache's length).
        num_tokens: $T$, the chunk's queries.
        rule: the layer's rule; default causal, no window.
        device: where to build it.

    Returns:
        `(T, S + T)`.

    Examples:
        >>> chunk_mask(3, 2)  # queries at 3 and 4 over keys 0..4: the bottom-right triangle
        tensor([[False, False, False, False,  True],
                [False, False, False, False, False]])
    """
    check_size("start", start, minimum=0)
    check_size("num_tokens", num_tokens, minimum=0)
    q_pos = torch.arange(start, start + num_tokens, device=device)
    k_pos = torch.arange(start + num_tokens, device=device)
    return ~visible(rule or Visibility(), q_pos, k_pos)
