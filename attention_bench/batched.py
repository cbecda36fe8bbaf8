"""Generation of a padded batch: prompts of different lengths together, against one by one.

Four prompts of different lengths (3, 17, 64 and 200 tokens for the committed run) are
left-padded into one batch ([`pad_prompts`][attention.model.generation.pad_prompts]) and generated
together; the same prompts are also generated one after another. Both write the same tokens
(the tests check it; the row records it again), so what differs is the time per token. Where
`transformers` is installed, Hugging Face's GPT-2 on the same weights generates the same padded
batch with its `attention_mask`. The three take turns in every round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from attention.model.generation import generate, pad_prompts
from attention.model.gpt import GPT_CONFIG_124M, GPTModel
from attention_bench import hf as hf_gpt2
from attention_bench.measuring import Device, Timing

__all__ = ["LENGTHS", "padded_batch_rows"]

LENGTHS = (3, 17, 64, 200)
"""The prompts' lengths in the committed run."""


def _contenders(
    model: GPTModel, prompts: list[Tensor], n_new: int, hf: bool
) -> dict[str, Callable[[], Any]]:
    """Each way of generating `n_new` greedy tokens after every prompt."""
    idx, mask = pad_prompts(prompts)
    ways: dict[str, Callable[[], Any]] = {
        "padded_batch": lambda: generate(model, idx, n_new, attention_mask=mask),
        "one_by_one": lambda: [generate(model, p[None], n_new) for p in prompts],
    }
    if hf and hf_gpt2.available():
        their = hf_gpt2.to_hf_gpt2(model)
        ways["hf_padded_batch"] = lambda: their.generate(
            idx,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            pad_token_id=0,
        )
    return ways


def padded_batch_rows(
    device: Device | None = None,
    seed: int = 0,
    config: dict[str, Any] | None = None,
    lengths: Sequence[int] = LENGTHS,
    new_tokens: int = 32,
    rounds: int = 3,
    hf: bool = True,
) -> list[dict[str, Any]]:
    """Time a padded batch's generation, the same prompts one by one, and Hugging Face's batch.

    A warm-up round, then `rounds` rounds in which each way runs once, their order
    alternating. Rows: `impl` `"gpt2_124m"` with `way` `"padded_batch"` and `"one_by_one"`
    (and `"hf_gpt2"`, `"padded_batch"`), each with `median_s`, its quartiles and `s_per_token`
    (time over `len(lengths) * new_tokens` tokens); the padded batch's row also holds
    `time_per_token_vs_one_by_one`, `time_vs_hf` and `same_tokens_as_alone`.
    """
    device = device or Device.from_env()
    torch.manual_seed(seed)
    config = {**(config or GPT_CONFIG_124M), "drop_rate": 0.0}
    model = GPTModel(config).to(device.type).eval()
    prompts = [torch.randint(0, model.vocab_size, (n,), device=device.type) for n in lengths]
    ways = _contenders(model, prompts, new_tokens, hf)
    times: dict[str, list[float]] = {name: [] for name in ways}
    outputs: dict[str, Any] = {}
    with torch.no_grad():
        for r in range(1 + rounds):
            for name in list(ways) if r % 2 else list(ways)[::-1]:
                start = time.perf_counter()
                outputs[name] = ways[name]()
                device.sync()
                if r:  # round 0 warms up
                    times[name].append(time.perf_counter() - start)
    longest = max(lengths)
    pairs = enumerate(zip(prompts, outputs["one_by_one"], strict=True))
    same = all(
        torch.equal(outputs["padded_batch"][i, longest - len(p) :], alone[0])
        for i, (p, alone) in pairs
    )
    tokens = len(lengths) * new_tokens
    base = {
        "experiment": "padded_batch",
        "mode": "generate",
        "device": device.type,
        "dtype": "float32",
        "batch": len(lengths),
        "lengths": list(lengths),
        "num_tokens": longest,
        "new_tokens": new_tokens,
    }
    rows = {
        name: {
            **base,
            "impl": "hf_gpt2" if name.startswith("hf") else "gpt2_124m",
            "way": name.removeprefix("hf_"),
            **Timing(t).summary(),
            "s_per_token": statistics.median(t) / tokens,
        }
        for name, t in times.items()
    }
    batch = rows["padded_batch"]
    batch["same_tokens_as_alone"] = same
    batch["time_per_token_vs_one_by_one"] = batch["median_s"] / rows["one_by_one"]["median_s"]
    if "hf_padded_batch" in rows:
        batch["time_vs_hf"] = batch["median_s"] / rows["hf_padded_batch"]["median_s"]
    return list(rows.values())
