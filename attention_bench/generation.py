"""Generation's contenders, timed in turns: ours and Hugging Face's, on the same weights.

A [`Contender`][attention_bench.generation.Contender] is one implementation's prefill, cached
decode step and whole generation; [`time_contenders`][attention_bench.generation.time_contenders]
times them in rounds, their decode steps taking turns and their order alternating each round,
so that a shared machine's drift hits both alike.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attention.model.decode import StaticDecode
from attention.model.generation import generate
from attention.model.gpt import GPTModel
from attention_bench import hf as hf_gpt2
from attention_bench.measuring import Device

__all__ = [
    "Contender",
    "Times",
    "graphed_contender",
    "hf_contender",
    "our_contender",
    "time_contenders",
]


@dataclass
class Contender:
    """One implementation of generation: a prefill, a cached decode step, a whole generation."""

    impl: str
    prefill: Callable[[Tensor], tuple[Tensor, Any]]  # prompt -> (logits, cache)
    step: Callable[[Tensor, Any], tuple[Tensor, Any]]  # token (b, 1), cache -> (logits, cache)
    generate: Callable[[Tensor, int], Tensor]  # prompt, new tokens -> tokens
    weights: tuple[int, int] | None = None  # bytes of every weight, of the embedding tables
    extra: dict[str, Any] | None = None  # stored in its rows


def our_contender(model: GPTModel, max_tokens: int) -> Contender:
    """Ours: [`GPTModel`][attention.model.gpt.GPTModel] with a cache per block of `max_tokens`, and
    [`generate`][attention.model.generation.generate] (greedy, the dynamic step: `static=False`).
    The caches are allocated in the prefill."""

    def prefill(prompt: Tensor) -> tuple[Tensor, Any]:
        caches = model.init_caches(prompt.shape[0], max_tokens)  # allocated inside the timing
        return model(prompt, caches=caches), caches

    def step(token: Tensor, caches: Any) -> tuple[Tensor, Any]:
        return model(token, caches=caches), caches

    return Contender(
        "gpt2_124m", prefill, step, lambda idx, n: generate(model, idx, n, static=False)
    )


def graphed_contender(model: GPTModel, max_tokens: int) -> Contender:
    """Ours with the static decode step ([`StaticDecode`][attention.model.decode.StaticDecode]):
    on CUDA recorded in one graph at its second step and replayed after; `generate` with
    `static=True`."""

    def prefill(prompt: Tensor) -> tuple[Tensor, Any]:
        caches = model.init_caches(prompt.shape[0], max_tokens)
        logits = model(prompt, caches=caches)
        return logits, StaticDecode(model, caches)

    def step(token: Tensor, decoder: Any) -> tuple[Tensor, Any]:
        return decoder(token)[:, None], decoder  # (b, 1, vocab)

    return Contender(
        "gpt2_124m_graph", prefill, step, lambda idx, n: generate(model, idx, n, static=True)
    )


def hf_contender(model: GPTModel) -> Contender:
    """Hugging Face's GPT-2 holding `model`'s weights
    ([`to_hf_gpt2`][attention_bench.hf.to_hf_gpt2]): its forward with its default cache (a
    `DynamicCache`), and its `generate` (greedy)."""
    hf = hf_gpt2.to_hf_gpt2(model)
    return Contender(
        "hf_gpt2",
        lambda prompt: hf_gpt2.prefill(hf, prompt),
        lambda token, cache: hf_gpt2.decode_step(hf, token, cache),
        lambda idx, n: hf_gpt2.hf_generate(hf, idx, n),
        weights=hf_gpt2.embedding_bytes(hf),
        extra={
            "transformers": hf_gpt2.version(),
            "attn_implementation": hf.config._attn_implementation,
        },
    )


@dataclass
class Times:
    """One contender's times: each prefill, each decode step, each whole generation (s)."""

    prefill: list[float]
    steps: list[float]
    generate: list[float]


def _timed(fn: Callable[[], Any], device: Device) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    device.sync()
    return result, time.perf_counter() - start


def _round(
    contenders: list[Contender],
    prompt: Tensor,
    n_new: int,
    device: Device,
    times: dict[str, Times],
) -> None:
    """Each one's prefill, then `n_new` greedy decode steps, the contenders taking turns.

    Every prefill and every step is timed alone; each step of one contender runs right after
    the same step of the other, so that a drift of the machine hits both alike.
    """
    states = {}
    for c in contenders:  # the whole prompt at once
        states[c.impl], elapsed = _timed(functools.partial(c.prefill, prompt), device)
        times[c.impl].prefill.append(elapsed)
    for _ in range(n_new):  # one token per step, from the cache
        for c in contenders:
            logits, cache = states[c.impl]
            token = logits[:, -1].argmax(dim=-1, keepdim=True)  # (b, 1)
            states[c.impl], elapsed = _timed(functools.partial(c.step, token, cache), device)
            times[c.impl].steps.append(elapsed)


def time_contenders(
    contenders: list[Contender],
    prompt: Tensor,
    n_new: int,
    rounds: int,
    device: Device,
    warm_generate: bool,
) -> dict[str, Times]:
    """A warm-up round, then `rounds` timed ones; the contenders' order alternates each round.

    Each round runs every contender's prefill, then their `n_new` decode steps in turns, then
    every one's whole generation. The warm-up round generates too only with `warm_generate`
    (the first batch size: later ones reuse the warmed code, and their prefill and steps warm
    the kernels).
    """
    times = {c.impl: Times([], [], []) for c in contenders}
    with torch.no_grad():
        for r in range(1 + rounds):
            order = contenders if r % 2 else contenders[::-1]
            warm_up = {c.impl: Times([], [], []) for c in contenders}
            _round(order, prompt, n_new, device, times if r else warm_up)
            if r or warm_generate:
                for c in order:
                    _, elapsed = _timed(functools.partial(c.generate, prompt, n_new), device)
                    if r:
                        times[c.impl].generate.append(elapsed)
    return times
