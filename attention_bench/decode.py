r"""Generation: prefill, cached and uncached decoding, and the memory-bandwidth limit.

Decoding one token at batch $b$ reads every weight once and every cached key and value once,
and does little arithmetic with each number read; it waits for memory. Its limit is

$$
\text{tokens/s} \le b \cdot \frac{R}{\begin{array}{c} \text{bytes of the weights} \\
{} + \text{bytes of the cache} \end{array}},
$$

with $R$ the machine's read bandwidth ([`roof`][attention_bench.measuring.roof]: the fastest
sum over 1 GiB, since a step reads and barely writes). The token
embedding is only indexed (one row per token), so the weights actually read per token are
fewer than all of them; both limits are recorded.

Where `transformers` is installed, Hugging Face's GPT-2 on the same weights is timed in the
same rounds ([`generation`][attention_bench.generation]), against the same limits computed
from its own parameters.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import Tensor

from attention.layer.multihead import MultiHeadAttention
from attention.model.gpt import GPT_CONFIG_124M, GPTModel
from attention.model.shapes import ModelShape, kv_cache_bytes
from attention_bench import hf as hf_gpt2
from attention_bench.generation import (
    Contender,
    Times,
    graphed_contender,
    hf_contender,
    our_contender,
    time_contenders,
)
from attention_bench.measuring import ROOF_BYTES, Device, Timing, measure, roof

__all__ = [
    "BATCHES",
    "NEW_TOKENS",
    "PROMPT_TOKENS",
    "ROUNDS",
    "decode_rows",
    "gemv_bandwidths",
    "limits",
    "step_parts",
]

PROMPT_TOKENS, NEW_TOKENS = 256, 32
"""What is measured: a prompt of 256 tokens, then 32 new ones."""
BATCHES = {1: 8, 8: 2}
"""Batch sizes, and the uncached steps timed at each: each runs the whole prefix again."""
ROUNDS = {1: 3, 8: 2}
"""Timed rounds at each batch size, after a warm-up round: each contender's prefill, decode
steps and whole generation once a round, the contenders' order alternating."""


