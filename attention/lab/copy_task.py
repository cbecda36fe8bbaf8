r"""Why attention, measured: the plain and the attention encoder-decoder on copying a sequence.

The task, [`copy_batch`][attention.lab.copy_task.copy_batch], is to write a random token sequence
back out: $y_t = x_t$. The first token to write is the one the encoder read first, $n$ steps
before its final state, so the plain model of [`attention.lab.rnn`][attention.lab.rnn] must carry
the whole input in one vector, while the attention model can look back at every encoder state.
[`run_experiment`][attention.lab.copy_task.run_experiment] trains both on the same batches
([`train`][attention.lab.copy_task.train]) and measures accuracy per input length
([`evaluate_by_length`][attention.lab.copy_task.evaluate_by_length]).

Examples:
    >>> generator = torch.Generator().manual_seed(0)
    >>> src, tgt = copy_batch(batch_size=2, seq_len=5, vocab_size=20, generator=generator)
    >>> bool((tgt == src).all()), token_letters(src[0])
    (True, ['e', 't', 'n', 'a', 'd'])
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.checks import check_ids, check_positive, check_size, check_tensor
from attention.lab.rnn import Seq2Seq, decoder_inputs
from attention.lab.threads import torch_threads

__all__ = [
    "MAX_LEN",
    "MIN_LEN",
    "TOKEN_LETTERS",
    "VOCAB_SIZE",
    "ExperimentResult",
    "copy_batch",
    "evaluate_by_length",
    "run_experiment",
    "token_letters",
    "train",
    "train_and_test",
]

VOCAB_SIZE = 20
"""Tokens in the task's vocabulary: every model trained on it (chapter 1's two, chapter 14's
transformer) uses this, and lengths `MIN_LEN` to `MAX_LEN`."""

MIN_LEN = 2
"""The shortest sequence to copy."""

MAX_LEN = 12
"""The longest sequence to copy."""

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
    ids = check_tensor("ids", check_ids(ids, "ids"), ndim=1).tolist()
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


def train(
    model: nn.Module,
    *,
    steps: int = 400,
    batch_size: int = 256,
    min_len: int = MIN_LEN,
    max_len: int = MAX_LEN,
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
        model: the model to train, in place: a [`Seq2Seq`][attention.lab.rnn.Seq2Seq], or any
            module with `vocab_size` and `bos` whose `model(src, tgt_in)` returns
            `(logits, ...)` (chapter 14's transformer).
        steps: optimiser steps.
        batch_size: sequences per step.
        min_len: shortest training sequence.
        max_len: longest training sequence.
        lr: initial Adam learning rate.
        seed: seeds the data generator.

    Returns:
        The training loss (nats per token) at each of the `steps` steps.

    Raises:
        TypeError: `model` is not a `Seq2Seq`, or a count, length or the seed is not an int.
        ValueError: `steps < 1`, `batch_size < 1`, `min_len < 1`, `max_len < min_len`,
            `max_len` over a model's `context_length`, a negative seed, or `lr` not a finite
            number above 0.
    """
    if not (
        isinstance(model, nn.Module) and hasattr(model, "vocab_size") and hasattr(model, "bos")
    ):
        raise TypeError(
            f"model must be a Seq2Seq (or a module with vocab_size and bos, as "
            f"chapter 14's transformer), got {type(model).__name__}"
        )
    check_size("seed", seed, minimum=0)
    if seed >= 2**63:
        raise ValueError(f"seed must fit in int64, got {seed}")
    check_size("steps", steps)
    check_size("batch_size", batch_size)
    check_size("min_len", min_len)
    check_size("max_len", max_len)
    if max_len < min_len:
        raise ValueError(f"expected min_len <= max_len, got {min_len=} and {max_len=}")
    check_positive("lr", lr)  # not Adam's error
    context_length = getattr(model, "context_length", max_len)  # the transformer has one
    if max_len > context_length:
        raise ValueError(
            f"max_len must be at most the model's context_length {context_length}, got {max_len}"
        )
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    model.train()
    losses = []
    trainee: Any = model  # a Seq2Seq, or any module with vocab_size and bos (checked)
    vocab_size, bos = int(trainee.vocab_size), int(trainee.bos)
    for _ in range(steps):
        seq_len = int(torch.randint(min_len, max_len + 1, (1,), generator=generator))
        src, tgt = copy_batch(batch_size, seq_len, vocab_size, generator)  # (B, n)
        logits, _ = model(src, decoder_inputs(tgt, bos))  # (B, n, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())  # (B * n, V) vs (B * n,)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


