"""The production module's targets: not timed tests, but ratios printed and recorded.

Each target compares two rows of the same run (same machine, same minute), so it survives a
change of machine; `met` is `None` where a row it needs was not measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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
    for the Hugging Face comparisons) is left out, not failed. Each family of targets is a
    function of its own, run in the order of `_FAMILIES`.
    """
    run = _Run(rows, dtype, sweep_dtype, sweep_tokens)
    return [target for family in _FAMILIES for target in family(run)]


@dataclass(frozen=True)
class _Run:
    """The rows of one run, and the rows the targets compare."""

    rows: list[dict[str, Any]]
    dtype: str
    sweep_dtype: str
    sweep_tokens: Sequence[int]

    @property
    def longest(self) -> int:
        return max(self.sweep_tokens)

    @property
    def half(self) -> int:
        """The sweep's next-to-longest length (the longest, if the sweep has only one)."""
        return sorted(self.sweep_tokens)[-2] if len(self.sweep_tokens) > 1 else self.longest

    def gpt2(self, impl: str) -> dict[str, Any] | None:
        """`impl`'s forward+backward row at the GPT-2 shape, in `dtype`."""
        return find(
            self.rows, impl=impl, experiment="gpt2", dtype=self.dtype, mode="forward_backward"
        )

    def sweep(self, impl: str, num_tokens: int | None = None) -> dict[str, Any] | None:
        """`impl`'s forward row in the sweep, in `sweep_dtype`, at `num_tokens` or the longest."""
        num_tokens = self.longest if num_tokens is None else num_tokens
        return find(
            self.rows,
            impl=impl,
            experiment="sweep",
            dtype=self.sweep_dtype,
            mode="forward",
            num_tokens=num_tokens,
        )

    def decode(self, impl: str, batch: int) -> dict[str, Any] | None:
        return find(self.rows, experiment="decode", impl=impl, batch=batch)


def _target(
    name: str, value: float | None, limit: float, what: str, at_least: bool = False
) -> dict[str, Any]:
    """One target as a results file records it: `value` against `limit`, from above or below."""
    met = None if value is None else (value >= limit if at_least else value <= limit)
    return {
        "target": name,
        "value": value,
        "limit": limit,
        "at_least": at_least,
        "met": met,
        "what": what,
    }


def _time_at_gpt2(run: _Run) -> Iterator[dict[str, Any]]:
    """Forward+backward time at the GPT-2 shape, against SDPA and nn.MultiheadAttention."""
    prod, ref, mha = run.gpt2("production"), run.gpt2(REFERENCE), run.gpt2("torch_mha_weights")
    if prod and ref:
        yield _target(
            "fwd+bwd time vs SDPA reference (GPT-2 shape)",
            prod["median_s"] / ref["median_s"],
            1.05,
            "production / sdpa_reference",
        )
    if prod and mha:
        yield _target(
            "fwd+bwd time vs torch.nn.MultiheadAttention (GPT-2 shape)",
            prod["median_s"] / mha["median_s"],
            0.85,
            "production / torch_mha_weights (nn.MultiheadAttention's default need_weights=True)",
        )


def _memory_at_longest(run: _Run) -> Iterator[dict[str, Any]]:
    """Peak forward memory at the sweep's longest length: against SDPA, and right-padded."""
    prod, ref = run.sweep("production"), run.sweep(REFERENCE)
    padded = run.sweep("production_padded")
    for name, row, base, limit, what in (
        ("production vs SDPA reference", prod, ref, 1.10, "production / sdpa_reference"),
        ("right-padded vs unpadded", padded, prod, 1.25, "production_padded / production"),
    ):
        if row and base and row.get("peak_bytes") and base.get("peak_bytes"):
            yield _target(
                f"peak forward memory at {run.longest} tokens, {name}",
                row["peak_bytes"] / base["peak_bytes"],
                limit,
                f"{what}, bytes allocated during the forward",
            )


def _grouped_query(run: _Run) -> Iterator[dict[str, Any]]:
    """Grouped-query heads take no longer than as many full heads, at the GPT-2 shape."""
    prod, gqa = run.gpt2("production"), run.gpt2("production_gqa")
    if prod and gqa:
        yield _target(
            "fwd+bwd time, grouped-query (num_kv_heads = num_heads / 4) vs MHA (GPT-2 shape)",
            gqa["median_s"] / prod["median_s"],
            1.05,
            "production_gqa / production",
        )


def _window(run: _Run) -> Iterator[dict[str, Any]]:
    """A sliding window's forward memory: linear in the length, and below causal attention's."""
    longest, half = run.longest, run.half
    window_long, window_half = run.sweep("production_window"), run.sweep("production_window", half)
    if window_long and window_half and window_half.get("peak_bytes"):
        per_token = window_long["peak_bytes"] / longest
        yield _target(
            f"windowed forward memory per token, {longest} over {half} tokens",
            per_token / (window_half["peak_bytes"] / half),
            1.1,
            "production_window peak bytes / num_tokens: flat when memory grows like T, not T^2",
        )
    causal = run.sweep("production")
    if window_long and causal and causal.get("peak_bytes"):
        yield _target(
            f"windowed forward peak memory vs causal attention at {longest} tokens",
            window_long["peak_bytes"] / causal["peak_bytes"],
            1.0,
            "production_window / production, bytes allocated during the forward",
        )


