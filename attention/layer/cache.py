r"""The key/value cache: what one attention layer keeps of the tokens it has seen.

A model generates one token at a time. Token $t$'s query must meet the keys and values of
the tokens it sees; those of earlier tokens were computed at the steps before and do not
change (a causal layer's keys depend only on the past), so they are kept instead of
recomputed. The cache only **stores**, with gpt-fast's contract:
[`update(positions, keys, values)`][attention.layer.cache.KVCache.update] writes a chunk's keys
and values, each row's tokens at the slots their positions give, and returns every key the
chunk may attend to with the **position each slot holds**, per row (-1: empty). Which of them
each query sees is the layer's mask, evaluated at those positions by the attention.

A slot is storage, never meaning. Two slot maps, chosen from the layer's mask:

- **linear**: each row's tokens take the next free slots, in order; `(batch, h_kv,
  max_tokens, head_dim)`, for layers that see every earlier token;
- **ring buffer**, for a mask with a bounded reach
  ([`Bounds`][attention.layer.masks.Bounds]: a window $w$ and $k$ sinks, say): a query never
  sees more than the last $w$ positions and the first $k$, so only $w + k$ slots are kept.
  Position $p$ goes to slot $p$ if $p < k$, else to slot $k + (p - k) \bmod w$, overwriting a
  position no later query can see. Its memory is the window's, however long the sequence.

A decode step for a CUDA graph is the same update with static shapes: inside
[`static_steps`][attention.layer.cache.KVCache.static_steps] it returns **every** slot instead
of the filled ones. Both write the same state, so static and dynamic steps mix freely.

Examples:
    >>> from attention import MultiHeadAttention
    >>> mha = MultiHeadAttention(8, 8, context_length=16, dropout=0.0, num_heads=2).eval()
    >>> x = torch.randn(1, 6, 8)
    >>> cache = mha.init_cache(batch_size=1, max_tokens=16)
    >>> prefill = mha(x[:, :4], cache=cache)  # tokens 0..3
    >>> step = mha(x[:, 4:5], cache=cache)  # token 4, attending to 0..4
    >>> cache
    KVCache(batch_size=1, length=5, slots=16, num_kv_heads=2, head_dim=4)
    >>> torch.allclose(step, mha(x)[:, 4:5], atol=1e-6)  # as if recomputed
    True
    >>> cache.positions[0, :6]  # each slot's position; -1: empty
    tensor([ 0,  1,  2,  3,  4, -1])
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from attention.checks import check_size
from attention.layer.tokens import Tokens

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    Made by
    [`MultiHeadAttention.init_cache`][attention.layer.spec.Specified.init_cache] on
    the module's device and dtype, with `num_kv_heads` heads (grouped-query attention shrinks it
    by `num_heads / num_kv_heads`) and, for a layer whose mask bounds how far back a query sees,
    as a ring buffer of `window + sinks` slots.

    Args:
        batch_size: sequences generated together.
        max_tokens: the most tokens it takes, prompt (and its padding) included; None for no
            limit (a ring buffer only).
        num_kv_heads: key/value heads.
        head_dim: width of each head's keys.
        value_dim: width of each head's values; default `head_dim` (latent attention keeps
            a RoPE key and a wider latent: [`attention.layer.latent`][attention.layer.latent]).
        window: how far back the layer's queries see (its mask's reach): keep only that.
        sinks: the first positions every query sees (its mask's anchor), kept for good.
        device: where to allocate it.
        dtype: the keys' and values' dtype.

    Attributes:
        keys: `(batch_size, num_kv_heads, slots, head_dim)` (a view of storage with one more,
            spare slot, that takes what a row does not keep: padding, a ring's overwritten
            tokens; never read).
        values: `(batch_size, num_kv_heads, slots, value_dim)`.
        positions: `(batch_size, slots)` int64, the position each slot holds (-1: empty).
        documents: `(batch_size, slots)` int64 document ids, once documents were given;
            else None.
        length: tokens each row has been given (padding included): the host's count.
        next: `(batch_size,)` int64, each row's next position (one past the largest it holds).
        filled: `(batch_size,)` int64, the slots each row has used (a linear cache's next free
            slot).
        contiguous: whether every row holds exactly positions `0 ... length - 1`, at slots
            `0 ... length - 1` (no padding, no positions given otherwise): the host's
            knowledge, which the planner's fast calls need.

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
        value_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("value_dim", head_dim if value_dim is None else value_dim),
        ):
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
        shape = (batch_size, num_kv_heads, slots + 1, head_dim)  # + 1: the spare slot
        self._k = torch.zeros(shape, device=device, dtype=dtype)
        width = head_dim if value_dim is None else value_dim
        self._v = torch.zeros((*shape[:3], width), device=device, dtype=dtype)
        self._pos = torch.full((batch_size, slots + 1), -1, dtype=torch.long, device=device)
        self._docs: Tensor | None = None
        self.next = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.filled = torch.zeros(batch_size, dtype=torch.long, device=device)
        self._slots = slots
        self._view()
        self.length = 0
        self.contiguous = True
        self.full = False  # inside static_steps: return every slot
        self.layout: tuple[object, ...] | None = None  # set by the layer that made it
        self.spoiled: str | None = None  # why a call left it half-done (`spoil`)
        self._layout: tuple[object, ...] | None = None  # `layout`, while spoiled

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
        return (self.keys.numel() + self.values.numel()) * self.keys.element_size()

    def reset(self) -> None:
        """Forget every token (the memory stays allocated); a spoiled cache is usable again."""
        if self.spoiled is not None:
            self.layout, self.spoiled = self._layout, None
        self.length, self.contiguous, self._docs = 0, True, None
        self._k, self._v = self._k.detach(), self._v.detach()  # drop old graphs
        self._pos.fill_(-1)
        self._view()
        self.next.zero_()
        self.filled.zero_()

    def spoil(self, error: BaseException, num_tokens: int) -> None:
        """Mark the cache unusable until `reset`: a call raised `error` after the cache took
        its chunk of `num_tokens` (a mask that failed at the new positions, say), so it holds
        a chunk no output was made for; its next use says so instead of reading it twice."""
        if self.spoiled is None:
            self._layout, self.layout = self.layout, None  # the layers' fast check fails
        self.spoiled = (
            f"a call raised {type(error).__name__} after the cache took its chunk "
            f"of {num_tokens} tokens"
        )

    @contextmanager
    def static_steps(self) -> Iterator[KVCache]:
        """Within it, `update` returns every slot (static shapes: a CUDA graph's step)."""
        self._leave_contiguous()
        self.full = True
        try:
            yield self
        finally:
            self.full = False

    def update(self, tokens: Tokens, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tokens]:
        """Store a chunk's keys and values at its positions; return every key it may need.

        Inner method: the layer checked the chunk against the cache.

        Args:
            tokens: the chunk's positions (-1: padding, not stored) and document ids.
            keys: the chunk's keys (already rotated, with RoPE), `(batch, h_kv, T, head_dim)`.
            values: likewise.

        Returns:
            `(keys, values, key_tokens)`: `(batch, h_kv, S, head_dim)` each, and the positions
            (and documents) of those `S` keys. Inside `static_steps`, `S` is every slot.
        """
        if keys.dtype != self._k.dtype:  # autocast: the cache keeps the module's dtype
            keys, values = keys.to(self._k.dtype), values.to(self._k.dtype)
        num_tokens, start = keys.shape[2], self.length
        plain = self.contiguous and tokens.start == start and tokens.docs is None
        if self.ring and not plain and tokens.docs is None and self._docs is None:
            self._check_order(tokens.pos)  # before anything changes
        if not plain:
            self._leave_contiguous()
        if tokens.docs is not None and self._docs is None:
            self._docs = torch.zeros_like(self._pos)
            self._view()
        chunk = None
        if self.ring and num_tokens > 1:  # its queries need what it overwrites: before writing
            chunk = (keys, values, tokens) if start == 0 else self._stored_and(tokens, keys, values)
        if plain and (not self.ring or num_tokens == 1):
            self._write_slice(start if not self.ring else int(self._slot_of(start)), keys, values)
        else:
            self._scatter(tokens, keys, values)
        self.length = start + num_tokens
        if chunk is not None:
            return chunk
        b, slots = keys.shape[0], self._slots  # used: `_used()`, inline (a decode step's call)
        every = self.full or (self.ring and not self.contiguous)
        used = slots if every else min(self.length, slots)
        if not self.contiguous:
            docs = None if self.documents is None else self.documents[:, :used]
            key_tokens = Tokens(b, used, keys.device, given=self.positions[:, :used], docs=docs)
        elif self.ring:  # the window a ring keeps of one sequence in order
            key_tokens = Tokens(b, used, keys.device, given=self.positions[:, :used], ring=True)
        else:  # keys 0 .. length - 1 in slot order
            key_tokens = Tokens(b, used, keys.device, start=0)
        return self.keys[:, :, :used], self.values[:, :, :used], key_tokens

    def _check_order(self, pos: Tensor) -> None:
        """A ring overwrites by position: each row's positions must grow from call to call
        (a lower one would take the slot of a key a later query needs). Skipped where values
        cannot steer Python (compiling, exporting, `meta`) and inside `static_steps`."""
        if self.full or pos.device.type == "meta":
            return
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            return
        low = torch.full_like(self.next, self.length) if self.contiguous else self.next
        behind = (pos >= 0) & (pos < low[:, None])
        if bool(behind.any()):
            row = int(behind.any(dim=1).nonzero()[0, 0])
            raise ValueError(
                f"positions: a ring-buffer cache (window={self.window}, sinks={self.sinks}) "
                f"keeps keys by position, so each row's positions must grow from call to call: "
                f"row {row} holds positions up to {int(low[row]) - 1}, got "
                f"{pos[row][behind[row]].tolist()[:8]}"
            )

    def _used(self) -> int:
        """The slots a query may need: those filled so far, in order; every slot inside
        `static_steps`, and of a ring whose positions were given (an offset or a gap puts a
        position at a slot past the count of tokens: `k + (p - k) mod w`). An empty slot holds
        position -1, which no query sees."""
        if self.full or (self.ring and not self.contiguous):
            return self._slots
        return min(self.length, self._slots)

    def _leave_contiguous(self) -> None:
        """Before the first update that sets rows apart: the device's counters made current."""
        if self.contiguous:
            self.next.fill_(self.length)
            self.filled.fill_(self.length)
            self.contiguous = False

    def _stored_and(
        self, tokens: Tokens, keys: Tensor, values: Tensor
    ) -> tuple[Tensor, Tensor, Tokens]:
        """A ring's chunk: the stored window and the chunk together (before it is written)."""
        used = self._used()
        pos = torch.cat((self.positions[:, :used], tokens.pos), dim=1)
        docs = None
        if self.documents is not None:
            chunk = (
                tokens.docs
                if tokens.docs is not None
                else tokens.pos.new_zeros(pos.shape[0], tokens.n)
            )
            docs = torch.cat((self.documents[:, :used], chunk), dim=1)
        return (
            torch.cat((self.keys[:, :, :used], keys), dim=2),
            torch.cat((self.values[:, :, :used], values), dim=2),
            Tokens(keys.shape[0], pos.shape[1], keys.device, given=pos, docs=docs),
        )

    def _write_slice(self, slot: int, keys: Tensor, values: Tensor) -> None:
        """Every row's chunk at slots `slot ...`: the contiguous case, one copy per tensor."""
        end, n = slot + keys.shape[2], keys.shape[2]
        if torch.is_grad_enabled():  # out of place: autograd keeps the earlier chunks' keys
            self._k = self._k.slice_scatter(keys, dim=2, start=slot, end=end)
            self._v = self._v.slice_scatter(values, dim=2, start=slot, end=end)
            self._view()
        else:
            self._k[:, :, slot:end] = keys
            self._v[:, :, slot:end] = values
        line = torch.arange(self.length, self.length + n, device=keys.device)
        self._pos[:, slot:end] = line

    def _scatter(self, tokens: Tokens, keys: Tensor, values: Tensor) -> None:
        """Each row's tokens at the slots their positions give; what is not kept to the spare."""
        pos = tokens.pos  # (b, T)
        real = pos >= 0
        if self.ring:
            last = pos.amax(dim=1, keepdim=True)  # each row's newest: keep its window and sinks
            keep = real & ((pos < self.sinks) | (pos > last - self.window))  # type: ignore[operator]
            slot = self._slot_of(pos.clamp(min=0))
        else:
            keep = real
            slot = self.filled[:, None] + real.long().cumsum(dim=1) - 1
        index = torch.where(keep, slot, self.slots)  # (b, T); the spare: self.slots
        wide = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        wide_v = index[:, None, :, None].expand(-1, values.shape[1], -1, values.shape[3])
        if torch.is_grad_enabled():
            self._k = self._k.scatter(2, wide, keys)
            self._v = self._v.scatter(2, wide_v, values)
            self._view()
        else:
            self._k.scatter_(2, wide, keys)
            self._v.scatter_(2, wide_v, values)
        self._pos.scatter_(1, index, pos)
        if self._docs is not None:
            docs = tokens.docs if tokens.docs is not None else torch.zeros_like(pos)
            self._docs.scatter_(1, index, docs)
        self._pos[:, self._slots] = -1  # the spare holds nothing a query sees
        self.filled += real.sum(dim=1)
        self.next.copy_(torch.maximum(self.next, pos.amax(dim=1) + 1))

    def _view(self) -> None:
        """The public tensors: views of the storage without its spare slot."""
        n = self._slots
        self.keys, self.values = self._k[:, :, :n], self._v[:, :, :n]
        self.positions = self._pos[:, :n]
        self.documents = None if self._docs is None else self._docs[:, :n]

    def _slot_of(self, position: Tensor | int) -> Tensor | int:
        """A ring's slot for a position: `p` for a sink, else `k + (p - k) mod w`."""
        assert self.window is not None
        if isinstance(position, int):
            k = self.sinks
            return position if position < k else k + (position - k) % self.window
        return torch.where(
            position < self.sinks, position, self.sinks + (position - self.sinks) % self.window
        )

    def __repr__(self) -> str:
        b, h_kv, _, d_h = self.keys.shape
        ring = f", window={self.window}, sinks={self.sinks}" if self.ring else ""
        d_v = self.values.shape[3]
        value = f", value_dim={d_v}" if d_v != d_h else ""
        return (
            f"KVCache(batch_size={b}, length={self.length}, slots={self.slots}, "
            f"num_kv_heads={h_kv}, head_dim={d_h}{value}{ring})"
        )
