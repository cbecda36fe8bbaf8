r"""Masks as functions: which keys a query may see, written once as FlexAttention writes it.

A mask is a function of four broadcast tensors, FlexAttention's `mask_mod`:
$\operatorname{mask}(b, h, i, j)$ is True where query $i$ of row $b$, in head $h$, may see
key $j$, with $i$ and $j$ the tokens' **positions** (counted from 0 in their row, padding excluded, so
a padded row sees what it would alone). The built-ins combine with `&`, `|` and `~`:

| mask | visible when | FlexAttention / attention-gym |
| --- | --- | --- |
| [`causal()`][attention.layer.masks.causal] | $j \le i$ | `q_idx >= kv_idx` |
| [`window(w)`][attention.layer.masks.window] | $0 \le i - j < w$ (its last $w$ positions, itself included) | `generate_sliding_window(w - 1)` |
| [`sinks(k)`][attention.layer.masks.sinks] | $j < k$ | `kv_idx < k` |
| [`documents(ids)`][attention.layer.masks.documents] | $\text{ids}_{b,i} = \text{ids}_{b,j}$ | `document_id[q_idx] == document_id[kv_idx]` |
| [`padding(kpm)`][attention.layer.masks.padding] | neither is padding | `~kpm[b, q_idx] & ~kpm[b, kv_idx]` |

[`Mask(fn)`][attention.layer.masks.Mask] wraps any `mask_mod`, so one from attention-gym works
unchanged.

**Bounds.** Beside its function, each mask carries [`Bounds`][attention.layer.masks.Bounds]: what
is *certainly* hidden (the future; keys further back than a reach, except the first few) and
what is *certainly* seen. Primitives declare them, `&` and `|` derive them, and a user's
function has none, which is always safe. The planner
([`attention.layer.fused`][attention.layer.fused]) reads only bounds to choose a kernel call; the cache
reads them to know what it may forget. Nothing decides from a mask's name.

Examples:
    >>> streaming = causal() & (window(3) | sinks(1))  # StreamingLLM: a window and a sink
    >>> streaming
    causal() & (window(3) | sinks(1))
    >>> pos = torch.arange(5)
    >>> streaming.grid(pos, pos).int()  # (num_queries, num_keys), 1 = may attend
    tensor([[1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 0, 1, 1, 1]], dtype=torch.int32)
    >>> streaming.bounds.reach, streaming.bounds.anchor  # what a ring buffer must keep
    (3, 1)
"""  # noqa: E501

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from attention.checks import check_size, check_tensor

__all__ = [
    "Bounds",
    "Mask",
    "MaskMod",
    "causal",
    "chunk_mask",
    "documents",
    "everything",
    "indices",
    "padding",
    "segments",
    "sinks",
    "window",
]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""FlexAttention's `mask_mod(b, h, q_idx, kv_idx) -> bool`, on broadcast tensors."""


