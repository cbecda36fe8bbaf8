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
    """How the next token is chosen from the last position's logits."""

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
    """`generate`'s sampling arguments, each checked by name."""
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
