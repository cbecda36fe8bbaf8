r"""The book's GPT (chapter 4) on this package's attention, and text generation (chapter 5).

`GPTModel(cfg)` keeps the book's names, configuration keys and creation order, so under the
same seed it holds the book's weights and prints the book's numbers. Each
`TransformerBlock` is

$$
x \leftarrow x + \operatorname{drop}(\operatorname{Attention}(\operatorname{LN}_1(x))),
\qquad
x \leftarrow x + \operatorname{drop}(\operatorname{FeedForward}(\operatorname{LN}_2(x))),
$$

and its attention is the production
[`MultiHeadAttention`][attention.multihead.MultiHeadAttention]. Three optional keys make a
current model of it: `n_kv_heads` (grouped-query attention), `rope_base` (rotary positions
instead of the learned position embedding) and `window` (a sliding window).

[`generate`][attention.gpt.generate] writes text with the book's greedy, temperature and top-k
sampling, through a key/value cache per layer ([`attention.cache`][attention.cache]).

Examples:
    >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
    >>> _ = torch.manual_seed(0)
    >>> model = GPTModel(cfg).eval()
    >>> prompt = torch.tensor([[1, 2, 3]])  # (batch, num_tokens)
    >>> model(prompt).shape  # (batch, num_tokens, vocab_size): a score for every next token
    torch.Size([1, 3, 50])
    >>> out = generate(model, prompt, max_new_tokens=4)  # greedy, cached
    >>> torch.equal(out, generate(model, prompt, max_new_tokens=4, use_cache=False))
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.cache import KVCache
from attention.checks import check_dropout, check_flag, check_ids, check_size
from attention.multihead import MultiHeadAttention

__all__ = [
    "GELU",
    "GPT_CONFIG_124M",
    "FeedForward",
    "GPTModel",
    "LayerNorm",
    "TransformerBlock",
    "generate",
    "generate_text_simple",
]

GPT_CONFIG_124M: dict[str, Any] = {
    "vocab_size": 50257,  # the GPT-2 tokenizer's vocabulary
    "context_length": 1024,  # the longest sequence
    "emb_dim": 768,  # d_model
    "n_heads": 12,
    "n_layers": 12,
    "drop_rate": 0.1,
    "qkv_bias": False,
}
"""The book's configuration of the smallest GPT-2 (163 million parameters, untied output)."""

_REQUIRED = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "drop_rate",
             "qkv_bias")  # fmt: skip
_OPTIONAL = ("n_kv_heads", "rope_base", "window", "sinks")


def _check_config(cfg: Mapping[str, Any]) -> None:
    if not isinstance(cfg, Mapping):
        raise TypeError(f"cfg must be a dict of the book's keys, got {type(cfg).__name__}")
    missing = [key for key in _REQUIRED if key not in cfg]
    unknown = [key for key in cfg if key not in _REQUIRED + _OPTIONAL]
    if missing or unknown:
        raise ValueError(
            f"cfg needs the keys {', '.join(_REQUIRED)} (optional: {', '.join(_OPTIONAL)}): "
            f"missing {missing}, unknown {unknown}"
        )
    for key in ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"):
        check_size(key, cfg[key])
    check_dropout(cfg["drop_rate"], "drop_rate")
    check_flag("qkv_bias", cfg["qkv_bias"])


class LayerNorm(nn.Module):
    r"""Layer normalisation over the last dimension, as in the book:
    $\text{scale} \cdot (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \text{shift}$.

    Args:
        emb_dim: the width normalised.
    """

    def __init__(self, emb_dim: int) -> None:
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x: Tensor) -> Tensor:
        # the formula above in one fused kernel (the book writes mean, var, sqrt out: the same
        # numbers to rounding, five kernels and their temporaries)
        return F.layer_norm(x, x.shape[-1:], self.scale, self.shift, self.eps)


