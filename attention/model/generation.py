r"""Text from a [`GPTModel`][attention.model.gpt.GPTModel]: the book's loop, and the one users run.

[`generate_text_simple`][attention.model.generation.generate_text_simple] is the book's greedy
loop: every step runs the whole sequence again. [`generate`][attention.model.generation.generate] is
what a library offers on top of it:

- **a key/value cache** per block: the prompt runs once (prefill), then each step runs only
  the newest token (decode);
- **a batch of prompts of different lengths**:
  [`pad_prompts`][attention.model.generation.pad_prompts] pads them on the left and returns the
  `attention_mask` (1 = token, 0 = padding, Hugging Face's convention). No query attends to
  padding, and positions count each row's own tokens, from its first real one: padding changes no
  row's tokens;
- **choosing the next token** from the last position's logits $z$: greedy
  ($\arg\max_i z_i$), or a draw from $\operatorname{softmax}(z / \tau)$ at temperature
  $\tau$, among the `top_k` highest and the smallest set whose probability reaches `top_p`
  (nucleus sampling), with a `torch.Generator`, or one per row;
- **stops per row**: a row that writes one of the `eos_id`s has ended; it is padded with
  `pad_id` while the others go on, and generation stops when every row has ended;
- **eval mode** inside (no dropout), the model's own mode restored after;
- **streaming**: [`stream`][attention.model.generation.stream] yields each step's tokens as they
  come.

Examples:
    >>> from attention.model.gpt import GPTModel
    >>> cfg = {"vocab_size": 50, "context_length": 32, "emb_dim": 32, "n_heads": 4,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
    >>> _ = torch.manual_seed(0)
    >>> model = GPTModel(cfg)
    >>> idx, mask = pad_prompts([[1, 2, 3, 4], [5]])  # two prompts: 4 tokens and 1
    >>> out = generate(model, idx, max_new_tokens=5, attention_mask=mask)
    >>> out.shape  # (batch, 4 + 5): the padding stays in front of the short prompt
    torch.Size([2, 9])
    >>> alone = generate(model, torch.tensor([[5]]), max_new_tokens=5)
    >>> torch.equal(out[1, 3:], alone[0])  # the short prompt's tokens, as if alone
    True
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor, nn

from attention.checks import check_flag, check_ids, check_size
from attention.model.decode import StaticDecode, supports_static
from attention.model.gpt import GPTModel, check_attention_mask
from attention.model.sampling import Sampling, check_sampling

__all__ = ["generate", "generate_text_simple", "pad_prompts", "stream"]


def generate_text_simple(
    model: nn.Module, idx: Tensor, max_new_tokens: int, context_size: int
) -> Tensor:
    """The book's greedy loop: at every step, run the whole (cropped) sequence again.

    Args:
        model: returns logits `(batch, num_tokens, vocab_size)`.
        idx: token ids `(batch, num_tokens)`.
        max_new_tokens: tokens to add.
        context_size: the most tokens the model is given (the last ones).

    Returns:
        `idx` with `max_new_tokens` more tokens, `(batch, num_tokens + max_new_tokens)`.
    """
    check_size("max_new_tokens", max_new_tokens, minimum=0)
    check_size("context_size", context_size)
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]  # the last context_size tokens: (b, <= context)
        with torch.no_grad():
            logits = model(idx_cond)  # (b, T, vocab_size)
        logits = logits[:, -1, :]  # the last position's: (b, vocab_size)
        idx_next = torch.argmax(logits, dim=-1, keepdim=True)  # (b, 1)
        idx = torch.cat((idx, idx_next), dim=1)  # (b, T + 1)
    return idx


def pad_prompts(
    prompts: Sequence[Sequence[int] | Tensor], pad_id: int = 0
) -> tuple[Tensor, Tensor]:
    """Prompts of different lengths as one batch, padded on the left: `(idx, attention_mask)`.

    Left, so that every row's newest token is in the last column, where the next one is
    written.

    Args:
        prompts: token ids, one sequence (a list of ints or a 1-D tensor) per prompt, each
            with at least one token.
        pad_id: the id written into the padding (no query reads it).

    Returns:
        `idx`, int64 `(len(prompts), longest)`, and `attention_mask`, int64 of the same
        shape: 1 for a token, 0 for padding.

    Examples:
        >>> idx, attention_mask = pad_prompts([[5, 6, 7], [8]])
        >>> idx
        tensor([[5, 6, 7],
                [0, 0, 8]])
        >>> attention_mask
        tensor([[1, 1, 1],
                [0, 0, 1]])
    """
    if isinstance(prompts, Tensor | str) or not isinstance(prompts, Sequence) or not prompts:
        raise TypeError(
            f"prompts must be a non-empty list of token-id sequences, got {prompts!r:.60}"
        )
    check_size("pad_id", pad_id, minimum=0)
    rows = [check_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    for i, row in enumerate(rows):
        if row.ndim != 1 or row.numel() == 0:
            raise ValueError(
                f"prompts[{i}] must be a 1-D sequence of at least one token id, "
                f"got shape {tuple(row.shape)}"
            )
        if int(row.min()) < 0:
            raise ValueError(f"prompts[{i}] must hold ids >= 0, got {int(row.min())}")
    longest = max(row.numel() for row in rows)
    idx = torch.full((len(rows), longest), pad_id, dtype=torch.long, device=rows[0].device)
    attention_mask = torch.zeros_like(idx)
    for i, row in enumerate(rows):
        idx[i, longest - row.numel() :] = row
        attention_mask[i, longest - row.numel() :] = 1
    return idx, attention_mask


@dataclass(frozen=True)
class _Stops:
    """Which ids end a row, and what a row writes once it has ended."""

    eos: Tensor | None  # (n,) the end ids, or None: no row ends early
    pad_id: int

    def apply(self, token: Tensor, done: Tensor) -> Tensor:
        """Pad the rows that had ended; mark those that end now (in `done`, `(b, 1)`)."""
        if self.eos is None:
            return token
        token = token.masked_fill(done, self.pad_id)
        done |= torch.isin(token, self.eos)
        return token


class _Batch:
    """The growing sequences: their ids and attention mask, with room for the new tokens."""

    def __init__(self, idx: Tensor, mask: Tensor | None, max_new_tokens: int) -> None:
        b, n = idx.shape
        room = n + min(max_new_tokens, 256)  # grows by doubling: max_new_tokens may be huge
        self.ids = idx.new_empty(b, room)
        self.ids[:, :n] = idx
        self.mask = None if mask is None else mask.new_ones(b, room)
        if self.mask is not None and mask is not None:
            self.mask[:, :n] = mask
        self.length, self.limit = n, n + max_new_tokens

    def append(self, token: Tensor) -> None:
        if self.length == self.ids.shape[1]:  # full: twice the room, up to the limit
            more = min(self.ids.shape[1], self.limit - self.length)
            self.ids = torch.cat((self.ids, self.ids.new_empty(self.ids.shape[0], more)), dim=1)
            if self.mask is not None:
                self.mask = torch.cat(
                    (self.mask, self.mask.new_ones(self.mask.shape[0], more)), dim=1
                )
        self.ids[:, self.length : self.length + 1] = token
        self.length += 1

    def last(self, n: int) -> tuple[Tensor, Tensor | None]:
        """The last `n` tokens' ids and mask (the whole sequence if shorter)."""
        lo = max(0, self.length - n)
        mask = None if self.mask is None else self.mask[:, lo : self.length]
        return self.ids[:, lo : self.length], mask