def _decode(run: _Run) -> Iterator[dict[str, Any]]:
    """Batch-1 generation: the cache's speedup, and the fraction of each bandwidth limit."""
    row = run.decode("gpt2_124m", 1)
    if not row:
        return
    yield _target(
        f"generation speedup from the cache, prompt {row['num_tokens']}, "
        f"{row['new_tokens']} new tokens, batch 1",
        row["generation_speedup"],
        4.0,
        "time without the cache / time with it",
        at_least=True,
    )
    yield _target(
        DECODE_FRACTION,
        row["fraction_of_limit"],
        0.5,
        "tokens/s over read bandwidth / (bytes of every weight + of the cache)",
        at_least=True,
    )
    yield _target(
        DECODE_READ_FRACTION,
        row["fraction_of_read_limit"],
        0.6,
        "tokens/s over read bandwidth / (bytes of the weights read, without the embedding "
        "tables, + of the cache)",
        at_least=True,
    )


def _vs_hugging_face(run: _Run) -> Iterator[dict[str, Any]]:
    """Cached decode at batch 1 and 8, and batch-1 prefill, against HF's GPT-2 on our weights."""
    ours = {batch: run.decode("gpt2_124m", batch) for batch in (1, 8)}
    hf = {batch: run.decode("hf_gpt2", batch) for batch in ours}
    for batch, limit in ((1, 1.3), (8, 1.0)):
        mine, theirs = ours[batch], hf[batch]
        if mine and theirs:
            version, attn = theirs.get("transformers"), theirs.get("attn_implementation")
            yield _target(
                f"batch-{batch} decode tokens/s vs HF GPT-2",
                mine["cached_tokens_per_s"] / theirs["cached_tokens_per_s"],
                limit,
                f"gpt2_124m / hf_gpt2 (transformers {version}, {attn} attention), cached decode "
                "tokens/s, the same weights",
                at_least=True,
            )
    if ours[1] and hf[1]:
        yield _target(
            "batch-1 prefill time vs HF GPT-2",
            ours[1]["prefill_s"] / hf[1]["prefill_s"],
            1.0,
            "gpt2_124m / hf_gpt2, one forward over the prompt filling a cache",
        )


def _padded_batch(run: _Run) -> Iterator[dict[str, Any]]:
    """A padded batch: no slower per token than its prompts one by one, nor than HF's batch."""
    batch = find(run.rows, experiment="padded_batch", impl="gpt2_124m", way="padded_batch")
    if not batch:
        return
    lengths = ", ".join(map(str, batch["lengths"]))
    for name, value, what in (
        (
            "one by one",
            batch.get("time_per_token_vs_one_by_one"),
            "time per token, the padded batch / the same prompts generated one after another",
        ),
        (
            "HF GPT-2's padded batch",
            batch.get("time_vs_hf"),
            "gpt2_124m / hf_gpt2, generate with the same attention_mask, the same weights",
        ),
    ):
        if value is not None:
            yield _target(
                f"padded batch of prompts of {lengths} tokens, time vs {name}", value, 1.0, what
            )


def _construction(run: _Run) -> Iterator[dict[str, Any]]:
    """Building a module for a long context is quick: it fills no T x T buffer."""
    construct = find(run.rows, experiment="construct")
    if construct:
        yield _target(
            f"construction time at context_length={construct['context_length']} (s)",
            construct["median_s"],
            0.1,
            "MultiHeadAttention(768, 768, context_length, 0.0, 12), wall time",
        )


def _long_window(run: _Run) -> Iterator[dict[str, Any]]:
    """A long window skips the hidden work: against causal, and against its own core (CUDA)."""
    rows = {row["impl"]: row for row in run.rows if row.get("experiment") == "window"}
    if "flex_core" not in rows:  # FlexAttention's core is measured on CUDA only
        return
    window, causal = rows["window"]["median_s"], rows["causal"]["median_s"]
    least = rows["flex_core"]["median_s"] + rows["projections"]["median_s"]
    shape = f"T={rows['window']['num_tokens']}, window {rows['window']['window']}"
    yield _target(
        f"windowed layer speedup over causal ({shape})",
        causal / window,
        5.0,
        "causal layer time / windowed layer time",
        at_least=True,
    )
    yield _target(
        f"windowed layer vs FlexAttention's core + projections ({shape})",
        window / least,
        1.3,
        "windowed layer / (flex core + 4 projections)",
    )


_FAMILIES: tuple[Callable[[_Run], Iterator[dict[str, Any]]], ...] = (
    _time_at_gpt2,
    _memory_at_longest,
    _grouped_query,
    _window,
    _decode,
    _vs_hugging_face,
    _padded_batch,
    _construction,
    _long_window,
)
"""Every family of targets, in the order a run records and prints them."""