class GELU(nn.Module):
    r"""GELU, in GPT-2's tanh approximation:
    $\tfrac12 x \left(1 + \tanh\!\left(\sqrt{2/\pi}\,(x + 0.044715\, x^3)\right)\right)$."""

    def forward(self, x: Tensor) -> Tensor:
        # the formula above, as torch's one kernel computes it (approximate="tanh")
        return F.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    """`emb_dim -> 4 emb_dim -> GELU -> emb_dim`, applied to each token on its own."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]),
            GELU(),
            nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"]),
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.layers(x)
        return out


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward, each with a shortcut (residual) connection.

    The model checks its inputs once, so the block calls its attention's
    [`attend`][attention.multihead.MultiHeadAttention.attend] (the forward without the
    checks): a forward hook on `att` itself does not fire inside a `GPTModel`; hook its
    projections (`att.W_query`, `att.out_proj`) or `norm1`, whose output is what it reads.

    Attributes:
        att: the block's `MultiHeadAttention` (causal; the config's heads, window and RoPE).
        ff: its `FeedForward`.
        norm1: `LayerNorm` before the attention.
        norm2: `LayerNorm` before the feed-forward.
        drop_shortcut: dropout on each branch before it is added back.
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        rope_base = cfg.get("rope_base")
        self.att = MultiHeadAttention(
            d_in=cfg["emb_dim"], d_out=cfg["emb_dim"], context_length=cfg["context_length"],
            num_heads=cfg["n_heads"], dropout=cfg["drop_rate"], qkv_bias=cfg["qkv_bias"],
            num_kv_heads=cfg.get("n_kv_heads"), window=cfg.get("window"),
            rope=rope_base is not None, rope_base=10000.0 if rope_base is None else rope_base,
            sinks=cfg.get("sinks", 0),
        )  # fmt: skip
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x: Tensor, cache: KVCache | None = None) -> Tensor:
        """`(b, T, emb_dim)` -> `(b, T, emb_dim)`; the model checked `x` and `cache`."""
        shortcut = x
        x = self.att.attend(self.norm1(x), cache)[0]  # (b, T, emb_dim)
        if self.training:  # dropout is the identity in eval: a decode step skips the call
            x = self.drop_shortcut(x)
        x = x + shortcut
        shortcut = x
        x = self.ff(self.norm2(x))  # (b, T, emb_dim)
        if self.training:
            x = self.drop_shortcut(x)
        return x + shortcut


class GPTModel(nn.Module):
    """The book's GPT: embeddings, `n_layers` transformer blocks, a final norm, the vocabulary head.

    Args:
        cfg: the book's keys (see [`GPT_CONFIG_124M`][attention.gpt.GPT_CONFIG_124M]), and
            optionally `n_kv_heads`, `rope_base` (a float: RoPE in every block instead of
            `pos_emb`, which is then not created) and `window`.

    Attributes:
        tok_emb: `nn.Embedding(vocab_size, emb_dim)`, created first.
        pos_emb: `nn.Embedding(context_length, emb_dim)`, or None with `rope_base`.
        drop_emb: dropout on the embeddings.
        trf_blocks: `nn.Sequential` of `n_layers` `TransformerBlock`s.
        final_norm: the last `LayerNorm`.
        out_head: `nn.Linear(emb_dim, vocab_size, bias=False)`, created last.

    Raises:
        TypeError: `cfg` is not a mapping, or a value of the wrong type.
        ValueError: a missing or unknown key, or a value out of range.
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        _check_config(cfg)
        self.context_length = cfg["context_length"]
        self.vocab_size = cfg["vocab_size"]
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = (
            None if cfg.get("rope_base") is not None
            else nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        )  # fmt: skip
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                _store_transposed(module)

    def forward(self, in_idx: Tensor, caches: list[KVCache] | None = None) -> Tensor:
        """Logits for the token after each position: `(batch, num_tokens, vocab_size)`.

        Checks the ids and the caches, then runs [`logits`][attention.gpt.GPTModel.logits].

        Args:
            in_idx: token ids, `(batch, num_tokens)`.
            caches: one [`KVCache`][attention.cache.KVCache] per block, from
                [`init_caches`][attention.gpt.GPTModel.init_caches]: `in_idx` continues the
                sequences they hold (positions continue from their length).
        """
        check_ids(in_idx, "in_idx", self.vocab_size, device=self.tok_emb.weight.device)
        if in_idx.ndim != 2:
            raise ValueError(f"in_idx must be (batch, num_tokens), got {tuple(in_idx.shape)}")
        self._check_caches(caches, in_idx.shape[1])
        if caches is not None and caches[0].batch_size != in_idx.shape[0]:
            raise ValueError(f"caches were made for batch_size={caches[0].batch_size}, got a "
                             f"batch of {in_idx.shape[0]}")  # fmt: skip
        return self.logits(in_idx, caches)

    def _check_caches(self, caches: list[KVCache] | None, num_tokens: int) -> None:
        if caches is None:
            if num_tokens > self.context_length:
                raise ValueError(f"0 cached + {num_tokens} new tokens is longer than "
                                 f"context_length={self.context_length}")  # fmt: skip
            return
        blocks: list[TransformerBlock] = list(self.trf_blocks)  # type: ignore[arg-type]
        if not isinstance(caches, list | tuple) or len(caches) != len(blocks):
            raise ValueError(f"caches must be a list of one KVCache per block ({len(blocks)}), "
                             f"got {caches!r:.60}")  # fmt: skip
        if not all(isinstance(cache, KVCache) for cache in caches):
            kinds = [type(cache).__name__ for cache in caches]
            raise TypeError(
                f"caches must hold one KVCache per block (from init_caches), got {kinds}"
            )
        if len({id(cache) for cache in caches}) != len(caches):
            raise ValueError("caches must be distinct KVCache objects, one per block (from "
                             "init_caches); got the same cache for several blocks")  # fmt: skip
        for block, cache in zip(blocks, caches, strict=True):
            block.att.check_cache(cache, caches[0].batch_size, num_tokens)
        start = caches[0].length
        if any(cache.length != start for cache in caches):
            raise ValueError("caches must hold the same tokens: one sequence per row, every "
                             f"block; got lengths {[c.length for c in caches]}")  # fmt: skip
        if not self.unbounded and start + num_tokens > self.context_length:
            raise ValueError(
                f"{start} cached + {num_tokens} new tokens is longer than "
                f"context_length={self.context_length}"
            )

    def embed(self, in_idx: Tensor, start: int = 0) -> Tensor:
        """Token embeddings, plus the position embeddings of `start ...` (without RoPE)."""
        x: Tensor = self.tok_emb(in_idx)  # (b, T, emb_dim)
        if self.pos_emb is not None:  # positions start..start+T-1 (after the cached tokens)
            num_tokens = in_idx.shape[1]
            x = x + self.pos_emb.weight[start : start + num_tokens]
        if self.training:  # dropout is the identity in eval: a decode step skips the call
            x = self.drop_emb(x)
        return x

    def logits(
        self, in_idx: Tensor, caches: list[KVCache] | None = None, *, last_only: bool = False
    ) -> Tensor:
        """The forward's computation, without its checks (for `generate`, and compiling).

        Args:
            in_idx: token ids, `(batch, num_tokens)`.
            caches: one cache per block, or None.
            last_only: the vocabulary head at the last position only, `(batch, 1,
                vocab_size)`: all a prefill needs of its logits.
        """
        start = 0 if caches is None else caches[0].length
        x = self.embed(in_idx, start)  # (b, T, emb_dim)
        for i, block in enumerate(self.trf_blocks):
            x = block(x, None if caches is None else caches[i])  # (b, T, emb_dim)
        if last_only:
            x = x[:, -1:]  # (b, 1, emb_dim)
        logits: Tensor = self.out_head(self.final_norm(x))  # (b, T, vocab_size)
        return logits

    def init_caches(self, batch_size: int, max_tokens: int | None = None) -> list[KVCache]:
        """One empty key/value cache per block, for `batch_size` sequences of `max_tokens`.

        A block with a window gets a ring buffer of its window (and sinks), whatever
        `max_tokens`; the others a linear cache of `max_tokens` (default `context_length`).
        """
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
        blocks: list[TransformerBlock] = list(self.trf_blocks)  # type: ignore[arg-type]
        return [block.att.init_cache(batch_size, None if block.att.window is not None
                                     else max_tokens) for block in blocks]  # fmt: skip

    @property
    def unbounded(self) -> bool:
        """Whether it can generate forever: RoPE and a window in every block (ring buffers)."""
        blocks: list[TransformerBlock] = list(self.trf_blocks)  # type: ignore[arg-type]
        return self.pos_emb is None and all(block.att.window is not None for block in blocks)