_Step = TypeVar("_Step", "_Cached", "_Uncached")


def _in_eval_mode(
    step: Callable[[_Step, Tensor | None], Tensor],
) -> Callable[[_Step, Tensor | None], Tensor]:
    """Run a step without gradients, every module in eval mode; then give each its own mode.

    Per step, not per generation: between two steps (a stream waiting for its reader) the
    model is the caller's, in the modes the caller left it, and two streams of one model do
    not change each other's.
    """

    @functools.wraps(step)
    def run(self: _Step, token: Tensor | None) -> Tensor:
        training = [m for m in self.model.modules() if m.training]
        for module in training:
            module.training = False
        try:
            with torch.no_grad():
                return step(self, token)
        finally:
            for module in training:
                module.training = True

    return run


class _Uncached:
    """The book's step: the last `context_size` tokens again, every time."""

    def __init__(self, model: GPTModel, batch: _Batch, context_size: int) -> None:
        self.model, self.batch, self.context_size = model, batch, context_size

    @_in_eval_mode
    def __call__(self, token: Tensor | None) -> Tensor:
        ids, mask = self.batch.last(self.context_size)
        return self.model.logits(ids, attention_mask=mask, last_only=True)[:, -1]  # (b, vocab)


class _Cached:
    """Prefill once, then one token per step from a cache per block.

    A model that can run unbounded (RoPE and a window in every block, so ring buffers) goes
    on past its `context_length` with positions counting on, unless a smaller `context_size`
    was asked for; any other refills its caches with the last `context_size` tokens once they
    are full, as the uncached loop crops. With `static`, the decode steps between take the
    static step ([`StaticDecode`][attention.model.decode.StaticDecode]; on CUDA, one graph).
    """

    def __init__(self, model: GPTModel, batch: _Batch, context_size: int, static: bool) -> None:
        self.model, self.batch, self.context_size = model, batch, context_size
        self.caches = model.init_caches(batch.ids.shape[0], context_size)
        self.unbounded = model.unbounded and context_size == model.context_length
        self.static = static
        self.decoder: StaticDecode | None = None

    @_in_eval_mode
    def __call__(self, token: Tensor | None) -> Tensor:
        full = self.caches[0].length == self.context_size
        if token is None or (full and not self.unbounded):  # prefill, or refill
            self.decoder = None
            for cache in self.caches:
                cache.reset()
            limit = self.batch.length if self.unbounded else self.context_size
            ids, mask = self.batch.last(limit)
            for lo in range(0, ids.shape[1], self.model.context_length):  # each call fits
                hi = lo + self.model.context_length
                logits = self.model.logits(
                    ids[:, lo:hi],
                    self.caches,
                    last_only=True,
                    attention_mask=None if mask is None else mask[:, lo:hi],
                )
            return logits[:, -1]  # (b, vocab)
        if self.static:  # decode, static shapes, until the caches are full (then: refill)
            if self.decoder is None:
                self.decoder = StaticDecode(self.model, self.caches)
            return self.decoder(token)
        return self.model.logits(token, self.caches)[:, -1]  # decode: (b, vocab)


