"""How [`generate`][attention.model.generation.generate] picks each next token: greedy, or a
draw at a temperature from the `top_k` most likely tokens or the `top_p` nucleus, with the
caller's generators; and the checks of those arguments."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attention.checks import check_size
from attention.model.gpt import GPTModel

__all__ = ["Sampling", "check_sampling", "nucleus"]


@dataclass(frozen=True)
class Sampling:
    r"""How the next token is chosen from the last position's logits.

    Attributes:
        temperature: $\tau$; the draw is from $\operatorname{softmax}(z / \tau)$, and 0 (or
            a value too small to divide float32 by) is greedy, the argmax.
        top_k: draw only from the `top_k` highest logits; None: from all.
        top_p: draw only from the nucleus, the most likely tokens whose probabilities first
            reach `top_p` (`nucleus`); None: from all.
        generator: the random numbers: one `torch.Generator` for the batch, one per row
            (a tuple), or None for torch's global one.

    Examples:
        >>> logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
        >>> Sampling().next_token(logits)  # temperature 0: greedy
        tensor([[1],
                [0]])
        >>> draw = Sampling(temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(0))
        >>> draw.next_token(logits)  # a draw from the one highest: the argmax again
        tensor([[1],
                [0]])
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | tuple[torch.Generator, ...] | None = None

    def next_token(self, logits: Tensor) -> Tensor:
        """`(b, vocab)` -> `(b, 1)`: greedy at temperature 0, else a draw."""
        # 0, or too small to divide float32 by (the draw's dtype, whatever the model's): the
        # limit of softmax(z / tau) as tau -> 0 is the argmax, greedy
        if self.temperature < torch.finfo(torch.float32).tiny:
            return torch.argmax(logits, dim=-1, keepdim=True)  # (b, 1): greedy
        # Drawn in float32 whatever the model's dtype, as Hugging Face's generate draws: on
        # CUDA, torch.multinomial's exponential draws depend on the dtype (float64 takes
        # other random numbers than float32), so one seed gives the same tokens either way.
        logits = logits.float()
        # z / tau, less its max: a tiny temperature then gives 0 and -inf, never inf - inf
        logits = (logits - logits.max(dim=-1, keepdim=True).values) / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k).values[:, -1:]  # (b, 1): the k-th highest
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            logits = nucleus(logits, self.top_p)
        probs = torch.softmax(logits, dim=-1)  # (b, vocab)
        if not isinstance(self.generator, tuple):  # one generator (or the global one)
            return torch.multinomial(probs, num_samples=1, generator=self.generator)
        rows = zip(probs, self.generator, strict=True)  # one generator per row
        return torch.cat([torch.multinomial(row[None], 1, generator=gen) for row, gen in rows])


def nucleus(logits: Tensor, top_p: float) -> Tensor:
    """Keep the most likely tokens whose probabilities first reach `top_p` (at least one).

    As Hugging Face's `TopPLogitsWarper`: sorted from least likely, a token goes while the
    probability up to and including it is at most `1 - top_p`.

    Args:
        logits: `(b, vocab)`.
        top_p: in (0, 1].

    Returns:
        `logits` with the tokens outside the nucleus set to `-inf`.

    Examples:
        >>> probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
        >>> nucleus(probs.log(), top_p=0.8).exp()  # 0.5 + 0.3 reach 0.8
        tensor([[0.5000, 0.3000, 0.0000, 0.0000]])
    """
    sorted_logits, order = torch.sort(logits, descending=False)  # (b, vocab)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1 - top_p
    drop[:, -1] = False  # the most likely token always stays
    return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


def check_sampling(
    model: GPTModel,
    batch_size: int,
    temperature: object,
    top_k: object,
    top_p: object,
    generator: object,
) -> Sampling:
    """`generate`'s sampling arguments, each checked by name, as one `Sampling`.

    Raises:
        TypeError: a temperature or `top_p` that is not a real number (a bool included), a
            `top_k` that is not an int, a generator that is not a `torch.Generator` or a list
            of them.
        ValueError: a negative or non-finite temperature, `top_p` outside (0, 1], `top_k`
            below 1, generators on another device than the model, or a list of them whose
            length is not `batch_size`.

    Examples:
        >>> from attention.model.gpt import GPTModel
        >>> model = GPTModel({"vocab_size": 8, "context_length": 4, "emb_dim": 4,
        ...                   "n_heads": 1, "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False})
        >>> check_sampling(model, 2, temperature=0.7, top_k=None, top_p=0.9, generator=None)
        Sampling(temperature=0.7, top_k=None, top_p=0.9, generator=None)
        >>> check_sampling(model, 2, temperature=1, top_k=None, top_p=1.5, generator=None)
        Traceback (most recent call last):
        ...
        ValueError: top_p must be in (0, 1], got 1.5
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number >= 0, got {temperature!r:.40}")
    tau = float(temperature)
    if not (math.isfinite(tau) and tau >= 0.0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    k = None if top_k is None else check_size("top_k", top_k)
    p = None
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
            raise TypeError(f"top_p must be a number in (0, 1], got {top_p!r:.40}")
        p = float(top_p)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    gens = _check_generator(generator, batch_size, model.tok_emb.weight.device)
    return Sampling(tau, k, p, gens)


def _check_generator(
    generator: object, batch_size: int, device: torch.device
) -> torch.Generator | tuple[torch.Generator, ...] | None:
    if generator is None:
        return None
    gens = (generator,) if isinstance(generator, torch.Generator) else generator
    if not isinstance(gens, Sequence) or not all(isinstance(g, torch.Generator) for g in gens):
        raise TypeError(
            f"generator must be a torch.Generator or a list of one per row, got {generator!r:.60}"
        )
    for g in gens:
        if g.device.type != device.type:
            raise ValueError(
                f"generator must be on the model's device ({device.type}), got "
                f"one on {g.device.type}"
            )
    if isinstance(generator, torch.Generator):
        return generator
    if len(gens) != batch_size:
        raise ValueError(
            f"generator must be one torch.Generator per row: {batch_size} rows, got {len(gens)}"
        )
    return tuple(gens)