def _store_transposed(linear: nn.Linear) -> None:
    """Keep `linear.weight`'s values, shape and name, but lay it out `(in, out)` in memory.

    A batch-1 decode step multiplies each weight by one vector; over the `(out, in)` layout
    `nn.Linear` allocates, that product streams memory at about half the rate it reaches over
    `(in, out)` (GPT-2's own `Conv1D` layout; measured on the Performance page). The
    parameter stays an `(out, in)` tensor (a transposed view), so the `state_dict`, the
    book's seeded values, `load_state_dict` and `.to()` are unchanged.
    """
    weight = linear.weight
    linear.weight = nn.Parameter(weight.detach().t().contiguous().t(), weight.requires_grad)


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


def _next_token(logits: Tensor, temperature: float, top_k: int | None) -> Tensor:
    """The book's chapter-5 choice: keep the top k, divide by the temperature, sample."""
    if top_k is not None:
        top_logits, _ = torch.topk(logits, top_k)  # (b, k)
        logits = logits.masked_fill(logits < top_logits[:, -1:], float("-inf"))
    if temperature > 0.0:
        # subtract the max first: a tiny temperature then gives 0 and -inf, never inf - inf
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = torch.softmax(logits / temperature, dim=-1)  # (b, vocab_size)
        return torch.multinomial(probs, num_samples=1)  # (b, 1)
    return torch.argmax(logits, dim=-1, keepdim=True)  # (b, 1): greedy


