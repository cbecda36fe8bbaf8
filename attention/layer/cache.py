r"""The key/value cache: what one attention layer keeps of the tokens it has seen.

A model generates one token at a time. Token $t$'s query must meet the keys and values of
the tokens it sees; those of earlier tokens were computed at the steps before and do not
change (a causal layer's keys depend only on the past), so they are kept instead of
recomputed. The cache only **stores**: [`update`][attention.layer.cache.KVCache.update] writes a
chunk's keys and values and returns everything the chunk may attend to, with the keys'
positions; which of them each query sees is the layer's rule
([`attention.layer.masks`][attention.layer.masks]), applied by the attention.

Two layouts, chosen from the layer's window:

- **linear**: slot $p$ holds position $p$; `(batch, h_kv, max_tokens, head_dim)`, filled in
  place, for layers that see every earlier token;
- **ring buffer**, for a layer whose mask has a bounded reach
  ([`Bounds`][attention.layer.masks.Bounds]: a window $w$ and $k$ sinks, say): a query never sees
  more than the last $w$ positions and the first $k$, so only $w + k$ slots are kept. Position
  $p$ goes to slot $p$ if $p < k$, else to slot $k + (p - k) \bmod w$, overwriting a position no
  later query can see. Its memory is the window's, however long the sequence, and a decode step
  reads only the window.

Once padding (or documents) reaches it, the cache also keeps each row's own positions
(`rows`, padding excluded), and a ring places each row's tokens by that row's positions, so
a padded row keeps exactly what it would keep alone.

Examples:
    >>> from attention import MultiHeadAttention
    >>> mha = MultiHeadAttention(8, 8, context_length=16, dropout=0.0, num_heads=2).eval()
    >>> x = torch.randn(1, 6, 8)
    >>> cache = mha.init_cache(batch_size=1, max_tokens=16)
    >>> prefill = mha(x[:, :4], cache=cache)  # tokens 0..3
    >>> step = mha(x[:, 4:5], cache=cache)  # token 4, attending to 0..4
    >>> cache
    KVCache(batch_size=1, length=5, slots=16, num_kv_heads=2, head_dim=4)
    >>> torch.allclose(step, mha(x[:, :5])[:, 4:], atol=1e-6)  # as if recomputed
    True
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention.checks import check_size

__all__ = ["KVCache", "StaticCache", "next_positions"]


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    Made by
    [`MultiHeadAttention.init_cache`][attention.layer.multihead.MultiHeadAttention.init_cache] on
    the module's device and dtype, with `num_kv_heads` heads (grouped-query attention shrinks it
    by `num_heads / num_kv_heads`) and, for a layer whose mask bounds how far back a query sees,
    as a ring buffer of `window + sinks` slots.

    Args:
        batch_size: sequences generated together.
        max_tokens: the most tokens it takes, prompt included; None for no limit (a ring
            buffer only).
        num_kv_heads: key/value heads.
        head_dim: width of each head.
        window: how far back the layer's queries see (its mask's reach): keep only that.
        sinks: the first positions every query sees (its mask's anchor), kept for good.
        device: where to allocate it.
        dtype: the keys' and values' dtype.

    Attributes:
        keys: `(batch_size, num_kv_heads, slots, head_dim)` (one more slot, never read, in a
            ring that has taken padding).
        values: the same shape.
        positions: `(slots,)` int64, the position each slot holds (-1: empty); None for a
            linear cache, whose slot $p$ holds position $p$.
        rows: `(batch_size, slots)` int64, each row's own position in each slot (padding
            excluded; -1: empty or padding), once padding or documents were given; else None.
        segments: `(batch_size, slots)` int64 segment per slot (document id, -1 for
            padding), or None while every token stored is one real segment.
        length: how many tokens (slots' worth) it has taken.
        pads: `(batch_size,)` int64, the padding tokens each row has taken, or None while
            none has been given: a row's next position is `length - pads`.

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size below 1, or no `max_tokens` without a window.
    """

    def __init__(
        self,
        batch_size: int,
        max_tokens: int | None,
        num_kv_heads: int,
        head_dim: int,
        *,
        window: int | None = None,
        sinks: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):  # fmt: skip
            check_size(name, value)
        check_size("sinks", sinks, minimum=0)
        if window is not None:
            check_size("window", window)
        if max_tokens is None and window is None:
            raise ValueError("max_tokens=None (no limit) needs a window: a ring buffer")
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
        span = None if window is None else window + sinks
        self.ring = span is not None and (max_tokens is None or max_tokens > span)
        slots = span if self.ring else max_tokens
        assert slots is not None
        self.max_tokens = max_tokens
        self.window, self.sinks = window, sinks
        shape = (batch_size, num_kv_heads, slots, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.positions = (
            torch.full((slots,), -1, dtype=torch.long, device=device) if self.ring else None
        )
        self._slots = slots
        self.rows: Tensor | None = None
        self.segments: Tensor | None = None
        self.pads: Tensor | None = None
        self.length = 0
        self.layout: tuple[object, ...] | None = None  # set by the layer that made it

    @property
    def batch_size(self) -> int:
        return self.keys.shape[0]

    @property
    def slots(self) -> int:
        """Tokens it holds at once: `max_tokens`, or the window and sinks of a ring buffer."""
        return self._slots

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values it holds when full."""
        return 2 * self.keys.numel() * self.keys.element_size()

    def reset(self) -> None:
        """Forget every token (the memory stays allocated)."""
        self.length = 0
        self.segments = self.pads = self.rows = None
        self.keys, self.values = self.keys.detach(), self.values.detach()  # drop old graphs
        if self.positions is not None:
            self.positions.fill_(-1)

    def update(
        self,
        keys: Tensor,
        values: Tensor,
        segments: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Store a chunk's keys and values; return every key and value the chunk may need.

        The chunk takes slots `length ... length + T - 1`. Inner method: the module checked
        the chunk against the cache (`MultiHeadAttention.forward`).

        Args:
            keys: the chunk's keys (already rotated, with RoPE), `(batch, h_kv, T, head_dim)`.
            values: likewise.
            segments: the chunk's segments, `(batch, T)`, or None (one real segment).
            positions: `(batch, T)` each row's positions of the chunk (padding excluded),
                given with `segments`; None: the slots' own.

        Returns:
            `(keys, values, positions, segments)`: `(batch, h_kv, S, head_dim)` each, the
            keys' positions (`(S,)`, `(batch, S)` once rows differ, or None when they are
            `0 ... S - 1` in order) and their segments `(batch, S)` or None.
        """
        if keys.dtype != self.keys.dtype:  # autocast: the cache keeps the module's dtype
            keys, values = keys.to(self.keys.dtype), values.to(self.keys.dtype)
        if segments is not None or self.rows is not None:
            return self._update_rows(keys, values, segments, positions)
        start, num_tokens = self.length, keys.shape[2]
        tracked = torch.is_grad_enabled()  # then out of place (_write); else in place
        if not self.ring:
            end = start + num_tokens
            if tracked:
                self._write(slice(start, end), keys, values)
            else:
                self.keys[:, :, start:end], self.values[:, :, start:end] = keys, values
            self.length = end
            return self.keys[:, :, :end], self.values[:, :, :end], None, None
        if num_tokens == 1:  # decode: write first, then the ring holds exactly the window
            k, w = self.sinks, self.window
            slot = start if start < k else k + (start - k) % w  # type: ignore[operator]
            if tracked:
                self._write(slice(slot, slot + 1), keys, values)
            else:
                self.keys[:, :, slot : slot + 1], self.values[:, :, slot : slot + 1] = keys, values
            assert self.positions is not None
            self.positions[slot] = start
            used = min(start + 1, self._slots)
            self.length = start + 1
            return self.keys[:, :, :used], self.values[:, :, :used], self.positions[:used], None
        return self._update_chunk(keys, values)

    def _update_chunk(
        self, keys: Tensor, values: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """A ring buffer's chunk: the stored window and the chunk together, then keep the rest."""
        assert self.positions is not None and self.window is not None
        start, num_tokens = self.length, keys.shape[2]
        end, used = start + num_tokens, min(start, self.slots)
        device = keys.device
        if start == 0:
            out: tuple[Tensor, Tensor, Tensor | None, Tensor | None] = (keys, values, None, None)
        else:
            out = (
                torch.cat((self.keys[:, :, :used], keys), dim=2),  # (b, h_kv, S + T, d_h)
                torch.cat((self.values[:, :, :used], values), dim=2),
                torch.cat((self.positions[:used], torch.arange(start, end, device=device))),
                None,
            )
        # keep what a later query can see: the sinks and the last `window` positions
        sinks = range(start, min(end, self.sinks))
        recent = range(max(start, end - self.window, self.sinks), end)
        keep = torch.tensor([*sinks, *recent], dtype=torch.long, device=device)
        local = keep - start
        slots = self._slots_of(keep)
        self._write(slots, keys.index_select(2, local), values.index_select(2, local))
        self.positions[slots] = keep
        self.length = end
        return out

    def _update_rows(
        self,
        keys: Tensor,
        values: Tensor,
        segments: Tensor | None,
        positions: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Rows that differ (padding, documents): each row's positions kept beside its keys."""
        b, _, num_tokens, _ = keys.shape
        start, device = self.length, keys.device
        if self.rows is None:  # the first chunk with padding or documents
            self._start_rows()
        assert self.rows is not None and self.segments is not None
        seg = segments if segments is not None else self.segments.new_zeros(b, num_tokens)
        if positions is None:  # every row's next tokens, after what each has taken
            pads = 0 if self.pads is None else self.pads[:, None]
            positions = start - pads + torch.arange(num_tokens, device=device)
        pos = positions.masked_fill(seg < 0, -1)  # (b, T): -1 for padding
        pads_now = (seg < 0).sum(dim=1)
        self.pads = pads_now if self.pads is None else self.pads + pads_now
        self.length = start + num_tokens
        if not self.ring:
            where = slice(start, start + num_tokens)
            self._write(where, keys, values)
            self.rows[:, where], self.segments[:, where] = pos, seg
            end = start + num_tokens
            return (self.keys[:, :, :end], self.values[:, :, :end], self.rows[:, :end],
                    self.segments[:, :end])  # fmt: skip
        assert self.window is not None
        span = self.slots
        if num_tokens > 1:  # what the chunk's queries may need: the stored window, then it
            out = (torch.cat((self.keys[:, :, :span], keys), dim=2),
                   torch.cat((self.values[:, :, :span], values), dim=2),
                   torch.cat((self.rows[:, :span], pos), dim=1),
                   torch.cat((self.segments[:, :span], seg), dim=1))  # fmt: skip
        # each row keeps its sinks and its last `window` positions, at its own slots
        last = pos.amax(dim=1, keepdim=True)  # (b, 1): each row's newest position
        keep = (pos >= 0) & ((pos < self.sinks) | (pos > last - self.window))
        index = torch.where(keep, self._slots_of(pos.clamp(min=0)), span)  # span: the spare
        self._scatter(index, keys, values, pos, seg)
        if num_tokens > 1:
            return out
        return (self.keys[:, :, :span], self.values[:, :, :span], self.rows[:, :span],
                self.segments[:, :span])  # fmt: skip

    def _start_rows(self) -> None:
        """Per-row positions and segments for what is stored so far (all real, segment 0)."""
        b, device = self.batch_size, self.keys.device
        if self.positions is not None:
            shared = self.positions
        else:
            slot = torch.arange(self.slots, device=device)
            shared = torch.where(slot < self.length, slot, -1)
        # a ring's spare slot takes what a row does not keep (made once: reset keeps it)
        spare = 1 if self.ring else 0
        self.rows = torch.cat((shared, shared.new_full((spare,), -1))).expand(b, -1).clone()
        self.segments = torch.zeros(b, self.slots + spare, dtype=torch.long, device=device)
        if spare and self.keys.shape[2] == self.slots:
            grow = self.keys.new_zeros(*self.keys.shape[:2], 1, self.keys.shape[3])
            self.keys = torch.cat((self.keys, grow), dim=2)
            self.values = torch.cat((self.values, grow.clone()), dim=2)

    def _scatter(
        self, index: Tensor, keys: Tensor, values: Tensor, pos: Tensor, seg: Tensor
    ) -> None:
        """Write token `t` of row `r` to slot `index[r, t]` (then empty the spare slot)."""
        wide = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        if torch.is_grad_enabled():  # out of place, as _write
            self.keys = self.keys.scatter(2, wide, keys)
            self.values = self.values.scatter(2, wide, values)
        else:
            self.keys.scatter_(2, wide, keys)
            self.values.scatter_(2, wide, values)
        assert self.rows is not None and self.segments is not None
        self.rows.scatter_(1, index, pos)
        self.segments.scatter_(1, index, seg)
        self.rows[:, self.slots] = -1  # the spare slot holds nothing a query sees

    def _slots_of(self, position: Tensor) -> Tensor:
        """A ring's slot for each position: `p` for a sink, else `k + (p - k) mod w`."""
        assert self.window is not None
        return torch.where(position < self.sinks, position,
                           self.sinks + (position - self.sinks) % self.window)  # fmt: skip

    def _write(self, index: slice | Tensor, keys: Tensor, values: Tensor) -> None:
        """Write in place; out of place while autograd records, so a backward through
        several chunks finds each earlier chunk's keys unchanged (as a list of tensors,
        Hugging Face's dynamic cache, would), whichever projections train."""
        if torch.is_grad_enabled():
            self.keys = _stored(self.keys, index, keys)
            self.values = _stored(self.values, index, values)
        else:  # in place: one indexing call each (a decode step's only writes)
            self.keys[:, :, index] = keys
            self.values[:, :, index] = values

    def __repr__(self) -> str:
        b, h_kv, _, d_h = self.keys.shape
        ring = f", window={self.window}, sinks={self.sinks}" if self.ring else ""
        return (
            f"KVCache(batch_size={b}, length={self.length}, slots={self.slots}, "
            f"num_kv_heads={h_kv}, head_dim={d_h}{ring})"
        )


class StaticCache(KVCache):
    r"""A filled cache's decode steps with static shapes: every slot read, the place on the device.

    [`KVCache.update`][attention.layer.cache.KVCache.update] returns the live slots, so a
    decode step's shapes grow, and finds a token's slot from its host `length`. This view of
    the same tensors (made by [`of`][attention.layer.cache.StaticCache.of] after the prefill)
    writes one token per row at the slot its position gives, on the device:

    - linear: slot $p + \text{pads}$ (the row's padding came first);
    - ring: slot $p$ for a sink, else $k + (p - k) \bmod w$;

    and returns **every** slot with each slot's position per row, `key_positions`
    `(batch, slots)` (-1: empty or padding, which no mask shows). Its shapes never change and
    nothing is read on the host: a step that calls it can be captured in one CUDA graph
    ([`attention.model.decode`][attention.model.decode]). The caller advances `length` (the
    host's count, for the layer's checks).

    Examples:
        >>> from attention import MultiHeadAttention
        >>> mha = MultiHeadAttention(8, 8, context_length=16, dropout=0.0, num_heads=2).eval()
        >>> x = torch.randn(1, 6, 8)
        >>> cache = mha.init_cache(batch_size=1, max_tokens=16)
        >>> _ = mha(x[:, :5], cache=cache)  # the prefill: tokens 0..4
        >>> static = StaticCache.of(cache)
        >>> step = mha(x[:, 5:], cache=static, positions=torch.tensor([[5]]))  # all 16 slots
        >>> torch.allclose(step, mha(x)[:, 5:], atol=1e-6)
        True
    """

    key_positions: Tensor
    first_slots: Tensor

    @classmethod
    def of(cls, cache: KVCache) -> StaticCache:
        """A static view of `cache` after its prefill: the same keys and values, not copied."""
        static = cls.__new__(cls)
        static.__dict__.update(cache.__dict__)
        b, device, slots = cache.batch_size, cache.keys.device, cache.keys.shape[2]
        if cache.rows is not None:  # each row's own positions (a ring's spare slot: -1)
            key_pos = cache.rows.clone()
        elif cache.positions is not None:  # a ring: the slots' positions, every row alike
            key_pos = cache.positions.expand(b, -1).clone()
        else:  # linear: slot p holds position p, up to length
            slot = torch.arange(slots, device=device)
            key_pos = torch.where(slot < cache.length, slot, -1).expand(b, -1).clone()
        static.key_positions = key_pos  # (b, slots)
        pads = cache.pads if cache.pads is not None else key_pos.new_zeros(b)
        static.first_slots = pads[:, None]  # (b, 1): the slot of each row's position 0
        return static

    def update(
        self,
        keys: Tensor,
        values: Tensor,
        segments: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Write one token per row at its position's slot; return every slot and its positions.

        Args:
            keys: `(batch, h_kv, 1, head_dim)`.
            values: likewise.
            segments: must be None (documents are for prefills).
            positions: `(batch, 1)` each row's position, on the device.

        Returns:
            `(keys, values, key_positions, None)`: `(batch, h_kv, slots, head_dim)` each and
            `(batch, slots)`.
        """
        assert positions is not None and segments is None and keys.shape[2] == 1
        if keys.dtype != self.keys.dtype:  # autocast: the cache keeps the module's dtype
            keys, values = keys.to(self.keys.dtype), values.to(self.keys.dtype)
        slot = self._slots_of(positions) if self.ring else positions + self.first_slots  # (b, 1)
        wide = slot[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        self.keys.scatter_(2, wide, keys)  # (b, h_kv, slots, d_h): the row's slot
        self.values.scatter_(2, wide, values)
        self.key_positions.scatter_(1, slot, positions)
        return self.keys, self.values, self.key_positions, None


def _stored(old: Tensor, index: slice | Tensor, new: Tensor) -> Tensor:
    """A copy of `old` with `new` at `index` of its token dimension (2): autograd keeps `old`."""
    if isinstance(index, slice):
        return old.slice_scatter(new, dim=2, start=index.start, end=index.stop)
    return old.index_copy(2, index, new)


def next_positions(
    num_tokens: int, start: int, pads: Tensor | None, padding: Tensor | None
) -> Tensor | None:
    """Each row's positions `(batch, num_tokens)`, padding excluded; None while they are the slots.

    A row's tokens count from its first real one: the padding a cache has taken (`pads`) and
    the chunk's (`padding`, True = padding) are skipped; a padded token gets the position
    before the next real one (-1 before any).

    Examples:
        >>> next_positions(4, 0, None, torch.tensor([[True, False, True, False]]))
        tensor([[-1,  0,  0,  1]])
    """
    if padding is None and pads is None:
        return None
    first = start if pads is None else (start - pads)[:, None]  # each row's next position
    if padding is None:
        assert pads is not None
        return first + torch.arange(num_tokens, device=pads.device)  # (b, T)
    return first + (~padding).long().cumsum(dim=1) - 1  # (b, T)
