r"""Where linear attention loses: exact recall of an earlier token, softmax against linear.

Chapter 16's induction task ([`attention.lab.heads`][attention.lab.heads]): random tokens, then
the same tokens again. Each token of the second half is the one that followed the current
token's earlier occurrence, so a model that can look that occurrence up predicts the whole
second half exactly. A softmax layer can: it keeps every earlier key and value and puts its
weight on the one that matches. A linear-attention layer
([`LinearAttention`][attention.model.hybrid.LinearAttention]) keeps only a sum of them,
a `(head_dim, head_dim)` state per head, whatever the length; what it reads back is a blend.

[`compare_recall`][attention.lab.recall.compare_recall] trains one
[`HybridGPTModel`][attention.model.hybrid.HybridGPTModel] config twice, all softmax and all
linear, with the same seed, steps and data, and measures each one's **recall**: the fraction of
the repeated half's tokens it predicts exactly (its most likely next token is the right one).
The softmax model is chapter 16's (rotary positions); a linear layer takes no rotary angles,
so the linear model learns a position embedding instead: each gets positions in the form its
attention can use.

Examples:
    >>> result = compare_recall(steps=2, n=4, batch_size=4, emb_dim=8, n_heads=2)
    >>> [run.layer_types for run in (result.softmax, result.linear)]
    [('full_attention', 'full_attention'), ('linear_attention', 'linear_attention')]
    >>> all(0.0 <= run.recall <= 1.0 for run in (result.softmax, result.linear))
    True
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attention.checks import check_positive, check_size
from attention.derivation.text import gpt2_encoding, sample_text
from attention.lab.heads import _periodic, repeated_tokens
from attention.lab.threads import torch_threads
from attention.model.hybrid import HybridGPTModel

__all__ = ["RecallComparison", "RecallRun", "compare_recall", "recall"]


@dataclass(frozen=True)
class RecallRun:
    """One model trained on the induction task, and how well it recalls.

    Attributes:
        layer_types: the kind of each layer, block 0 first.
        positions: `"rotary"` (RoPE in every softmax layer) or `"learned"` (`pos_emb`).
        recall: the fraction of the repeated half's tokens predicted exactly, in $[0, 1]$.
        loss_repeated: the cross-entropy on the repeated half.
        seconds: wall time of the training.
    """

    layer_types: tuple[str, ...]
    positions: str
    recall: float
    loss_repeated: float
    seconds: float


@dataclass(frozen=True)
class RecallComparison:
    """The same config trained all softmax and all linear, same seed, steps and data.

    Attributes:
        softmax: the run with every layer `"full_attention"`.
        linear: the run with every layer `"linear_attention"`.
        n: the length of each random half of the probe.
        steps: optimizer steps of each training.
        head_dim: each head's width $d_h$: a linear head's state is $d_h \\times d_h$ numbers.
        chance: $1 / V$, the recall of a guess (`V` the vocabulary size).
    """

    softmax: RecallRun
    linear: RecallRun
    n: int
    steps: int
    head_dim: int
    chance: float


def recall(model: nn.Module, idx: Tensor, n: int) -> tuple[float, float]:
    """The recall and the loss of `model` on the repeated half of `idx`.

    Predicting token $t + 1$ from tokens $0..t$, the targets $n + 1 .. 2n - 1$ are copies
    (target $n$, the first repeat, is not: nothing says yet that the sequence restarts).

    Args:
        model: a GPT, ids `(b, T)` -> logits `(b, T, V)`.
        idx: `(b, 2n)` ids, `n` random tokens then the same again.
        n: the length of the random half.

    Returns:
        `(fraction predicted exactly, cross-entropy)` over those targets.
    """
    with torch.no_grad():
        logits = model(idx[:, :-1])  # token t + 1 from tokens 0..t: (b, 2n - 1, V)
    targets, guesses = idx[:, n + 1 :], logits[:, n:]  # the copies: (b, n - 1), (b, n - 1, V)
    exact = (guesses.argmax(-1) == targets).float().mean()
    loss = nn.functional.cross_entropy(guesses.transpose(1, 2), targets)
    return float(exact), float(loss)


def _train(
    cfg: dict[str, object], seed: int, steps: int, batch_size: int, n: int, lr: float, probe: Tensor
) -> RecallRun:
    """Train `HybridGPTModel(cfg)` from `seed` on chapter 16's periodic sequences."""
    torch.manual_seed(seed)
    model = HybridGPTModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    data = torch.Generator().manual_seed(seed)  # the same batches for every model
    vocab_size = model.vocab_size
    start = time.perf_counter()
    for step in range(steps):
        idx = _periodic(batch_size, n, vocab_size, data)  # (b, 2n)
        logits = model(idx[:, :-1])  # (b, 2n - 1, V)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"training diverged at step {step}: loss {loss.item()} "
                f"(lr={lr!r}); try a smaller lr"
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    exact, loss_repeated = recall(model.eval(), probe, n)
    positions = "learned" if model.pos_emb is not None else "rotary"
    return RecallRun(tuple(model.layer_types), positions, exact, loss_repeated, seconds)