def generate(
    model: GPTModel,
    idx: Tensor,
    max_new_tokens: int,
    context_size: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    eos_id: int | Sequence[int] | None = None,
    use_cache: bool = True,
    *,
    attention_mask: Tensor | None = None,
    top_p: float | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    pad_id: int | None = None,
    static: bool | None = None,
) -> Tensor:
    """Write up to `max_new_tokens` tokens after each prompt: greedy, or sampled; cached.

    The book's arguments come first, in its order; the rest are keywords. With `use_cache`,
    the prompt runs once and every later step runs only the newest token, reading the
    earlier tokens' keys and values from a cache per block. Once a sequence outgrows
    `context_size`, each step must re-read the last `context_size` tokens from their
    positions 0 on, as the uncached loop does, so the cache is refilled. Both ways give the
    same tokens (greedy) or the same distribution (sampled). A model with RoPE and a window
    in every block ([`unbounded`][attention.model.gpt.GPTModel.unbounded]) instead goes on past
    `context_length` in constant memory (ring buffers of the window, positions counting on),
    unless `context_size` is smaller. Without the cache such a model is given the last
    `context_size` tokens from position 0, as any other: past `context_length`, a model
    whose blocks keep sinks then writes other tokens than with the cache (its sinks are the
    cropped text's first tokens, not the sequence's); with windows alone, the same.

    Each step runs in eval mode (no dropout); between steps, every module has its own mode
    back.

    Args:
        model: a `GPTModel`.
        idx: the prompts' token ids, `(batch, num_tokens)`, left-padded where they differ
            in length ([`pad_prompts`][attention.model.generation.pad_prompts]).
        max_new_tokens: the most tokens to add.
        context_size: the most tokens the model is given; default its `context_length`.
        temperature: 0 for greedy; above 0, sample from `softmax(logits / temperature)`
            (below the logits' dtype's smallest normal number, greedy).
        top_k: sample among the `top_k` most likely tokens only (all, if it is larger).
        eos_id: an id, or several, that end a row (the id is written, then padding).
        use_cache: keep keys and values instead of recomputing them.
        attention_mask: `(batch, num_tokens)`, 1 (or True) for a token, 0 for padding, the
            padding before each row's tokens; default all tokens.
        top_p: sample from the most likely tokens whose probability first reaches `top_p`,
            in `(0, 1]`.
        generator: a `torch.Generator` for the draws, or one per row (a row then draws as it
            would alone); default torch's global one.
        pad_id: what a row writes after it has ended; default the first `eos_id`.
        static: decode steps with static shapes
            ([`attention.model.decode`][attention.model.decode]), recorded in one CUDA graph
            and replayed on CUDA; default on CUDA (where the model allows it), off elsewhere.
            The same tokens either way (greedy, or sampled with the same generator), up to
            the float rounding of a kernel over more slots.

    Returns:
        `(batch, num_tokens + new)`, `new <= max_new_tokens`: `new` is less only when every
        row has ended.

    Raises:
        TypeError: `model` is not a `GPTModel`, or an argument of the wrong type.
        ValueError: an argument out of range, named in the message.
    """
    ids, tokens = _prepare(
        model,
        idx,
        max_new_tokens,
        context_size,
        temperature,
        top_k,
        eos_id,
        use_cache,
        attention_mask,
        top_p,
        generator,
        pad_id,
        static,
    )
    new = list(tokens)
    return torch.cat([ids, *new], dim=1) if new else ids