@dataclass(frozen=True)
class Bounds:
    r"""What is certain about a mask, whatever the positions: the planner's only input.

    With $d = i - j$ (how far back key $j$ lies from query $i$):

    - **upper** (a superset of the visible pairs): `causal_from` $c$: every query $i \ge c$
      sees only $d \ge 0$ ($c = 0$: `causal`; a prefix-LM's $c$ is its prefix; $\infty$:
      nothing certain); `reach` $r$ and `anchor` $a$: $d < r \vee j < a$ (None: unbounded).
    - **lower** (a subset): every pair with $0 \le d <$ `near`, and every $j <$ `first`
      with $j \le i$, is visible; `everything`: every pair is.

    `&` and `|` of two masks derive their bounds from these alone
    ([`both`][attention.layer.masks.Bounds.both], [`either`][attention.layer.masks.Bounds.either]).
    """

    causal_from: float = math.inf
    reach: int | None = None
    anchor: int = 0
    near: float = 0
    first: float = 0
    everything: bool = False

    def both(self, other: Bounds) -> Bounds:
        """The bounds of `a & b`: the tighter upper bound, the smaller lower one."""
        if self.reach is None or other.reach is None:
            reach = self.reach if other.reach is None else other.reach
            anchor = self.anchor if other.reach is None else other.anchor
        else:  # (d < r1 or j < a1) and (d < r2 or j < a2)  =>  d < min r or j < max a
            reach, anchor = min(self.reach, other.reach), max(self.anchor, other.anchor)
        return Bounds(
            causal_from=min(self.causal_from, other.causal_from),
            reach=reach,
            anchor=anchor,
            near=min(self.near, other.near),
            first=min(self.first, other.first),
            everything=self.everything and other.everything,
        )

    def either(self, other: Bounds) -> Bounds:
        """The bounds of `a | b`: the looser upper bound, the larger lower one."""
        bounded = self.reach is not None and other.reach is not None
        return Bounds(
            causal_from=max(self.causal_from, other.causal_from),
            reach=max(self.reach, other.reach) if bounded else None,  # type: ignore[type-var]
            anchor=max(self.anchor, other.anchor) if bounded else 0,
            near=max(self.near, other.near),
            first=max(self.first, other.first),
            everything=self.everything or other.everything,
        )

    @property
    def causal(self) -> bool:
        """Whether every query certainly sees only its past: causal from position 0."""
        return self.causal_from == 0

    @property
    def prefix(self) -> int | None:
        """The positions before which queries may see ahead (a prefix-LM's prompt): 0 for a
        causal mask, None where no position makes it causal (a cache cannot take it)."""
        return None if math.isinf(self.causal_from) else int(self.causal_from)

    @property
    def span(self) -> int | None:
        """Keys a causal query can see at most (`reach + anchor`), or None: unbounded."""
        return None if self.reach is None else self.reach + self.anchor

    def sees_kept(self) -> bool:
        """Whether a query sees every key its upper bound keeps (a ring buffer's, say)."""
        if not self.causal or self.reach is None:
            return False
        return self.near >= self.reach and self.first >= self.anchor


class Mask:
    """A mask: a `mask_mod` function, its bounds, and a name to print.

    Args:
        fn: `fn(b, h, q_idx, kv_idx) -> bool`, FlexAttention's `mask_mod`, called with
            broadcast int64 tensors `b` `(B, 1, 1, 1)`, `h` `(1, H, 1, 1)`, `q_idx`
            `(B or 1, 1, T, 1)`, `kv_idx` `(B or 1, 1, 1, S)`; it must return a bool tensor
            that broadcasts to `(B, H, T, S)`. `&`, `|`, `~`, `==`, comparisons and indexing
            of tensors all broadcast so; Python's `and`, `or`, `if` do not.
        name: how it prints; default the function's name.
        bounds: what is certain about it (default: nothing, which is always correct). A
            wrong bound gives wrong answers: declare only what the function guarantees.
        key: what makes two masks equal (default the function itself): the built-ins of
            positions use their name, so `window(4) == window(4)`; `documents` and
            `padding`, which close over tensors, compare by identity.

    Raises:
        TypeError: `fn` is not callable.

    Examples:
        >>> checkerboard = Mask(lambda b, h, q_idx, kv_idx: (q_idx + kv_idx) % 2 == 0)
        >>> (causal() & checkerboard).grid(torch.arange(3), torch.arange(3)).int()
        tensor([[1, 0, 0],
                [0, 1, 0],
                [1, 0, 1]], dtype=torch.int32)
    """

    def __init__(
        self,
        fn: MaskMod,
        name: str | None = None,
        bounds: Bounds | None = None,
        key: object = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                "mask must be a Mask or a function fn(b, h, q_idx, kv_idx) -> bool tensor "
                f"(FlexAttention's mask_mod), got {type(fn).__name__}"
            )
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "mask_mod"))
        self.bounds = Bounds() if bounds is None else bounds
        self.key = fn if key is None else key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mask) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return self.fn(b, h, q_idx, kv_idx)

    def __and__(self, other: object) -> Mask:
        """Both: `fn_a(...) & fn_b(...)`, bounded by `Bounds.both`."""
        right = as_mask(other, "the right side of &")
        return self._join(right, "&", _both, self.bounds.both(right.bounds))

    def __or__(self, other: object) -> Mask:
        """Either: `fn_a(...) | fn_b(...)`, bounded by `Bounds.either`."""
        right = as_mask(other, "the right side of |")
        return self._join(right, "|", _either, self.bounds.either(right.bounds))

    def __invert__(self) -> Mask:
        """Not: `~fn(...)`. Nothing is certain about it (no bounds are derived for a
        negation), so no tile is skipped or taken whole on its account; under `&` with a
        mask that has bounds (`causal() & ~window(2)`), that mask's still hold."""
        name = f"~({self.name})" if isinstance(self.key, tuple) else f"~{self.name}"
        return Mask(partial(_not, self.fn), name, Bounds(), ("~", self.key))

    def _join(self, right: Mask, op: str, fn: Callable[..., Tensor], bounds: Bounds) -> Mask:
        """One combination: its function, its name, its bounds, and a key to compare by."""
        looser = "|" if op == "&" else None  # `|` under `&` needs brackets, not the reverse
        name = f"{_wrap(self, looser)} {op} {_wrap(right, looser)}"
        return Mask(partial(fn, self.fn, right.fn), name, bounds, (op, self.key, right.key))

    def __rand__(self, other: object) -> Mask:  # a plain mask_mod & a Mask
        return as_mask(other, "the left side of &") & self

    def __ror__(self, other: object) -> Mask:
        return as_mask(other, "the left side of |") | self

    def __repr__(self) -> str:
        return self.name

    def grid(self, q_pos: Tensor, k_pos: Tensor, *, num_heads: int = 1) -> Tensor:
        """The mask at every pair of positions, True = may attend (checked: see `evaluate`).

        Args:
            q_pos: `(T,)` the queries' positions, or `(B, T)` each row's.
            k_pos: `(S,)` the keys' positions, or `(B, S)`.
            num_heads: the heads `h` ranges over.

        Returns:
            `(T, S)` for 1-d positions and a mask of neither row nor head; else the
            broadcast `(B or 1, H or 1, T, S)`.
        """
        out = evaluate(self, q_pos, k_pos, num_heads=num_heads)
        return out[0, 0] if q_pos.ndim == k_pos.ndim == 1 and out.shape[:2] == (1, 1) else out