def compare_recall(
    seed: int = 0,
    steps: int = 700,
    n: int = 16,
    batch_size: int = 32,
    emb_dim: int = 64,
    n_heads: int = 4,
    n_layers: int = 2,
    lr: float = 3e-3,
    num_threads: int | None = 1,
) -> RecallComparison:
    """Train one GPT config all softmax and all linear on the induction task; measure recall.

    The task, the vocabulary and the softmax model are chapter 16's
    ([`train_induction`][attention.lab.heads.train_induction]): the sample essay's distinct
    tokens, sequences of `m` random tokens repeated to `2n` with the period `m` drawn in
    `n/2 .. n`, RoPE in every softmax layer. A linear layer takes no rotary angles, so the
    all-linear model learns a position embedding (`pos_emb`) instead. Recall is measured on
    64 sequences of `n` random tokens then the same `n`
    ([`repeated_tokens`][attention.lab.heads.repeated_tokens]), drawn from `seed + 1`.
    AdamW, no dropout.

    Args:
        seed: seeds the weights and the data (the same for both models).
        steps: optimizer steps, each.
        n: length of the random half, at least 2; the context is `2n`.
        batch_size: sequences per step.
        emb_dim: the models' width.
        n_heads: heads per layer.
        n_layers: layers.
        lr: AdamW's learning rate.
        num_threads: torch threads while training (restored after), or None to leave it.

    Returns:
        A [`RecallComparison`][attention.lab.recall.RecallComparison].

    Raises:
        ValueError: a size below 1 (`n` below 2), or `lr` not a finite number above 0.
        FloatingPointError: a loss stopped being finite.
    """
    sizes = {
        "steps": steps,
        "n": n,
        "batch_size": batch_size,
        "emb_dim": emb_dim,
        "n_heads": n_heads,
        "n_layers": n_layers,
    }
    for name, value in sizes.items():
        check_size(name, value, minimum=2 if name == "n" else 1)
    check_positive("lr", lr)
    vocab_size = len(set(gpt2_encoding().encode(sample_text())))  # chapter 16's vocabulary
    cfg: dict[str, object] = {
        "vocab_size": vocab_size,
        "context_length": 2 * n,
        "emb_dim": emb_dim,
        "n_heads": n_heads,
        "n_layers": n_layers,
        "drop_rate": 0.0,
        "qkv_bias": False,
    }
    probe = repeated_tokens(64, n, vocab_size, torch.Generator().manual_seed(seed + 1))
    runs = {}
    with torch_threads(num_threads):
        for kind, positions in [
            ("full_attention", {"rope_base": 10000.0}),
            ("linear_attention", {}),
        ]:
            kinds = {"layer_types": [kind] * n_layers, **positions}
            runs[kind] = _train(cfg | kinds, seed, steps, batch_size, n, lr, probe)
    return RecallComparison(
        runs["full_attention"],
        runs["linear_attention"],
        n,
        steps,
        emb_dim // n_heads,
        1.0 / vocab_size,
    )