def stream(
    model: GPTModel,
    idx: Tensor,
    max_new_tokens: int,
    context_size: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    eos_id: int | Sequence[int] | None = None,
    use_cache: bool = True,
    *,
    attention_mask: Tensor | None = None,
    top_p: float | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    pad_id: int | None = None,
    static: bool | None = None,
) -> Iterator[Tensor]:
    """[`generate`][attention.model.generation.generate], yielding each step's tokens as they come.

    Takes `generate`'s arguments and checks them all at the call, before the first token.
    The model is in eval mode until the stream ends (or is closed).

    Yields:
        The next token of every row, `(batch, 1)`.

    Examples:
        >>> from attention.model.gpt import GPTModel
        >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 16, "n_heads": 2,
        ...        "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False}
        >>> _ = torch.manual_seed(0)
        >>> model = GPTModel(cfg)
        >>> prompt = torch.tensor([[1, 2, 3]])
        >>> tokens = [token for token in stream(model, prompt, max_new_tokens=4)]
        >>> tokens[0].shape  # (batch, 1), one per step
        torch.Size([1, 1])
        >>> torch.equal(torch.cat([prompt, *tokens], 1), generate(model, prompt, 4))
        True
    """
    return _prepare(
        model,
        idx,
        max_new_tokens,
        context_size,
        temperature,
        top_k,
        eos_id,
        use_cache,
        attention_mask,
        top_p,
        generator,
        pad_id,
        static,
    )[1]


def _prepare(
    model: GPTModel,
    idx: object,
    max_new_tokens: int,
    context_size: int | None,
    temperature: object,
    top_k: object,
    eos_id: object,
    use_cache: object,
    attention_mask: object,
    top_p: object,
    generator: object,
    pad_id: object,
    static: object = None,
) -> tuple[Tensor, Iterator[Tensor]]:
    """Check every argument, by name; return the prompt ids and the (not yet started) loop."""
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a GPTModel, got {type(model).__name__}")
    ids = _check_prompt(model, idx)
    mask = _check_mask(model, attention_mask, ids)
    max_new_tokens = check_size("max_new_tokens", max_new_tokens, minimum=0)
    context_size = model.context_length if context_size is None else context_size
    context_size = check_size("context_size", context_size)
    sampling = check_sampling(model, ids.shape[0], temperature, top_k, top_p, generator)
    stops = _check_stops(model, eos_id, pad_id)
    check_flag("use_cache", use_cache)
    static = _check_static(model, static)
    if max_new_tokens == 0 or ids.shape[0] == 0:  # nothing to write, or no row to write to
        return ids, iter(())
    batch = _Batch(ids, mask, max_new_tokens)
    context_size = min(context_size, model.context_length)
    step: _Cached | _Uncached = (
        _Cached(model, batch, context_size, static)
        if use_cache
        else _Uncached(model, batch, context_size)
    )
    return ids, _run(model, batch, max_new_tokens, step, sampling, stops)


