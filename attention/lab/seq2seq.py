r"""Cross-attention: a small transformer encoder-decoder, trained on chapter 1's copy task.

The transformer of *Attention Is All You Need* translates with two stacks. The **encoder**
reads the input $x_1 \dots x_n$ with self-attention that sees the whole sequence
(`causal=False`) and returns one vector per input token, the *memory* $M$. The **decoder**
writes the output one token at a time; each of its blocks runs causal self-attention over
what it has written, then **cross-attention**: its queries come from the decoder, its keys and
values from the memory,

$$
Q = X_\text{dec} W_q, \quad K = M W_k, \quad V = M W_v,
$$

$$
\operatorname{CrossAttention} = \operatorname{softmax}\!\left(
\frac{Q K^\top}{\sqrt{d_h}}\right) V ,
$$

per head, with no causal mask: the input is known in full before the first output token is
written, so every output step may read every input position (only the input's padding is
hidden). It is Bahdanau's attention of chapter 1 ([`attention.lab.rnn`][attention.lab.rnn]) with a
scaled dot product for the score and the recurrence gone.

[`Seq2SeqTransformer`][attention.lab.seq2seq.Seq2SeqTransformer] builds it from the package's
own pieces: [`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention] (causal, and
`causal=False` called with `key=memory`), [`attention.model.gpt`][attention.model.gpt]'s
`LayerNorm` and `FeedForward`, and
[`sinusoidal_positions`][attention.layer.positions.sinusoidal_positions]. Its greedy
[`generate`][attention.lab.seq2seq.Seq2SeqTransformer.generate] keeps two caches per decoder
block: the self-attention's keys and values, one more per step, and the cross-attention's keys
and values of the memory, computed once.
[`transformer_experiment`][attention.lab.seq2seq.transformer_experiment] trains it on the batches
chapter 1's models see ([`attention.lab.copy_task`][attention.lab.copy_task]).

Examples:
    >>> _ = torch.manual_seed(0)
    >>> model = Seq2SeqTransformer(vocab_size=20, d_model=16, num_heads=2)
    >>> src = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])  # "abcd", "efgh": (batch, n)
    >>> tgt_in = decoder_inputs(src, bos=model.bos)  # teacher forcing: (batch, m)
    >>> logits, cross_weights = model(src, tgt_in, need_weights=True)
    >>> logits.shape  # (batch, m, vocab_size)
    torch.Size([2, 4, 20])
    >>> cross_weights[0].shape  # layer 0: (batch, num_heads, m, n)
    torch.Size([2, 2, 4, 4])
    >>> model.generate(src).shape  # greedy, cached: (batch, n); untrained, so noise
    torch.Size([2, 4])
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import cast

import torch
from torch import Tensor, nn

from attention.checks import (
    check_flag,
    check_ids,
    check_input,
    check_padding_mask,
    check_size,
    check_tensor,
)
from attention.lab.copy_task import (
    MAX_LEN,
    MIN_LEN,
    VOCAB_SIZE,
    copy_batch,
    token_letters,
    train_and_test,
)
from attention.lab.rnn import decoder_inputs
from attention.lab.threads import torch_threads
from attention.layer.cache import KVCache
from attention.layer.multihead import MultiHeadAttention
from attention.layer.positions import sinusoidal_positions
from attention.model.gpt import FeedForward, LayerNorm

__all__ = [
    "DecoderBlock",
    "EncoderBlock",
    "Seq2SeqTransformer",
    "TransformerResult",
    "transformer_experiment",
]

Caches = list[tuple[KVCache, KVCache]]
"""Per decoder block: its self-attention's cache and its cross-attention's cache."""


class EncoderBlock(nn.Module):
    """Pre-norm self-attention over the whole input (`causal=False`), then a feed-forward.

    $x \\leftarrow x + \\operatorname{MHA}(\\operatorname{LN}(x))$, then
    $x \\leftarrow x + \\operatorname{FF}(\\operatorname{LN}(x))$: each input token reads
    every other, before and after it.

    Args:
        d_model: the width $d$ of every token vector.
        num_heads: attention heads.
        context_length: the longest input.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size below 1, or `d_model` not divisible by `num_heads`.

    Examples:
        >>> block = EncoderBlock(d_model=8, num_heads=2, context_length=16)
        >>> block(torch.randn(3, 5, 8)).shape  # (batch, n, d): shape kept
        torch.Size([3, 5, 8])
    """

    def __init__(self, d_model: int, num_heads: int, context_length: int) -> None:
        super().__init__()
        _check_widths(d_model, num_heads)
        self.att = MultiHeadAttention(
            d_model, d_model, context_length, 0.0, num_heads, causal=False
        )
        self.ff = FeedForward({"emb_dim": d_model})
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)

    def forward(self, x: Tensor, padding: Tensor | None = None) -> Tensor:
        """`(batch, n, d)` -> `(batch, n, d)`; `padding` `(batch, n)`, True = padding.

        Raises:
            TypeError: `x` is not a floating-point tensor of the block's dtype.
            ValueError: `x` is not `(batch, n, d_model)` on the block's device, or `padding`
                is not `(batch, n)`.
        """
        _check_vectors("x", x, self.norm1.scale)
        _check_padding(padding, x)
        x = x + self.att(self.norm1(x), padding)  # (b, n, d)
        out: Tensor = x + self.ff(self.norm2(x))  # (b, n, d)
        return out


class DecoderBlock(nn.Module):
    r"""Causal self-attention, then cross-attention to the encoder's memory, then a feed-forward.

    $$
    \begin{aligned}
    y &\leftarrow y + \operatorname{MHA}_\text{causal}(\operatorname{LN}(y)), \\
    y &\leftarrow y + \operatorname{MHA}(\operatorname{LN}(y), \text{key} = M), \\
    y &\leftarrow y + \operatorname{FF}(\operatorname{LN}(y)).
    \end{aligned}
    $$

    Args:
        d_model: the width $d$ of every token vector (the memory's too).
        num_heads: attention heads, in both attentions.
        context_length: the longest input and the longest output.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size below 1, or `d_model` not divisible by `num_heads`.

    Attributes:
        self_att: causal `MultiHeadAttention`: output token $t$ reads tokens $\le t$.
        cross_att: `MultiHeadAttention(causal=False)`: queries from the decoder, keys and
            values from the memory.

    Examples:
        >>> block = DecoderBlock(d_model=8, num_heads=2, context_length=16)
        >>> y, memory = torch.randn(3, 4, 8), torch.randn(3, 6, 8)  # m = 4 out, n = 6 in
        >>> out, weights = block(y, memory, need_weights=True)
        >>> out.shape, weights.shape  # (batch, m, d), (batch, num_heads, m, n)
        (torch.Size([3, 4, 8]), torch.Size([3, 2, 4, 6]))
    """

    def __init__(self, d_model: int, num_heads: int, context_length: int) -> None:
        super().__init__()
        _check_widths(d_model, num_heads)
        self.self_att = MultiHeadAttention(d_model, d_model, context_length, 0.0, num_heads)
        self.cross_att = MultiHeadAttention(
            d_model, d_model, context_length, 0.0, num_heads, causal=False
        )
        self.ff = FeedForward({"emb_dim": d_model})
        self.norm1 = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.norm3 = LayerNorm(d_model)

    def forward(
        self,
        y: Tensor,
        memory: Tensor | None,
        padding: Tensor | None = None,
        caches: tuple[KVCache, KVCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """One block over the output tokens `y`, `(batch, m, d)`.

        Args:
            y: the decoder's token vectors (the newest only, when decoding with caches).
            memory: the encoder's output `(batch, n, d)`; None to read it from the
                cross-attention cache, which the first call filled.
            padding: `(batch, n)` bool, True where the input is padding; with `memory` only.
            caches: `(self_cache, cross_cache)` from
                [`init_caches`][attention.lab.seq2seq.Seq2SeqTransformer.init_caches], or None.
            need_weights: also return the cross-attention weights.

        Returns:
            `(y, cross_weights)`: `(batch, m, d)`, and `(batch, num_heads, m, n)` or None.

        Raises:
            TypeError: `y` or `memory` not a floating-point tensor of the block's dtype, or
                `caches` not a pair of `KVCache`s.
            ValueError: no `memory` and no caches to read it from; `y` or `memory` not
                `(batch, length, d_model)` on the block's device, batches that differ, or
                `padding` not `(batch, n)`.
        """
        like = self.norm1.scale
        _check_vectors("y", y, like)
        if memory is None and caches is None:
            raise ValueError(
                "memory is None and there is no cross-attention cache to read "
                "it from: pass memory (the encoder's output)"
            )
        if memory is not None:
            _check_vectors("memory", memory, like)
            if memory.shape[0] != y.shape[0]:
                raise ValueError(
                    f"y and memory must have one batch size, got {y.shape[0]} and {memory.shape[0]}"
                )
            _check_padding(padding, memory)
        self_cache, cross_cache = (None, None) if caches is None else _check_pair(caches)
        y = y + self.self_att(self.norm1(y), cache=self_cache)  # (b, m, d)
        # Q from the decoder, K and V from the memory (or the cache): (b, m, d)
        out = self.cross_att(self.norm2(y), padding, need_weights, key=memory, cache=cross_cache)
        context, weights = out if isinstance(out, tuple) else (out, None)
        y = y + context  # (b, m, d)
        return y + self.ff(self.norm3(y)), weights


class Seq2SeqTransformer(nn.Module):
    r"""A transformer encoder-decoder: embeddings and positions, the two stacks, a linear head.

    Source and target tokens get their own embeddings plus the same sinusoidal positions
    $P_t$. The encoder's blocks turn the input into the memory $M$ (`(batch, n, d)`, after a
    final `LayerNorm`); the decoder's blocks read the output so far and $M$; a linear layer
    turns each decoder vector into logits over the `vocab_size` data tokens. The decoder's
    first input is the start token `bos` = `vocab_size`, as in
    [`Seq2Seq`][attention.lab.rnn.Seq2Seq].

    Args:
        vocab_size: data tokens $V$; id $V$ is the start token.
        d_model: width $d$ of every vector.
        num_heads: heads in every attention.
        num_layers: encoder blocks, and as many decoder blocks.
        context_length: the longest input and output.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size below its minimum, an odd `d_model`, or `d_model` not divisible
            by `num_heads`.

    Examples:
        >>> model = Seq2SeqTransformer(vocab_size=20, d_model=16, num_heads=2, num_layers=2)
        >>> memory = model.encode(torch.tensor([[0, 1, 2]]))  # (batch, n, d)
        >>> memory.shape, len(model.decoder)
        (torch.Size([1, 3, 16]), 2)
    """

    positions: Tensor

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 32,
        num_heads: int = 2,
        num_layers: int = 1,
        context_length: int = 64,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size = check_size("vocab_size", vocab_size, minimum=2)
        _check_widths(d_model, num_heads)
        check_size("num_layers", num_layers)
        self.bos = vocab_size
        self.context_length = check_size("context_length", context_length)
        self.src_embed = nn.Embedding(vocab_size, d_model)
        self.tgt_embed = nn.Embedding(vocab_size + 1, d_model)  # + the start token
        positions = sinusoidal_positions(context_length, d_model)
        self.register_buffer("positions", positions, persistent=False)
        self.encoder = nn.ModuleList(
            [EncoderBlock(d_model, num_heads, context_length) for _ in range(num_layers)]
        )
        self.encoder_norm = LayerNorm(d_model)
        self.decoder = nn.ModuleList(
            [DecoderBlock(d_model, num_heads, context_length) for _ in range(num_layers)]
        )
        self.decoder_norm = LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab_size)

    def _check_ids(self, name: str, ids: Tensor, bos: bool = False) -> Tensor:
        """Ids must be a `(batch, length)` batch of known tokens, 1 to `context_length` long."""
        top = self.vocab_size + 1 if bos else self.vocab_size  # the decoder also reads bos
        ids = check_ids(ids, name, top, device=self.out.weight.device)
        if ids.ndim != 2 or ids.shape[0] == 0 or not 0 < ids.shape[1] <= self.context_length:
            raise ValueError(
                f"expected {name} of shape (batch, length) with batch >= 1 and "
                f"1 <= length <= context_length={self.context_length}, got "
                f"{tuple(ids.shape)}"
            )
        return ids

    def encode(self, src: Tensor, padding: Tensor | None = None) -> Tensor:
        """The memory $M$: `(batch, n)` ids -> `(batch, n, d)`; `padding` True = padding.

        Raises:
            TypeError: `src` not integer ids.
            ValueError: `src` not a `(batch, n)` batch of ids in range, or a padding mask not
                `(batch, n)`.
        """
        src = self._check_ids("src", src)
        _check_padding(padding, src)
        return self._encode(src, padding)

    def _encode(self, src: Tensor, padding: Tensor | None) -> Tensor:
        x = self.src_embed(src) + self.positions[: src.shape[1]]  # (b, n, d)
        for block in self.encoder:
            x = block(x, padding)  # (b, n, d)
        out: Tensor = self.encoder_norm(x)
        return out

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        padding: Tensor | None = None,
        caches: Caches | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """Logits `(batch, m, vocab_size)` for decoder inputs `tgt_in` `(batch, m)`.

        With `caches`, `tgt_in` continues the tokens the caches have seen (their positions
        follow on) and `memory` may be None once the cross-attention caches hold it. Returns
        the cross-attention weights of every block too if `need_weights`, else `[]`.

        Raises:
            TypeError: `tgt_in` not integer ids, `caches` not `init_caches`' list.
            ValueError: `tgt_in` not a `(batch, m)` batch of ids in range (`bos` included),
                more tokens than `context_length` with those the caches hold, or a `memory`,
                `padding` or cache that does not fit (named by the decoder block).
        """
        tgt_in = self._check_ids("tgt_in", tgt_in, bos=True)
        if caches is not None:
            if not isinstance(caches, list | tuple) or len(caches) != len(self.decoder):
                raise TypeError(
                    f"caches must be init_caches()'s list of {len(self.decoder)} "
                    "(self_cache, cross_cache) pairs, one per decoder block, got "
                    f"{type(caches).__name__} {caches!r:.60}"
                )
            start = _check_pair(caches[0])[0].length
            if start + tgt_in.shape[1] > self.context_length:
                raise ValueError(
                    f"tgt_in's {tgt_in.shape[1]} tokens after the {start} the caches "
                    f"hold exceed context_length={self.context_length}"
                )
        return self._decode(tgt_in, memory, padding, caches, need_weights)

    def _decode(
        self,
        tgt_in: Tensor,
        memory: Tensor | None,
        padding: Tensor | None = None,
        caches: Caches | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        start = 0 if caches is None else caches[0][0].length  # the first token's position
        y = self.tgt_embed(tgt_in) + self.positions[start : start + tgt_in.shape[1]]  # (b,m,d)
        weights = []
        for i, block in enumerate(self.decoder):
            cache = None if caches is None else caches[i]
            y, w = block(y, memory, padding, cache, need_weights)  # (b, m, d)
            if w is not None:
                weights.append(w)  # (b, h, m, n)
        return self.out(self.decoder_norm(y)), weights  # (b, m, V)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        padding: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """Teacher-forced decoding, as in training: every output position at once.

        Args:
            src: input ids `(batch, n)`.
            tgt_in: decoder inputs `(batch, m)`, `decoder_inputs(tgt, model.bos)`.
            padding: optional `(batch, n)` bool, True where `src` is padding.
            need_weights: also return each decoder block's cross-attention weights.

        Returns:
            `(logits, cross_weights)`: `(batch, m, vocab_size)`, and per decoder block
            `(batch, num_heads, m, n)` (each row sums to 1), or `[]`.

        Raises:
            ValueError: ids not a `(batch, length)` batch in range, batches that differ,
                or a padding mask not `(batch, n)`.
        """
        src, tgt_in = self._check_ids("src", src), self._check_ids("tgt_in", tgt_in, bos=True)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(
                f"src and tgt_in must have one batch size, got {src.shape[0]} and {tgt_in.shape[0]}"
            )
        _check_padding(padding, src)
        memory = self._encode(src, padding)  # (b, n, d)
        return self._decode(tgt_in, memory, padding, need_weights=need_weights)

    def init_caches(self, batch_size: int, src_len: int, out_len: int) -> Caches:
        """Empty caches for decoding: per decoder block, `(self_cache, cross_cache)`.

        The self-attention cache takes up to `out_len` decoder tokens, one per step; the
        cross-attention cache the `src_len` keys and values of the memory, stored once.

        Raises:
            TypeError: a size is not an int.
            ValueError: a size below 1, or `src_len` or `out_len` above `context_length`.
        """
        check_size("batch_size", batch_size)
        for name, length in (("src_len", src_len), ("out_len", out_len)):
            if check_size(name, length) > self.context_length:
                raise ValueError(f"{name}={length} exceeds context_length={self.context_length}")
        blocks = [cast(DecoderBlock, block) for block in self.decoder]
        self_caches = [block.self_att.init_cache(batch_size, out_len) for block in blocks]
        cross_caches = [block.cross_att.init_cache(batch_size, src_len) for block in blocks]
        return list(zip(self_caches, cross_caches, strict=True))

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        out_len: int | None = None,
        *,
        padding: Tensor | None = None,
        use_cache: bool = True,
    ) -> Tensor:
        """Greedy decoding: each step is fed the model's own previous argmax.

        With `use_cache` the encoder runs once, the first step fills every cross-attention
        cache with the memory's keys and values, and each step runs the decoder on its one
        new token; without, each step reruns the decoder on every token so far. The tokens
        are the same.

        Args:
            src: input ids `(batch, n)`.
            out_len: tokens to write; default `n` (as the copy task needs).
            padding: optional `(batch, n)` bool, True where `src` is padding.
            use_cache: decode with the caches (True) or recompute (False).

        Returns:
            `(batch, out_len)` token ids.

        Raises:
            TypeError: `src` not integer ids, `out_len` not an int, `use_cache` not a bool.
            ValueError: `src` not a `(batch, n)` batch of ids in range, `out_len` below 1 or
                above `context_length`, or a padding mask not `(batch, n)`.
        """
        src = self._check_ids("src", src)
        check_flag("use_cache", use_cache)
        out_len = src.shape[1] if out_len is None else check_size("out_len", out_len)
        if out_len > self.context_length:
            raise ValueError(f"out_len={out_len} exceeds context_length={self.context_length}")
        _check_padding(padding, src)
        memory = self._encode(src, padding)  # (b, n, d)
        tokens = torch.full_like(src[:, :1], self.bos)  # y_0 = bos: (b, 1)
        caches = self.init_caches(src.shape[0], src.shape[1], out_len) if use_cache else None
        for t in range(out_len):
            if caches is None:  # rerun every token so far
                logits, _ = self._decode(tokens, memory, padding)  # (b, t + 1, V)
            else:  # the newest token only; the memory is read once, at step 0
                step_memory, step_padding = (memory, padding) if t == 0 else (None, None)
                logits, _ = self._decode(tokens[:, -1:], step_memory, step_padding, caches)
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return tokens[:, 1:]  # (b, out_len)


def _check_widths(d_model: object, num_heads: object) -> None:
    """`d_model` and `num_heads` are sizes, and the heads split `d_model` evenly."""
    d_model, num_heads = check_size("d_model", d_model), check_size("num_heads", num_heads)
    if d_model % num_heads:
        raise ValueError(
            f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}"
        )


def _check_vectors(name: str, x: object, like: Tensor) -> None:
    """Token vectors `x` must be `(batch, length, d_model)`, of `like`'s dtype and device
    (`like` a parameter of the block, `d_model` wide)."""
    x = check_tensor(name, x)
    try:
        check_input(x, like.shape[-1], batched=True, like=like)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name}: {error}") from None


def _check_pair(caches: object) -> tuple[KVCache, KVCache]:
    """A decoder block's caches: `(self_cache, cross_cache)`, two `KVCache`s."""
    pair = tuple(caches) if isinstance(caches, tuple | list) else ()
    if len(pair) != 2 or not all(isinstance(cache, KVCache) for cache in pair):
        raise TypeError(
            f"caches must be a (self_cache, cross_cache) pair of KVCaches, from "
            f"init_caches(), got {type(caches).__name__} {caches!r:.60}"
        )
    return pair[0], pair[1]