def _shape(cfg: dict[str, Any]) -> ModelShape:
    h, layers, d = cfg["n_heads"], cfg["n_layers"], cfg["emb_dim"]
    return ModelShape("GPT-2 124M", layers, d, h, cfg.get("n_kv_heads") or h, d // h)


def limits(
    model: GPTModel,
    batch: int,
    cached_tokens: int,
    bytes_per_s: float,
    weights: tuple[int, int] | None = None,
) -> dict[str, float]:
    """Tokens/s the memory bandwidth allows at one decode step: all weights, and those read.

    `weights` (bytes of every weight, of the embedding tables) defaults to `model`'s; the
    cache is `model`'s shape at `cached_tokens`.
    """
    if weights is None:
        tables = [model.tok_emb] + ([] if model.pos_emb is None else [model.pos_emb])
        weights = (
            sum(p.numel() * p.element_size() for p in model.parameters()),
            sum(t.weight.numel() * t.weight.element_size() for t in tables),
        )
    total, indexed = weights
    att: MultiHeadAttention = model.trf_blocks[0].att  # type: ignore[assignment]
    cfg = {
        "n_layers": len(model.trf_blocks),
        "emb_dim": model.tok_emb.weight.shape[1],
        "n_heads": att.num_heads,
        "n_kv_heads": att.num_kv_heads,
    }
    cache = kv_cache_bytes(_shape(cfg), cached_tokens, batch, bytes_per_number=4)
    return {
        "weights_bytes": total,
        "read_weights_bytes": total - indexed,
        "cache_bytes": cache,
        "limit_tokens_per_s": batch * bytes_per_s / (total + cache),
        "limit_read_tokens_per_s": batch * bytes_per_s / (total - indexed + cache),
    }


def _uncached_s(model: GPTModel, prompt: Tensor, n_steps: int, device: Device) -> float:
    """Median time of a step without a cache: the whole prefix again."""
    idx, uncached = prompt, []
    with torch.no_grad():
        for _ in range(n_steps):
            start = time.perf_counter()
            logits = model(idx)
            device.sync()
            uncached.append(time.perf_counter() - start)
            idx = torch.cat((idx, logits[:, -1].argmax(dim=-1, keepdim=True)), dim=1)
    return statistics.median(uncached)


def decode_rows(
    device: Device | None = None,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    prompt_tokens: int = PROMPT_TOKENS,
    new_tokens: int = NEW_TOKENS,
    hf: bool = True,
    roof_bytes: int = ROOF_BYTES,
    dtype: torch.dtype = torch.float32,
) -> list[dict[str, Any]]:
    """Prefill and decode of a GPT (default: the book's 124M, dropout 0, eval, float32).

    On CUDA, ours also takes the static step recorded in one CUDA graph (`impl`
    `"gpt2_124m_graph"`, [`attention.model.decode`][attention.model.decode]).

    With `hf` and `transformers` installed, Hugging Face's GPT-2 on the same weights
    ([`to_hf_gpt2`][attention_bench.hf.to_hf_gpt2]) is timed in the same rounds, taking
    turns with ours: a row of its own (`impl` `"hf_gpt2"`), and ours over its on our row.
    Without `transformers`, its rows say so (`skipped`). The read bandwidth of the limits is
    measured over `roof_bytes` ([`roof`][attention_bench.measuring.roof]).
    """
    device = device or Device.from_env()
    torch.manual_seed(seed)
    config = {**(config or GPT_CONFIG_124M), "drop_rate": 0.0}
    model = GPTModel(config).to(device.type, dtype).eval()
    bandwidth = roof(device, nbytes=roof_bytes).read_bytes_per_s
    n_prompt, n_new = prompt_tokens, new_tokens
    contenders = [our_contender(model, n_prompt + n_new)]
    if device.type == "cuda":
        contenders.append(graphed_contender(model, n_prompt + n_new))
    missing = hf_gpt2.missing()
    if hf and missing is None:
        contenders.append(hf_contender(model))
    rows = []
    for i, (batch, n_uncached) in enumerate(BATCHES.items()):
        prompt = torch.randint(0, model.vocab_size, (batch, n_prompt), device=device.type)
        times = time_contenders(contenders, prompt, n_new, ROUNDS[batch], device, i == 0)
        uncached_s = _uncached_s(model, prompt, n_uncached, device)
        base = {
            "experiment": "decode",
            "mode": "decode",
            "device": device.type,
            "dtype": str(dtype).removeprefix("torch."),
            "batch": batch,
            "num_tokens": n_prompt,
            "new_tokens": n_new,
        }
        by_impl = {}
        for c in contenders:
            t = times[c.impl]
            bound = limits(model, batch, n_prompt + n_new // 2, bandwidth, c.weights)
            by_impl[c.impl] = _row(base, c, t, bandwidth, bound)
        ours = by_impl["gpt2_124m"]
        ours["uncached_tokens_per_s"] = batch / uncached_s
        # the whole generation: prefill + n_new cached steps, against n_new uncached ones
        ours["generation_speedup"] = (
            n_new * uncached_s / (ours["prefill_s"] + n_new * ours["median_s"])
        )
        _versus_hf(by_impl)
        rows += list(by_impl.values())
        if hf and missing is not None:
            rows.append({**base, "impl": "hf_gpt2", "skipped": missing})
    return rows


def _row(
    base: dict[str, Any], c: Contender, t: Times, bandwidth: float, bound: dict[str, float]
) -> dict[str, Any]:
    """Contender `c`'s row at `base`'s batch: its prefill, decode steps and generation (`t`),
    and how near its decode comes to the `bound` of its reading its weights at `bandwidth`."""
    batch = base["batch"]
    step_s, prefill_s = statistics.median(t.steps), statistics.median(t.prefill)
    return {
        **base,
        "impl": c.impl,
        "prefill_s": prefill_s,
        "prefill_times_s": t.prefill,
        **Timing(t.steps).summary(),  # the decode steps: median_s, quartiles, times
        "cached_tokens_per_s": batch / step_s,
        "generate_s": statistics.median(t.generate),
        "generate_times_s": t.generate,
        "read_bytes_per_s": bandwidth,
        **bound,
        "fraction_of_limit": batch / step_s / bound["limit_tokens_per_s"],
        "fraction_of_read_limit": batch / step_s / bound["limit_read_tokens_per_s"],
        **(c.extra or {}),
    }


def _versus_hf(by_impl: dict[str, dict[str, Any]]) -> None:
    """Ours (eager, and graphed on CUDA) over Hugging Face's: > 1 faster for a rate."""
    theirs = by_impl.get("hf_gpt2")
    for mine in (by_impl["gpt2_124m"], by_impl.get("gpt2_124m_graph")):
        if theirs is not None and mine is not None:
            mine["decode_speed_vs_hf"] = mine["cached_tokens_per_s"] / theirs["cached_tokens_per_s"]
            mine["prefill_time_vs_hf"] = mine["prefill_s"] / theirs["prefill_s"]
            mine["generate_time_vs_hf"] = mine["generate_s"] / theirs["generate_s"]


def gemv_bandwidths(device: Device | None = None) -> dict[str, float]:
    """Bytes/s read by one decode step's largest product, the vocabulary head, two ways.

    `nn.Linear` stores its weight `(out, in)`; at batch 1 its product is a matrix-vector
    product over that layout. The same product over the weight stored `(in, out)`, and a plain
    sum over as many bytes (pure reading), show how much of the bandwidth each layout gets.
    """
    device = device or Device.from_env()
    out_features, in_features = GPT_CONFIG_124M["vocab_size"], GPT_CONFIG_124M["emb_dim"]
    weight = torch.randn(out_features, in_features, device=device.type)  # (out, in)
    weight_in_out = weight.t().contiguous()  # (in, out)
    x = torch.randn(1, in_features, device=device.type)
    nbytes = weight.numel() * weight.element_size()
    timings = measure(
        {
            "nn.Linear layout (out, in)": lambda: torch.nn.functional.linear(x, weight),
            "transposed layout (in, out)": lambda: x @ weight_in_out,
            "reading alone (a sum)": lambda: weight.sum(),
        },
        device,
        budget_s=0.5,
        min_repeats=5,
        max_repeats=10,
        memory=False,
    )
    return {name: nbytes / min(t.times_s) for name, t in timings.items()}


def step_parts(
    model: GPTModel, device: Device | None = None, prompt_tokens: int = PROMPT_TOKENS
) -> dict[str, float]:
    """Seconds of one batch-1 decode step of `model`, and of its matrix products alone.

    The products are every `nn.Linear` of the model applied in its order to a one-token input:
    the weights a step must read, and nothing else. The rest of the step is what surrounds
    them: the norms, the attention over the cache, and the Python between the kernels.

    Returns:
        `{"step_s": ..., "products_s": ...}`, the fastest of several runs each.
    """
    device = device or Device.from_env()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weight = model.tok_emb.weight
    inputs = {
        m.in_features: torch.randn(1, 1, m.in_features, device=weight.device, dtype=weight.dtype)
        for m in linears
    }
    token = torch.zeros(1, 1, dtype=torch.long, device=weight.device)
    with torch.no_grad():
        caches = model.init_caches(1, prompt_tokens + 1)
        model.logits(token.expand(1, prompt_tokens), caches)

        def step() -> None:
            for cache in caches:  # every run writes position `prompt_tokens` again
                cache.length = prompt_tokens
            model(token, caches=caches)

        def products() -> None:
            for m in linears:
                m(inputs[m.in_features])

        timings = measure(
            {"step": step, "products": products},
            device,
            budget_s=1.0,
            min_repeats=10,
            max_repeats=30,
            memory=False,
        )
    return {f"{name}_s": min(t.times_s) for name, t in timings.items()}
