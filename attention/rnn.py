r"""Why attention: a GRU encoder-decoder with and without Bahdanau attention, on copying a sequence.

Before self-attention there was attention *between* two recurrent networks. A recurrent encoder
reads the input tokens $x_1, \dots, x_n$ one at a time, carrying a hidden state

$$
h_i = \operatorname{GRU}(x_i, h_{i-1}), \qquad h_0 = 0,
$$

and a recurrent decoder writes the output $y_1, \dots, y_m$ one token at a time from its own state
$s_t$. How the decoder learns about the input is the whole difference between the two models
here, which are otherwise the same network ([`Seq2Seq`][attention.rnn.Seq2Seq]):

- **plain** (`attention=False`, Cho et al. / Sutskever et al., 2014): the decoder sees only the
  final encoder state, $c_t = h_n$ for every $t$. Everything about the input must squeeze through
  one fixed-size vector, however long the input is.
- **attention** (`attention=True`, Bahdanau, Cho and Bengio, 2014): at every step the decoder
  scores *all* encoder states against its previous state, turns the scores into weights and reads
  their weighted sum ([`AdditiveAttention`][attention.rnn.AdditiveAttention]):

$$
e_{t,i} = v^\top \tanh(W s_{t-1} + U h_i), \qquad
\alpha_{t,i} = \frac{\exp e_{t,i}}{\sum_{j=1}^{n} \exp e_{t,j}}, \qquad
c_t = \sum_{i=1}^{n} \alpha_{t,i} h_i .
$$

Both decoders then run the same step,
$s_t = \operatorname{GRU}([\,y_{t-1}; c_t\,], s_{t-1})$ with $s_0 = h_n$, and predict
$p(y_t) = \operatorname{softmax}(W_o [\,s_t; c_t\,])$.

The task, [`copy_batch`][attention.rnn.copy_batch], is to write a random token sequence back out:
$y_t = x_t$. The first token to write is the one the encoder read first, $n$ steps before its
final state. The experiment, [`run_experiment`][attention.rnn.run_experiment], trains both models
on the same batches and measures accuracy per input length.

Examples:
    >>> generator = torch.Generator().manual_seed(0)
    >>> src, tgt = copy_batch(batch_size=2, seq_len=5, vocab_size=20, generator=generator)
    >>> src.shape, tgt.shape  # (batch, seq_len) each
    (torch.Size([2, 5]), torch.Size([2, 5]))
    >>> bool((tgt == src).all())
    True
    >>> model = Seq2Seq(vocab_size=20, attention=True)
    >>> logits, alignments = model(src, decoder_inputs(tgt, bos=model.bos))
    >>> logits.shape, alignments.shape  # (batch, out_len, vocab), (batch, out_len, in_len)
    (torch.Size([2, 5, 20]), torch.Size([2, 5, 5]))
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.core import check_size

__all__ = [
    "TOKEN_LETTERS",
    "AdditiveAttention",
    "ExperimentResult",
    "Seq2Seq",
    "copy_batch",
    "decoder_inputs",
    "evaluate_by_length",
    "run_experiment",
    "token_letters",
    "train",
]

TOKEN_LETTERS = "abcdefghijklmnopqrstuvwxyz"
"""How token ids are shown on the page and in plots: id 0 is `a`, id 1 is `b`, ..."""


def token_letters(ids: Tensor | Sequence[int]) -> list[str]:
    """Token ids as letters, for labels (`0 -> "a"`); ids past `z` are shown as numbers.

    Args:
        ids: a 1-D tensor or sequence of token ids.

    Returns:
        One string per id.

    Examples:
        >>> token_letters(torch.tensor([0, 1, 25, 30]))
        ['a', 'b', 'z', '30']
    """
    ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    return [TOKEN_LETTERS[i] if 0 <= i < len(TOKEN_LETTERS) else str(i) for i in ids]


def copy_batch(
    batch_size: int, seq_len: int, vocab_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """A batch of the copy task: uniform random tokens, and the same tokens as the target.

    Args:
        batch_size: number of sequences.
        seq_len: tokens per sequence, $n$.
        vocab_size: tokens are drawn uniformly from `0 .. vocab_size - 1`.
        generator: the seeded source of randomness (the same seed gives the same batch).

    Returns:
        `(src, tgt)`, both int64 of shape `(batch_size, seq_len)`, with `tgt == src`
        (separate tensors).

    Raises:
        TypeError: a size is not an int.
        ValueError: `batch_size < 1`, `seq_len < 1` or `vocab_size < 2`.

    Examples:
        >>> src, tgt = copy_batch(1, 4, 20, torch.Generator().manual_seed(1))
        >>> token_letters(src[0])
        ['f', 't', 'e', 'i']
    """
    check_size("batch_size", batch_size)
    check_size("seq_len", seq_len)
    check_size("vocab_size", vocab_size, minimum=2)
    src = torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)  # (B, n)
    return src, src.clone()  # (B, n), (B, n)


def decoder_inputs(tgt: Tensor, bos: int) -> Tensor:
    """Teacher forcing: the decoder's inputs are the targets shifted right behind a start token.

    At step $t$ the decoder is fed the *true* previous token $y_{t-1}$ (with $y_0$ = `bos`)
    rather than its own guess, so every step of a training sequence is learned in parallel
    with the right history.

    Args:
        tgt: target ids, shape `(batch, out_len)`.
        bos: the start-of-sequence id (`Seq2Seq.bos`).

    Returns:
        Ids of shape `(batch, out_len)`: `[bos, y_1, ..., y_{m-1}]` per row.

    Examples:
        >>> decoder_inputs(torch.tensor([[3, 4, 5]]), bos=20)
        tensor([[20,  3,  4]])
    """
    start = torch.full_like(tgt[:, :1], bos)  # (B, 1)
    return torch.cat([start, tgt[:, :-1]], dim=1)  # (B, out_len)


class AdditiveAttention(nn.Module):
    r"""Bahdanau's additive attention: score every encoder state against the decoder's state.

    $$
    e_{t,i} = v^\top \tanh(W s_{t-1} + U h_i), \qquad
    \alpha_t = \operatorname{softmax}(e_t), \qquad
    c_t = \sum_i \alpha_{t,i} h_i .
    $$

    The score is a one-hidden-layer network of the query $s_{t-1}$ and the key $h_i$ (hence
    *additive*); the transformer's scaled dot product $q \cdot k / \sqrt{d_k}$ later replaced it
    with a cheaper one. $U h_i$ does not depend on $t$: compute it once per input with
    [`project_keys`][attention.rnn.AdditiveAttention.project_keys].

    Args:
        hidden_size: size $H$ of both the decoder state $s$ and the encoder states $h_i$.

    Examples:
        >>> attn = AdditiveAttention(hidden_size=4)
        >>> enc_states, s_prev = torch.randn(2, 3, 4), torch.randn(2, 4)
        >>> context_vec, attn_weights = attn(s_prev, enc_states)
        >>> context_vec.shape, attn_weights.shape  # (batch, H), (batch, in_len)
        (torch.Size([2, 4]), torch.Size([2, 3]))
        >>> torch.allclose(attn_weights.sum(-1), torch.ones(2))
        True
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = check_size("hidden_size", hidden_size)
        self.W = nn.Linear(hidden_size, hidden_size, bias=False)
        self.U = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def project_keys(self, enc_states: Tensor) -> Tensor:
        """$U h_i$ for every encoder state, shape `(batch, in_len, H)`."""
        keys: Tensor = self.U(enc_states)  # (B, n, H)
        return keys

    def forward(
        self, s_prev: Tensor, enc_states: Tensor, keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """One decoder step's context vector and attention weights.

        Args:
            s_prev: the decoder's previous state $s_{t-1}$, shape `(batch, H)`.
            enc_states: the encoder states $h_1 \\dots h_n$, shape `(batch, in_len, H)`.
            keys: `project_keys(enc_states)` if already computed, else `None`.

        Returns:
            `(context_vec, attn_weights)`: $c_t$ of shape `(batch, H)` and $\\alpha_t$ of shape
            `(batch, in_len)`, each row summing to 1.

        Raises:
            ValueError: `s_prev` is not `(batch, H)`, `enc_states` not `(batch, in_len, H)`
                with the same batch and at least one state, or `keys` not of their shape.
        """
        H = self.hidden_size
        if enc_states.ndim != 3 or enc_states.shape[-1] != H or enc_states.shape[1] == 0:
            raise ValueError(
                f"expected enc_states of shape (batch, in_len, H={H}) with in_len >= 1, "
                f"got {tuple(enc_states.shape)}"
            )
        if s_prev.shape != (enc_states.shape[0], H):
            raise ValueError(
                f"expected s_prev of shape (batch, H) = ({enc_states.shape[0]}, {H}), "
                f"got {tuple(s_prev.shape)}"
            )
        if keys is not None and keys.shape != enc_states.shape:
            raise ValueError(
                f"expected keys of the shape of enc_states {tuple(enc_states.shape)}, "
                f"got {tuple(keys.shape)}"
            )
        if keys is None:
            keys = self.project_keys(enc_states)  # (B, n, H)
        # e_{t,i} = v^T tanh(W s_{t-1} + U h_i)
        attn_scores = self.v(torch.tanh(self.W(s_prev)[:, None, :] + keys))  # (B, n, 1)
        # alpha_t = softmax_i(e_{t,i})
        attn_weights = torch.softmax(attn_scores.squeeze(-1), dim=-1)  # (B, n)
        # c_t = sum_i alpha_{t,i} h_i
        context_vec = (attn_weights[:, None, :] @ enc_states).squeeze(1)  # (B, H)
        return context_vec, attn_weights


class Seq2Seq(nn.Module):
    r"""A GRU encoder-decoder; with `attention=True` its decoder attends over all encoder states.

    Encoder: $h_i = \operatorname{GRU}(E_\text{src}[x_i], h_{i-1})$, $i = 1 \dots n$
    (`nn.GRU`, one fused loop). Decoder, one `nn.GRUCell` step per output token, $s_0 = h_n$,
    $y_0$ = `bos`:

    $$
    c_t = \begin{cases} h_n & \text{plain} \\ \sum_i \alpha_{t,i} h_i & \text{attention}
    \end{cases},
    $$

    $$
    s_t = \operatorname{GRU}([\,E_\text{tgt}[y_{t-1}]; c_t\,], s_{t-1}), \qquad
    p(y_t) = \operatorname{softmax}(W_o [\,s_t; c_t\,]).
    $$

    The two variants share every other layer and size; the plain one simply has no
    [`AdditiveAttention`][attention.rnn.AdditiveAttention] (and so slightly fewer parameters).

    Args:
        vocab_size: number of data tokens $V$; the decoder's start token is id $V$ (`bos`).
        embed_dim: size of the token embeddings.
        hidden_size: size $H$ of every recurrent state.
        attention: use Bahdanau attention (True) or the final encoder state only (False).

    Examples:
        >>> model = Seq2Seq(vocab_size=20, attention=False)
        >>> src = torch.tensor([[0, 1, 2]])  # "abc": (batch, in_len)
        >>> tokens, alignments = model.generate(src)
        >>> tokens.shape, alignments is None  # untrained, so the tokens are noise
        (torch.Size([1, 3]), True)
    """

    def __init__(
        self, vocab_size: int, embed_dim: int = 16, hidden_size: int = 32, attention: bool = True
    ) -> None:
        super().__init__()
        check_size("vocab_size", vocab_size, minimum=2)
        check_size("embed_dim", embed_dim)
        check_size("hidden_size", hidden_size)
        self.vocab_size = vocab_size
        self.bos = vocab_size
        self.src_embed = nn.Embedding(vocab_size, embed_dim)
        self.encoder = nn.GRU(embed_dim, hidden_size, batch_first=True)
        self.tgt_embed = nn.Embedding(vocab_size + 1, embed_dim)  # + the start token
        self.cell = nn.GRUCell(embed_dim + hidden_size, hidden_size)
        self.attention = AdditiveAttention(hidden_size) if attention else None
        self.out = nn.Linear(2 * hidden_size, vocab_size)

    def _check_ids(self, name: str, ids: Tensor, bos: bool = False) -> None:
        """Ids must be a non-empty `(batch, length)` integer batch of known tokens."""
        top = self.vocab_size if bos else self.vocab_size - 1  # the decoder also reads bos
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise ValueError(f"expected integer token ids in {name}, got dtype {ids.dtype}")
        if ids.ndim != 2 or 0 in ids.shape:
            raise ValueError(
                f"expected {name} of shape (batch, length), both >= 1, got {tuple(ids.shape)}"
            )
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high > top:
            raise ValueError(f"expected ids in {name} within 0 .. {top}, got {low} .. {high}")

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Run the encoder: all states $h_1 \\dots h_n$ and the final one $h_n$.

        Args:
            src: input ids, shape `(batch, in_len)`.

        Returns:
            `(enc_states, h_n)` of shapes `(batch, in_len, H)` and `(batch, H)`.
        """
        enc_states, h_n = self.encoder(self.src_embed(src))  # (B, n, H), (1, B, H)
        return enc_states, h_n[0]  # (B, n, H), (B, H)

    def _decode(self, src: Tensor, tgt_in: Tensor | None, out_len: int) -> tuple[Tensor, Tensor]:
        """The decoder loop. Feeds `tgt_in` (teacher forcing) or, if None, its own argmax."""
        enc_states, h_n = self.encode(src)  # (B, n, H), (B, H)
        keys = self.attention.project_keys(enc_states) if self.attention else None  # (B, n, H)
        s = h_n  # s_0 = h_n: (B, H)
        context_vec = h_n  # the plain decoder's c_t, the same at every step: (B, H)
        if tgt_in is not None:  # teacher forcing: every input token is known, embed them at once
            y_embeds = self.tgt_embed(tgt_in)  # (B, m, E)
        else:
            y_embed = self.tgt_embed(torch.full_like(src[:, 0], self.bos))  # y_0: (B, E)
        outputs, alignments = [], []
        for t in range(out_len):
            if tgt_in is not None:
                y_embed = y_embeds[:, t]  # (B, E)
            if self.attention is not None:
                context_vec, attn_weights = self.attention(s, enc_states, keys)  # (B,H), (B,n)
                alignments.append(attn_weights)
            # s_t = GRU([y_{t-1}; c_t], s_{t-1})
            s = self.cell(torch.cat([y_embed, context_vec], dim=-1), s)  # (B, H)
            outputs.append(torch.cat([s, context_vec], dim=-1))  # [s_t; c_t]: (B, 2H)
            if tgt_in is None:  # greedy: feed back the model's own guess
                y_embed = self.tgt_embed(self.out(outputs[-1]).argmax(dim=-1))  # (B, E)
        logits = self.out(torch.stack(outputs, dim=1))  # W_o [s_t; c_t]: (B, m, V)
        weights = torch.stack(alignments, dim=1) if alignments else torch.empty(0)  # (B, m, n)
        return logits, weights

    def forward(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced decoding, as in training.

        Args:
            src: input ids, shape `(batch, in_len)`.
            tgt_in: decoder inputs `decoder_inputs(tgt, self.bos)`, shape `(batch, out_len)`.

        Returns:
            `(logits, alignments)`: shapes `(batch, out_len, vocab_size)` and, with attention,
            `(batch, out_len, in_len)` (row $t$ is $\\alpha_t$ and sums to 1); None without.

        Raises:
            ValueError: `src` or `tgt_in` is not a non-empty 2-D batch of ids in range, or
                their batches differ.
        """
        if src.ndim != 2 or tgt_in.ndim != 2 or src.shape[0] != tgt_in.shape[0]:
            raise ValueError(
                "expected src (batch, in_len) and tgt_in (batch, out_len) with the same batch, "
                f"got {tuple(src.shape)} and {tuple(tgt_in.shape)}"
            )
        self._check_ids("src", src)
        self._check_ids("tgt_in", tgt_in, bos=True)
        logits, weights = self._decode(src, tgt_in, tgt_in.shape[1])
        return logits, (weights if self.attention is not None else None)

    @torch.no_grad()
    def generate(self, src: Tensor, out_len: int | None = None) -> tuple[Tensor, Tensor | None]:
        """Greedy decoding: each step is fed the model's own previous argmax.

        Args:
            src: input ids, shape `(batch, in_len)`.
            out_len: tokens to produce; default `in_len` (as the copy task needs).

        Returns:
            `(tokens, alignments)`: shapes `(batch, out_len)` and `(batch, out_len, in_len)`
            with attention, None without.

        Raises:
            ValueError: `src` is not a non-empty 2-D batch of ids in `0 .. vocab_size - 1`, or
                `out_len < 1`.
        """
        self._check_ids("src", src)
        out_len = src.shape[1] if out_len is None else check_size("out_len", out_len)
        logits, weights = self._decode(src, None, out_len)
        return logits.argmax(dim=-1), (weights if self.attention is not None else None)


def train(
    model: Seq2Seq,
    *,
    steps: int = 400,
    batch_size: int = 256,
    min_len: int = 2,
    max_len: int = 12,
    lr: float = 1e-2,
    seed: int = 0,
) -> list[float]:
    r"""Train on the copy task with teacher forcing; return the loss of every step.

    Each step draws one length $n$ uniformly from `min_len .. max_len` and a batch of that
    length (so no padding is needed), minimises the mean cross-entropy of the next token, clips
    the gradient norm at 1 and takes an Adam step. The learning rate decays linearly from `lr`
    to 0. The batches depend only on `seed`, so two models trained with one seed see the same
    data.

    Args:
        model: the model to train, in place.
        steps: optimiser steps.
        batch_size: sequences per step.
        min_len: shortest training sequence.
        max_len: longest training sequence.
        lr: initial Adam learning rate.
        seed: seeds the data generator.

    Returns:
        The training loss (nats per token) at each of the `steps` steps.

    Raises:
        TypeError: a count or length is not an int.
        ValueError: `steps < 1`, `batch_size < 1`, `min_len < 1` or `max_len < min_len`.
    """
    check_size("steps", steps)
    check_size("batch_size", batch_size)
    check_size("min_len", min_len)
    check_size("max_len", max_len)
    if max_len < min_len:
        raise ValueError(f"expected min_len <= max_len, got {min_len=} and {max_len=}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    model.train()
    losses = []
    for _ in range(steps):
        seq_len = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
        src, tgt = copy_batch(batch_size, seq_len, model.vocab_size, generator)  # (B, n)
        logits, _ = model(src, decoder_inputs(tgt, model.bos))  # (B, n, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())  # (B * n, V) vs (B * n,)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


def evaluate_by_length(
    model: Seq2Seq, lengths: Sequence[int], *, num_seqs: int = 256, seed: int = 0
) -> list[float]:
    """Token accuracy of greedy decoding on fresh random sequences, one number per length.

    Args:
        model: a trained model.
        lengths: the input lengths to test.
        num_seqs: sequences per length.
        seed: seeds the test data (use one the training did not).

    Returns:
        For each length, the fraction of output tokens equal to the input token at their position.

    Raises:
        TypeError: a length or `num_seqs` is not an int.
        ValueError: a length or `num_seqs` below 1.
    """
    check_size("num_seqs", num_seqs)
    for seq_len in lengths:
        check_size("each of lengths", seq_len)
    generator = torch.Generator().manual_seed(seed)
    accuracy = []
    for seq_len in lengths:
        src, tgt = copy_batch(num_seqs, seq_len, model.vocab_size, generator)  # (N, n)
        tokens, _ = model.generate(src)  # (N, n)
        accuracy.append((tokens == tgt).float().mean().item())
    return accuracy


@dataclass(frozen=True)
class ExperimentResult:
    """What [`run_experiment`][attention.rnn.run_experiment] measured.

    Attributes:
        lengths: the input lengths evaluated, shortest first.
        plain_accuracy: token accuracy of the plain model at each length.
        attention_accuracy: token accuracy of the attention model at each length.
        plain_losses: the plain model's training loss at every step.
        attention_losses: the attention model's training loss at every step.
        alignment: the attention model's weights $\\alpha$ on one test input of the longest
            length, shape `(out_len, in_len)`; row $t$ is output step $t$.
        source_tokens: that input, as letters.
        output_tokens: what the attention model wrote for it, as letters.
        plain_seconds: wall time to train and evaluate the plain model.
        attention_seconds: the same for the attention model.
        seed: the seed of everything.
        plain_model: the trained plain model, in eval mode.
        attention_model: the trained attention model, in eval mode.
    """

    lengths: list[int]
    plain_accuracy: list[float]
    attention_accuracy: list[float]
    plain_losses: list[float]
    attention_losses: list[float]
    alignment: Tensor
    source_tokens: list[str]
    output_tokens: list[str]
    plain_seconds: float
    attention_seconds: float
    seed: int
    plain_model: Seq2Seq
    attention_model: Seq2Seq

    @property
    def runtime_seconds(self) -> float:
        """Wall time of the whole experiment, both models."""
        return self.plain_seconds + self.attention_seconds


@contextlib.contextmanager
def _torch_threads(num_threads: int | None) -> Iterator[None]:
    """Use `num_threads` intra-op threads inside the block (None: leave as is), then restore."""
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_experiment(
    seed: int = 0,
    *,
    vocab_size: int = 20,
    embed_dim: int = 16,
    hidden_size: int = 32,
    min_len: int = 2,
    max_len: int = 12,
    steps: int = 400,
    batch_size: int = 256,
    lr: float = 1e-2,
    num_seqs: int = 256,
    num_threads: int | None = 1,
) -> ExperimentResult:
    """Train the plain and the attention model on the same batches and test them per length.

    Both models start from weights drawn under `seed`, train with
    [`train`][attention.rnn.train] on the batches drawn under `seed`, and are tested with
    [`evaluate_by_length`][attention.rnn.evaluate_by_length] on every length from `min_len`
    to `max_len` with data drawn under `seed + 1`. The global torch RNG is left untouched.

    The defaults take about 10 s on one CPU core. The work is many small sequential steps, so
    a second intra-op thread buys nothing and, on a busy machine, costs a lot of waiting;
    `num_threads=1` runs the experiment on one thread and restores the setting afterwards
    (`None` leaves it as is). The results do not depend on it.

    Args:
        seed: seeds the weights, the training data and the test data.
        vocab_size: distinct data tokens.
        embed_dim: token embedding size.
        hidden_size: recurrent state size $H$ (the plain model's whole memory of the input).
        min_len: shortest sequence, trained and tested.
        max_len: longest sequence, trained and tested.
        steps: training steps per model.
        batch_size: sequences per training step.
        lr: initial Adam learning rate.
        num_seqs: test sequences per length.
        num_threads: torch intra-op threads during the run, or None to leave the setting.

    Returns:
        An [`ExperimentResult`][attention.rnn.ExperimentResult].
    """
    lengths = list(range(min_len, max_len + 1))
    accuracy, losses, seconds = {}, {}, {}
    models = {}
    with _torch_threads(num_threads):
        for name, use_attention in (("plain", False), ("attention", True)):
            start = time.perf_counter()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = Seq2Seq(vocab_size, embed_dim, hidden_size, attention=use_attention)
            losses[name] = train(
                model, steps=steps, batch_size=batch_size, min_len=min_len, max_len=max_len,
                lr=lr, seed=seed,
            )  # fmt: skip
            accuracy[name] = evaluate_by_length(model, lengths, num_seqs=num_seqs, seed=seed + 1)
            seconds[name] = time.perf_counter() - start
            models[name] = model
        src, _ = copy_batch(1, max_len, vocab_size, torch.Generator().manual_seed(seed + 2))
        tokens, alignments = models["attention"].generate(src)  # (1, n), (1, n, n)
    assert alignments is not None
    return ExperimentResult(
        lengths=lengths,
        plain_accuracy=accuracy["plain"],
        attention_accuracy=accuracy["attention"],
        plain_losses=losses["plain"],
        attention_losses=losses["attention"],
        alignment=alignments[0],
        source_tokens=token_letters(src[0]),
        output_tokens=token_letters(tokens[0]),
        plain_seconds=seconds["plain"],
        attention_seconds=seconds["attention"],
        seed=seed,
        plain_model=models["plain"],
        attention_model=models["attention"],
    )