# The built-ins' functions live at module level (bound by `partial`), so a layer that holds
# them pickles, and a model trains in another process.


def _not(fn: MaskMod, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return ~fn(b, h, q, kv)


def _both(fn_a: MaskMod, fn_b: MaskMod, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return fn_a(b, h, q, kv) & fn_b(b, h, q, kv)


def _either(fn_a: MaskMod, fn_b: MaskMod, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return fn_a(b, h, q, kv) | fn_b(b, h, q, kv)


def _everything(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return torch.ones((), dtype=torch.bool, device=q.device)


def _causal(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return kv <= q  # j <= i


def _window(w: int, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return (kv <= q) & (q - kv < w)  # 0 <= i - j < w


def _sinks(k: int, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return kv < k  # j < k


def _same_document(rows: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    if rows.shape[0] > 1 and b.shape[0] != rows.shape[0]:
        raise ValueError(f"documents: ids hold {rows.shape[0]} rows, the batch has {b.shape[0]}")
    row = b if rows.shape[0] > 1 else torch.zeros_like(b)
    return rows[row, q] == rows[row, kv]  # ids[b, i] == ids[b, j]


def _not_padding(kpm: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return ~kpm[b, q] & ~kpm[b, kv]


def _wrap(mask: Mask, looser: str | None) -> str:
    """Parenthesise a combination whose operator (`|` under `&`) binds more loosely."""
    top = mask.key[0] if isinstance(mask.key, tuple) else None
    return f"({mask.name})" if top is not None and top == looser else mask.name


def as_mask(value: object, name: str = "mask") -> Mask:
    """`value` as a [`Mask`][attention.layer.masks.Mask]: a Mask, or a plain `mask_mod` function."""
    if isinstance(value, Mask):
        return value
    if callable(value):
        return Mask(value)
    raise TypeError(
        f"{name} must be a Mask or a function fn(b, h, q_idx, kv_idx) -> bool "
        f"tensor (FlexAttention's mask_mod), got {type(value).__name__}"
    )


def indices(
    q_pos: Tensor, k_pos: Tensor, *, batch: int = 1, num_heads: int = 1
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """FlexAttention's broadcast `(b, h, q_idx, kv_idx)` for these positions (below 0: as 0).

    `b` `(B, 1, 1, 1)` over `batch` rows (or the positions' rows), `h` `(1, H, 1, 1)`,
    `q_idx` `(B or 1, 1, T, 1)`, `kv_idx` `(B or 1, 1, 1, S)`: what every mask and score
    modifier is called with.

    Examples:
        >>> b, h, q, kv = indices(torch.arange(3), torch.arange(5), num_heads=2)
        >>> [tuple(t.shape) for t in (b, h, q, kv)]
        [(1, 1, 1, 1), (1, 2, 1, 1), (1, 1, 3, 1), (1, 1, 1, 5)]
    """
    batch = max(
        batch, q_pos.shape[0] if q_pos.ndim == 2 else 1, k_pos.shape[0] if k_pos.ndim == 2 else 1
    )
    device = q_pos.device
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)  # (B, 1, 1, 1)
    h = torch.arange(num_heads, device=device).view(1, -1, 1, 1)  # (1, H, 1, 1)
    q = q_pos.view(-1, 1, q_pos.shape[-1], 1).clamp(min=0)  # (B or 1, 1, T, 1)
    kv = k_pos.view(-1, 1, 1, k_pos.shape[-1]).clamp(min=0)  # (B or 1, 1, 1, S)
    return b, h, q, kv


def evaluate(
    mask: Mask, q_pos: Tensor, k_pos: Tensor, *, num_heads: int = 1, batch: int = 1
) -> Tensor:
    """`mask` at every pair, `(B or 1, H or 1, T, S)` bool; a broken mask raises, by name.

    Positions below 0 (an empty cache slot, a padded key) are never visible, whatever the
    function says. `b` ranges over `batch` rows (or the positions' rows). The checks read only
    shapes and dtypes (no host synchronisation).

    Raises:
        TypeError: the function raised, or returned something that is not a bool tensor.
        ValueError: its result does not broadcast to `(B, H, T, S)`.
    """
    b, h, q, kv = indices(q_pos, k_pos, batch=batch, num_heads=num_heads)
    device = q_pos.device
    full = (b.shape[0], num_heads, q.shape[2], kv.shape[3])
    try:
        out = mask.fn(b, h, q, kv)
    except Exception as error:  # a user's function: say which argument failed, and how
        shapes = ", ".join(str(tuple(t.shape)) for t in (b, h, q, kv))
        raise TypeError(
            f"mask {mask.name!r} failed on (b, h, q_idx, kv_idx) of shapes "
            f"{shapes}: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(out, Tensor) or out.dtype != torch.bool:
        kind = out.dtype if isinstance(out, Tensor) else type(out).__name__
        raise TypeError(f"mask {mask.name!r} must return a bool tensor, got {kind}")
    if out.device != device:
        raise ValueError(
            f"mask {mask.name!r} returned a tensor on {out.device}; the "
            f"positions are on {device} (move what it closes over there)"
        )
    try:
        if out.ndim > 4 or torch.broadcast_shapes(out.shape, full) != full:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"mask {mask.name!r} returned shape {tuple(out.shape)}, which does not broadcast "
            f"to (batch, heads, queries, keys) = {full}"
        ) from None
    out = out.view((1,) * (4 - out.ndim) + tuple(out.shape))
    out = out.expand(out.shape[0], out.shape[1], full[2], full[3])
    empty_q = q_pos.view(-1, 1, q_pos.shape[-1], 1) < 0  # an empty slot or a padded token:
    empty_kv = k_pos.view(-1, 1, 1, k_pos.shape[-1]) < 0  # never seen, never seeing
    return out & ~empty_kv & ~empty_q


def everything() -> Mask:
    """Every key is visible: an encoder's attention (`causal=False`)."""
    bounds = Bounds(near=math.inf, first=math.inf, everything=True)
    return Mask(_everything, "everything()", bounds, "everything()")


def causal() -> Mask:
    """$j \\le i$: a query sees itself and what came before it.

    Examples:
        >>> causal().grid(torch.arange(3), torch.arange(3)).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [1, 1, 1]], dtype=torch.int32)
    """
    bounds = Bounds(causal_from=0, near=math.inf, first=math.inf)
    return Mask(_causal, "causal()", bounds, "causal()")


def window(w: int) -> Mask:
    """$0 \\le i - j < w$: a query sees its last `w` positions, itself included.

    Causal by itself. Conventions differ: FlashAttention's `window_size=(w - 1, 0)`,
    attention-gym's `generate_sliding_window(w - 1)` and Hugging Face's `sliding_window=w`
    (keys $i - j < w$) are this window.

    Examples:
        >>> window(2).grid(torch.arange(4), torch.arange(4)).int()
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    check_size("window", w)
    bounds = Bounds(causal_from=0, reach=w, near=w)
    return Mask(partial(_window, w), f"window({w})", bounds, f"window({w})")


def sinks(k: int) -> Mask:
    """$j < k$: the first `k` positions, seen by every query (StreamingLLM's attention sinks).

    Combine with a window and causality: `causal() & (window(w) | sinks(k))`.
    """
    check_size("sinks", k)
    bounds = Bounds(causal_from=k, reach=0, anchor=k, first=k)
    return Mask(partial(_sinks, k), f"sinks({k})", bounds, f"sinks({k})")


def documents(ids: Tensor) -> Mask:
    """$\\text{ids}_{b,i} = \\text{ids}_{b,j}$: a query sees only the keys of its own document.

    Args:
        ids: `(batch, num_tokens)` or `(num_tokens,)` integer document ids, by position
            (padding excluded, as every mask is evaluated). `MultiHeadAttention`'s
            `document_ids=` argument is by slot instead: use one or the other.
    """
    ids = check_tensor("ids", ids, ndim=(1, 2))
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"documents: ids must be integers, got dtype {ids.dtype}")
    rows = ids if ids.ndim == 2 else ids[None]  # (B, T)
    return Mask(partial(_same_document, rows), "documents(ids)")


def padding(key_padding_mask: Tensor) -> Mask:
    """Neither the query nor the key is padding (`key_padding_mask` True), by slot.

    For a mask closing over a batch (FlexAttention's way), by slot. `MultiHeadAttention`'s own
    `key_padding_mask` argument goes further (positions then skip padding): use one or the
    other, not both.
    """
    kpm = check_tensor("key_padding_mask", key_padding_mask, ndim=2)
    if kpm.dtype != torch.bool:
        raise TypeError(f"padding: key_padding_mask must be bool (True = padding), got {kpm.dtype}")
    return Mask(partial(_not_padding, kpm), "padding(key_padding_mask)")


def from_flags(causal_: bool, window_: int | None, sinks_: int) -> Mask:
    """The mask that `MultiHeadAttention`'s shorthand `causal=`, `window=`, `sinks=` names.

    Raises:
        ValueError: a window without `causal`, sinks without a window.
    """
    if window_ is not None:
        check_size("window", window_)
        if not causal_:
            raise ValueError(f"a sliding window needs causal=True, got window={window_}")
    check_size("sinks", sinks_, minimum=0)
    if sinks_ and window_ is None:
        raise ValueError(
            f"attention sinks keep the first tokens visible beyond a window: sinks={sinks_} "
            "needs a window (without one every earlier token is visible)"
        )
    if window_ is None:
        return causal() if causal_ else everything()
    return causal() & (window(window_) | sinks(sinks_)) if sinks_ else window(window_)


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
    rule: Mask | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """What a chunk of queries at positions `start ... start + T - 1` may see of keys
    `0 ... start + T - 1`: True = may attend, the `mask` of
    [`explicit_attention`][attention.derivation.core.explicit_attention].

    Args:
        start: $S$, the tokens before the chunk (the cache's length).
        num_tokens: $T$, the chunk's queries.
        rule: the layer's mask; default `causal()`.
        device: where to build it.

    Returns:
        `(T, S + T)`.

    Examples:
        >>> chunk_mask(3, 2)  # queries at 3 and 4 over keys 0..4: the bottom-right triangle
        tensor([[ True,  True,  True,  True, False],
                [ True,  True,  True,  True,  True]])
    """
    check_size("start", start, minimum=0)
    check_size("num_tokens", num_tokens, minimum=0)
    q_pos = torch.arange(start, start + num_tokens, device=device)
    k_pos = torch.arange(start + num_tokens, device=device)
    return (causal() if rule is None else rule).grid(q_pos, k_pos)