def generate(
    model: GPTModel,
    idx: Tensor,
    max_new_tokens: int,
    context_size: int | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    eos_id: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Write up to `max_new_tokens` tokens after `idx`: greedy, or sampled; cached by default.

    With `use_cache`, the prompt runs once (prefill, computing the vocabulary head at its last
    position only) and every later step runs only the newest token (decode), reading the
    earlier tokens' keys and values from a cache per block. Once the sequence outgrows
    `context_size`, each step must re-read the last `context_size` tokens from their positions
    0 on, as the uncached loop does, so the cache is refilled. Both ways give the same tokens
    (greedy) or the same distribution (sampled).

    A model with RoPE and a window in every block ([`unbounded`][attention.gpt.GPTModel.unbounded])
    instead goes on past `context_length` in constant memory: its caches are ring buffers of
    the window, positions count on, and nothing is refilled. That equals running the whole
    sequence at once (a longer prompt is prefilled in chunks of `context_length`); the
    uncached loop still crops to `context_size`, as the book's does.

    Args:
        model: a `GPTModel`.
        idx: the prompt's token ids, `(batch, num_tokens)`.
        max_new_tokens: the most tokens to add.
        context_size: the most tokens the model is given; default its `context_length`.
        temperature: 0 for greedy; above 0, sample from `softmax(logits / temperature)`.
        top_k: sample among the `top_k` most likely tokens only.
        eos_id: stop when every sequence's next token is this id (it is not appended). A
            sequence that finished earlier is padded with it.
        use_cache: keep keys and values instead of recomputing them.

    Returns:
        `(batch, num_tokens + new)`, `new <= max_new_tokens`.

    Raises:
        TypeError: `model` is not a `GPTModel`.
        ValueError: a bad count, temperature or top_k.
    """
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a GPTModel, got {type(model).__name__}")
    idx = check_ids(idx, "idx", model.vocab_size, device=model.tok_emb.weight.device)
    if idx.ndim != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must be (batch, num_tokens) with a token, got {tuple(idx.shape)}")
    check_size("max_new_tokens", max_new_tokens, minimum=0)
    context_size = model.context_length if context_size is None else context_size
    check_size("context_size", context_size)
    if not (isinstance(temperature, int | float) and temperature >= 0.0):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if isinstance(temperature, bool) or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        check_size("top_k", top_k)
        if top_k > model.vocab_size:
            raise ValueError(f"top_k must be <= vocab_size={model.vocab_size}, got {top_k}")
    check_flag("use_cache", use_cache)
    if eos_id is not None:
        check_size("eos_id", eos_id, minimum=0)
        if eos_id >= model.vocab_size:
            raise ValueError(f"eos_id must be in 0 .. {model.vocab_size - 1} (vocab_size="
                             f"{model.vocab_size}), got {eos_id}")  # fmt: skip
    context_size = min(context_size, model.context_length)
    with torch.no_grad():
        if max_new_tokens == 0 or idx.shape[0] == 0:  # nothing to write, or no row to write to
            return idx
        if not use_cache:
            return _generate_uncached(model, idx, max_new_tokens, context_size,
                                      (temperature, top_k, eos_id))  # fmt: skip
        return _generate_cached(model, idx, max_new_tokens, context_size,
                                (temperature, top_k, eos_id))  # fmt: skip


_Sampling = tuple[float, int | None, int | None]  # temperature, top_k, eos_id


def _generate_uncached(
    model: GPTModel, idx: Tensor, max_new_tokens: int, context_size: int, sampling: _Sampling
) -> Tensor:
    """The book's loop: every step runs the last `context_size` tokens again."""
    done = torch.zeros(idx.shape[0], 1, dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        logits = model.logits(idx[:, -context_size:], last_only=True)[:, -1]  # (b, vocab)
        idx_next = _choose(logits, sampling, done)  # (b, 1), or None: every row has ended
        if idx_next is None:
            break
        idx = torch.cat((idx, idx_next), dim=1)  # (b, T + 1)
    return idx


def _generate_cached(
    model: GPTModel, idx: Tensor, max_new_tokens: int, context_size: int, sampling: _Sampling
) -> Tensor:
    """Prefill once, then one token per step from the caches.

    A model that can run unbounded (RoPE and a window in every block, so ring buffers) goes on
    past `context_size` with positions counting on; any other refills its caches with the last
    `context_size` tokens once they are full, as the uncached loop crops.
    """
    b, n = idx.shape
    out = idx.new_empty(b, n + min(max_new_tokens, 256))  # the prompt, room for new tokens
    out[:, :n] = idx
    caches = model.init_caches(b, context_size)
    unbounded = model.unbounded
    start = 0 if unbounded else max(0, n - context_size)  # the tokens the model is given
    for part in out[:, start:n].split(model.context_length, dim=1):  # each call fits
        logits = model.logits(part, caches, last_only=True)
    done = torch.zeros(b, 1, dtype=torch.bool, device=idx.device)
    length = n
    for _ in range(max_new_tokens):
        idx_next = _choose(logits[:, -1], sampling, done)  # (b, 1)
        if idx_next is None:
            break
        if length == out.shape[1]:  # full: twice the room (eos_id may stop it long before)
            more = min(out.shape[1], n + max_new_tokens - length)
            out = torch.cat((out, out.new_empty(b, more)), dim=1)
        out[:, length : length + 1] = idx_next
        length += 1
        if length == n + max_new_tokens:
            break
        if not unbounded and caches[0].length == context_size:  # full: refill it
            for cache in caches:
                cache.reset()
            logits = model.logits(out[:, length - context_size : length], caches, last_only=True)
        else:
            logits = model.logits(idx_next, caches)  # decode: (b, 1, vocab)
    return out[:, :length]


def _choose(logits: Tensor, sampling: _Sampling, done: Tensor) -> Tensor | None:
    """The next token of each row, `(b, 1)`; None once every row has reached `eos_id`.

    With `eos_id`, a row that has ended is padded with it; reading whether all have ended is
    the one host synchronisation of a step (none without `eos_id`).
    """
    temperature, top_k, eos_id = sampling
    idx_next = _next_token(logits, temperature, top_k)  # (b, 1)
    if eos_id is None:
        return idx_next
    idx_next = idx_next.masked_fill(done, eos_id)
    done |= idx_next == eos_id
    if bool(done.all()):
        return None
    return idx_next