def _check_padding(padding: object, src: Tensor) -> None:
    """A source padding mask, if given, must be bool `(batch, n)` on `src`'s device."""
    if padding is None:
        return
    try:
        check_padding_mask(padding, src.shape[0], src.shape[1], src.device)
    except (TypeError, ValueError) as error:
        raise type(error)(f"padding: {error}") from None


@dataclass(frozen=True)
class TransformerResult:
    """What [`transformer_experiment`][attention.lab.seq2seq.transformer_experiment] measured.

    Attributes:
        lengths: the input lengths evaluated, shortest first.
        accuracy: token accuracy of greedy decoding at each length.
        losses: the training loss at every step.
        cross_weights: the last decoder block's cross-attention weights on chapter 1's
            alignment example (the same input), `(num_heads, out_len, in_len)`.
        source_tokens: that input, as letters.
        output_tokens: what the model wrote for it, as letters.
        seconds: wall time to train and evaluate.
        model: the trained model, in eval mode.
    """

    lengths: list[int]
    accuracy: list[float]
    losses: list[float]
    cross_weights: Tensor
    source_tokens: list[str]
    output_tokens: list[str]
    seconds: float
    model: Seq2SeqTransformer


def transformer_experiment(
    seed: int = 0,
    *,
    d_model: int = 32,
    num_heads: int = 2,
    num_layers: int = 1,
    steps: int = 150,
    lr: float = 1e-2,
    num_threads: int | None = 1,
) -> TransformerResult:
    """Train and test the transformer on chapter 1's copy task, as chapter 1 did its models.

    The data and the sizes the two models share are
    [`run_experiment`][attention.lab.copy_task.run_experiment]'s defaults: the task's
    [`VOCAB_SIZE`][attention.lab.copy_task.VOCAB_SIZE] tokens and lengths `MIN_LEN` to `MAX_LEN`,
    batches of 256 drawn under `seed`, 256 test sequences per length under
    `seed + 1`, the alignment example under `seed + 2`
    ([`train_and_test`][attention.lab.copy_task.train_and_test]). The weights are drawn under
    `seed`; the global RNG is left untouched.

    Args:
        seed: seeds the weights, the training data and the test data.
        d_model: width of every vector.
        num_heads: heads per attention.
        num_layers: encoder blocks, and as many decoder blocks.
        steps: training steps.
        lr: initial Adam learning rate.
        num_threads: torch intra-op threads during the run, or None to leave the setting.

    Returns:
        A [`TransformerResult`][attention.lab.seq2seq.TransformerResult].
    """
    vocab_size, min_len, max_len = VOCAB_SIZE, MIN_LEN, MAX_LEN  # chapter 1's task
    lengths = list(range(min_len, max_len + 1))
    with torch_threads(num_threads):
        new_model = partial(Seq2SeqTransformer, vocab_size, d_model, num_heads, num_layers)
        trained = train_and_test(new_model, seed=seed, lengths=lengths, steps=steps, lr=lr)
        model, losses, accuracy, seconds = trained
        src, _ = copy_batch(1, max_len, vocab_size, torch.Generator().manual_seed(seed + 2))
        tokens = model.generate(src)  # (1, n)
        with torch.no_grad():
            _, weights = model(src, decoder_inputs(tokens, model.bos), need_weights=True)
    return TransformerResult(
        lengths=lengths,
        accuracy=accuracy,
        losses=losses,
        cross_weights=weights[-1][0],
        source_tokens=token_letters(src[0]),
        output_tokens=token_letters(tokens[0]),
        seconds=seconds,
        model=model,
    )
