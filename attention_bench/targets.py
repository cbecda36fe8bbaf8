"""The production module's targets: not timed tests, but ratios printed and recorded.

Each target compares two rows of the same run (same machine, same minute), so it survives a
change of machine; `met` is `None` where a row it needs was not measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attention_bench.implementations import REFERENCE
from attention_bench.results import find

__all__ = ["DECODE_FRACTION", "DECODE_READ_FRACTION", "check_targets"]

DECODE_FRACTION = "batch-1 decode, fraction of the bandwidth limit"
"""The target on the all-weights limit (the report adds the weights-read fraction to it)."""
DECODE_READ_FRACTION = "batch-1 decode, fraction of the weights-read limit"
"""The target on the stricter limit, without the embedding tables."""


def check_targets(
    rows: list[dict[str, Any]], dtype: str, sweep_dtype: str, sweep_tokens: Sequence[int]
) -> list[dict[str, Any]]:
    """The production module's targets, judged from the rows of one run.

    Time at the GPT-2 shape in `dtype`; memory at the longest of `sweep_tokens` in
    `sweep_dtype`; generation at batch 1; construction at the recorded `context_length`.
    A target whose rows are missing (an implementation skipped, `transformers` not installed
    for the Hugging Face comparisons) is left out, not failed.
    """
    targets = []

    def target(
        name: str, value: float | None, limit: float, what: str, at_least: bool = False
    ) -> None:
        met = None if value is None else (value >= limit if at_least else value <= limit)
        targets.append({"target": name, "value": value, "limit": limit, "at_least": at_least,
                        "met": met, "what": what})  # fmt: skip

    gpt2 = {"experiment": "gpt2", "dtype": dtype, "mode": "forward_backward"}
    prod, ref = find(rows, impl="production", **gpt2), find(rows, impl=REFERENCE, **gpt2)
    mha = find(rows, impl="torch_mha_weights", **gpt2)
    if prod and ref:
        target(
            "fwd+bwd time vs SDPA reference (GPT-2 shape)",
            prod["median_s"] / ref["median_s"],
            1.05,
            "production / sdpa_reference",
        )
    if prod and mha:
        target(
            "fwd+bwd time vs torch.nn.MultiheadAttention (GPT-2 shape)",
            prod["median_s"] / mha["median_s"],
            0.85,
            "production / torch_mha_weights (nn.MultiheadAttention's default need_weights=True)",
        )
    longest = max(sweep_tokens)
    sweep = {"experiment": "sweep", "dtype": sweep_dtype, "mode": "forward", "num_tokens": longest}
    ref_mem, prod_mem = find(rows, impl=REFERENCE, **sweep), find(rows, impl="production", **sweep)
    right_mem = find(rows, impl="production_padded", **sweep)
    for name, row, base, limit, what in (
        ("production vs SDPA reference", prod_mem, ref_mem, 1.10, "production / sdpa_reference"),
        ("right-padded vs unpadded", right_mem, prod_mem, 1.25, "production_padded / production"),
    ):
        if row and base and row.get("peak_bytes") and base.get("peak_bytes"):
            target(
                f"peak forward memory at {longest} tokens, {name}",
                row["peak_bytes"] / base["peak_bytes"],
                limit,
                f"{what}, bytes allocated during the forward",
            )
    gqa = find(rows, impl="production_gqa", **gpt2)
    if prod and gqa:
        target(
            "fwd+bwd time, grouped-query (num_kv_heads = num_heads / 4) vs MHA (GPT-2 shape)",
            gqa["median_s"] / prod["median_s"],
            1.05,
            "production_gqa / production",
        )
    half = sorted(sweep_tokens)[-2] if len(sweep_tokens) > 1 else longest
    window_long = find(rows, impl="production_window", **sweep)
    window_half = find(rows, impl="production_window", **{**sweep, "num_tokens": half})
    if window_long and window_half and window_half.get("peak_bytes"):
        per_token = window_long["peak_bytes"] / longest
        target(
            f"windowed forward memory per token, {longest} over {half} tokens",
            per_token / (window_half["peak_bytes"] / half),
            1.1,
            "production_window peak bytes / num_tokens: flat when memory grows like T, not T^2",
        )
    causal_mem = find(rows, impl="production", **sweep)
    if window_long and causal_mem and causal_mem.get("peak_bytes"):
        target(
            f"windowed forward peak memory vs causal attention at {longest} tokens",
            window_long["peak_bytes"] / causal_mem["peak_bytes"],
            1.0,
            "production_window / production, bytes allocated during the forward",
        )
    ours = {1: find(rows, experiment="decode", impl="gpt2_124m", batch=1),
            8: find(rows, experiment="decode", impl="gpt2_124m", batch=8)}  # fmt: skip
    if ours[1]:
        row = ours[1]
        target(
            f"generation speedup from the cache, prompt {row['num_tokens']}, "
            f"{row['new_tokens']} new tokens, batch 1",
            row["generation_speedup"],
            4.0,
            "time without the cache / time with it",
            at_least=True,
        )
        target(
            DECODE_FRACTION,
            row["fraction_of_limit"],
            0.5,
            "tokens/s over read bandwidth / (bytes of every weight + of the cache)",
            at_least=True,
        )
        target(
            DECODE_READ_FRACTION,
            row["fraction_of_read_limit"],
            0.6,
            "tokens/s over read bandwidth / (bytes of the weights read, without the embedding "
            "tables, + of the cache)",
            at_least=True,
        )
    hf = {batch: find(rows, experiment="decode", impl="hf_gpt2", batch=batch) for batch in ours}
    for batch, limit in ((1, 1.3), (8, 1.0)):
        mine, theirs = ours[batch], hf[batch]
        if mine and theirs:
            version, attn = theirs.get("transformers"), theirs.get("attn_implementation")
            target(
                f"batch-{batch} decode tokens/s vs HF GPT-2",
                mine["cached_tokens_per_s"] / theirs["cached_tokens_per_s"],
                limit,
                f"gpt2_124m / hf_gpt2 (transformers {version}, {attn} attention), cached decode "
                "tokens/s, the same weights",
                at_least=True,
            )
    if ours[1] and hf[1]:
        target(
            "batch-1 prefill time vs HF GPT-2",
            ours[1]["prefill_s"] / hf[1]["prefill_s"],
            1.0,
            "gpt2_124m / hf_gpt2, one forward over the prompt filling a cache",
        )
    targets += _padded_batch_targets(rows)
    construct = find(rows, experiment="construct")
    if construct:
        target(
            f"construction time at context_length={construct['context_length']} (s)",
            construct["median_s"],
            0.1,
            "MultiHeadAttention(768, 768, context_length, 0.0, 12), wall time",
        )
    return targets


def _padded_batch_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A padded batch: no slower per token than its prompts one by one, nor than HF's batch."""
    batch = find(rows, experiment="padded_batch", impl="gpt2_124m", way="padded_batch")
    if not batch:
        return []
    lengths = ", ".join(map(str, batch["lengths"]))
    found = [
        ("one by one", batch.get("time_per_token_vs_one_by_one"),
         "time per token, the padded batch / the same prompts generated one after another"),
        ("HF GPT-2's padded batch", batch.get("time_vs_hf"),
         "gpt2_124m / hf_gpt2, generate with the same attention_mask, the same weights"),
    ]  # fmt: skip
    return [
        {"target": f"padded batch of prompts of {lengths} tokens, time vs {name}",
         "value": value, "limit": 1.0, "at_least": False, "met": value <= 1.0, "what": what}
        for name, value, what in found if value is not None
    ]  # fmt: skip