class Copier(Protocol):
    """What the evaluation needs of a model: its vocabulary, and greedy decoding."""

    vocab_size: int

    def generate(self, src: Tensor) -> Any: ...  # tokens (N, n), or (tokens, ...)


def evaluate_by_length(
    model: Copier, lengths: Sequence[int], *, num_seqs: int = 256, seed: int = 0
) -> list[float]:
    """Token accuracy of greedy decoding on fresh random sequences, one number per length.

    Args:
        model: a trained model: chapter 1's [`Seq2Seq`][attention.lab.rnn.Seq2Seq], whose
            `generate` also returns its alignments, or chapter 14's transformer.
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
    check_size("seed", seed, minimum=0)
    if isinstance(lengths, int | str) or not isinstance(lengths, Sequence):
        raise TypeError(f"lengths must be a sequence of ints, got {type(lengths).__name__}")
    for seq_len in lengths:
        check_size("each of lengths", seq_len)
    generator = torch.Generator().manual_seed(seed)
    accuracy = []
    for seq_len in lengths:
        src, tgt = copy_batch(num_seqs, seq_len, model.vocab_size, generator)  # (N, n)
        out = model.generate(src)
        tokens = out[0] if isinstance(out, tuple) else out  # (N, n)
        accuracy.append((tokens == tgt).float().mean().item())
    return accuracy


M = TypeVar("M", bound=nn.Module)


def train_and_test(
    make: Callable[[], M],
    *,
    seed: int,
    lengths: Sequence[int],
    steps: int,
    batch_size: int = 256,
    lr: float = 1e-2,
    num_seqs: int = 256,
) -> tuple[M, list[float], list[float], float]:
    """One model through chapter 1's experiment: made, trained, tested and timed.

    `make()` draws its weights under `seed` (the global RNG is left as it was);
    [`train`][attention.lab.copy_task.train] runs on the batches drawn under `seed`, lengths
    `lengths[0]` to `lengths[-1]`;
    [`evaluate_by_length`][attention.lab.copy_task.evaluate_by_length] tests every length with
    data drawn under `seed + 1`. Chapter 1's two models and chapter 14's transformer go
    through it, so all three see the same batches and the same tests.

    Returns:
        The trained model (in eval mode), its loss at each step, its accuracy at each length,
        and the seconds it took to train and test.
    """
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make()
    losses = train(
        model,
        steps=steps,
        batch_size=batch_size,
        min_len=lengths[0],
        max_len=lengths[-1],
        lr=lr,
        seed=seed,
    )
    copier = cast(Copier, model)  # chapter 1's models and chapter 14's: each has generate
    accuracy = evaluate_by_length(copier, lengths, num_seqs=num_seqs, seed=seed + 1)
    return model, losses, accuracy, time.perf_counter() - start


@dataclass(frozen=True)
class ExperimentResult:
    """What [`run_experiment`][attention.lab.copy_task.run_experiment] measured.

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


def run_experiment(
    seed: int = 0,
    *,
    vocab_size: int = VOCAB_SIZE,
    embed_dim: int = 16,
    hidden_size: int = 32,
    min_len: int = MIN_LEN,
    max_len: int = MAX_LEN,
    steps: int = 400,
    batch_size: int = 256,
    lr: float = 1e-2,
    num_seqs: int = 256,
    num_threads: int | None = 1,
) -> ExperimentResult:
    """Train the plain and the attention model on the same batches and test them per length.

    Both models start from weights drawn under `seed`, train with
    [`train`][attention.lab.copy_task.train] on the batches drawn under `seed`, and are tested with
    [`evaluate_by_length`][attention.lab.copy_task.evaluate_by_length] on every length from
    `min_len` to `max_len` with data drawn under `seed + 1`. The global torch RNG is left untouched.

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
        An [`ExperimentResult`][attention.lab.copy_task.ExperimentResult].
    """
    lengths = list(range(min_len, max_len + 1))
    accuracy, losses, seconds = {}, {}, {}
    models = {}
    with torch_threads(num_threads):
        for name, use_attention in (("plain", False), ("attention", True)):
            models[name], losses[name], accuracy[name], seconds[name] = train_and_test(
                functools.partial(Seq2Seq, vocab_size, embed_dim, hidden_size, use_attention),
                seed=seed,
                lengths=lengths,
                steps=steps,
                batch_size=batch_size,
                lr=lr,
                num_seqs=num_seqs,
            )
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