def _check_static(model: GPTModel, static: object) -> bool:
    """`static`, or its default: on CUDA where every layer allows it."""
    if static is None:
        return model.tok_emb.weight.device.type == "cuda" and supports_static(model)
    check_flag("static", static)
    if static and not supports_static(model):
        raise ValueError(
            "static=True: this model has a linear-attention layer (its state "
            "has no static step) or, on CUDA, a score modifier without an "
            "additive form (a soft cap), which takes FlexAttention, not a CUDA "
            "graph; pass static=False"
        )
    return bool(static)


def _run(
    model: GPTModel,
    batch: _Batch,
    max_new_tokens: int,
    step: _Cached | _Uncached,
    sampling: Sampling,
    stops: _Stops,
) -> Iterator[Tensor]:
    """The loop: logits, choose, append, yield; until the limit or every row has ended.

    With end ids, reading whether every row has ended is the one host synchronisation of a
    step (none without them).
    """
    logits = step(None)  # (b, vocab): after the prompt
    done = torch.zeros(batch.ids.shape[0], 1, dtype=torch.bool, device=batch.ids.device)
    for i in range(max_new_tokens):
        token = stops.apply(sampling.next_token(logits), done)  # (b, 1)
        batch.append(token)
        yield token
        if i == max_new_tokens - 1 or (stops.eos is not None and bool(done.all())):
            return
        logits = step(token)


def _check_prompt(model: GPTModel, idx: object) -> Tensor:
    ids = check_ids(idx, "idx", model.vocab_size, device=model.tok_emb.weight.device)
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise ValueError(
            "idx must be (batch, num_tokens) with at least one token, got shape "
            f"{tuple(ids.shape)}" + (" (one prompt: idx[None])" if ids.ndim == 1 else "")
        )
    return ids


def _check_mask(model: GPTModel, attention_mask: object, ids: Tensor) -> Tensor | None:
    """The mask, or None where it marks no padding; refused unless the padding is on the left."""
    if attention_mask is None:
        return None
    mask = check_attention_mask(attention_mask, ids.shape, ids.device)
    if not ids.numel() or bool(mask.all()):
        return None
    if not bool((mask[:, 1:] >= mask[:, :-1]).all() and mask[:, -1].all()):
        raise ValueError(
            "attention_mask must pad on the left: each row's 0s before its 1s, and a token in "
            "the last column (pad_prompts makes such a batch); the window generate crops to "
            "counts columns, so padding between tokens would shorten a row's context"
        )
    return mask


def _check_stops(model: GPTModel, eos_id: object, pad_id: object) -> _Stops:
    device = model.tok_emb.weight.device
    if isinstance(eos_id, Tensor) and not eos_id.is_floating_point() and eos_id.ndim <= 1:
        eos_id = eos_id.tolist()
    if eos_id is None:
        ends: list[int] = []
    elif isinstance(eos_id, Sequence) and not isinstance(eos_id, str | bytes):
        ends = [_check_vocab_id(model, "eos_id", i) for i in eos_id]
    else:
        ends = [_check_vocab_id(model, "eos_id", eos_id)]
    if pad_id is not None:
        pad_id = _check_vocab_id(model, "pad_id", pad_id)
    eos = torch.tensor(ends, dtype=torch.long, device=device) if ends else None
    return _Stops(eos, pad_id if pad_id is not None else (ends[0] if ends else 0))


def _check_vocab_id(model: GPTModel, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = "an int, or a list of ints" if name == "eos_id" else "an int"
        raise TypeError(f"{name} must be a token id ({kind}), got {value!r:.40}")
    value = int(value)
    if not 0 <= value < model.vocab_size:
        raise ValueError(
            f"{name} must be in 0 .. {model.vocab_size - 1} (vocab_size="
            f"{model.vocab_size}), got {value}"
        )
    return value
