"""Split-KV decoding on this CPU: where do chunks of keys computed at once pay?

`python -m attention_bench.split_kv [--quick]` times one decode step's attention (one query
per head over a long cache, [`split_kv_attention`][attention.layer.split_kv.split_kv_attention])
for each number of chunks, computed one after another or on two Python threads, under one or
two intra-op threads of torch. Every time is printed as a ratio to one chunk in one pass at the
same torch threads, all in one run, so that the machine's load hits every ratio alike
(rotating rounds, [`measure`][attention_bench.measuring.measure]). Nothing is stored: the
numbers belong to the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from functools import partial

import torch

from attention.lab.threads import torch_threads
from attention.layer.masks import causal
from attention.layer.split_kv import split_kv_attention
from attention_bench.measuring import Device, measure, milliseconds

__all__ = ["SHAPE", "SPLITS", "main", "split_kv_times"]

SHAPE = {"batch": 1, "num_heads": 8, "num_keys": 16_384, "head_dim": 64}
"""One decode step: one query per head over a 16k-token cache, float32."""
SPLITS = (1, 2, 4, 8, 16)
"""The numbers of chunks timed."""


def _steps(shape: dict[str, int]) -> dict[tuple[int, int], Callable[[], object]]:
    """`(num_splits, workers)` -> one step's attention."""
    g = torch.Generator().manual_seed(0)
    b, h, s, d = (shape[n] for n in ("batch", "num_heads", "num_keys", "head_dim"))
    q = torch.randn(b, h, 1, d, generator=g)  # the new token's query, at position s - 1
    k, v = torch.randn(2, b, h, s, d, generator=g).unbind(0)  # the cache
    steps: dict[tuple[int, int], Callable[[], object]] = {}
    for n in (n for n in SPLITS if n <= s):
        for w in (1, 2) if n > 1 else (1,):
            steps[n, w] = partial(
                split_kv_attention, q, k, v, num_splits=n, workers=w, mask=causal()
            )
    return steps


def split_kv_times(
    shape: dict[str, int] = SHAPE, threads: Sequence[int] = (1, 2), budget_s: float = 4.0
) -> dict[int, dict[tuple[int, int], float]]:
    """Median seconds per step: `{torch threads: {(num_splits, workers): seconds}}`."""
    out = {}
    for t in threads:
        with torch_threads(t), torch.no_grad():
            steps = _steps(shape)
            named = {f"{n}x{w}": step for (n, w), step in steps.items()}
            timings = measure(
                named, Device("cpu"), budget_s=budget_s, min_repeats=5, max_repeats=50, memory=False
            )
        out[t] = {key: statistics.median(timings[f"{key[0]}x{key[1]}"].times_s) for key in steps}
    return out


def report(times: dict[int, dict[tuple[int, int], float]]) -> str:
    """One line per configuration: its time, and its ratio to one pass at its torch threads."""
    lines = [f"{'torch threads':>13} {'splits':>6} {'workers':>7} {'time':>9} {'vs one pass':>11}"]
    for t, row in times.items():
        base = row[(1, 1)]
        for (n, w), seconds in row.items():
            lines.append(
                f"{t:>13} {n:>6} {w:>7} {milliseconds(seconds):>9} {seconds / base:>10.2f}x"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    """Time, print and return the table."""
    parser = argparse.ArgumentParser(prog="python -m attention_bench.split_kv")
    parser.add_argument("--quick", action="store_true", help="a tiny cache, to test the script")
    args = parser.parse_args(argv)
    shape = {**SHAPE, "num_keys": 64} if args.quick else SHAPE
    table = report(split_kv_times(shape, budget_s=0.05 if args.quick else 4.0))
    print(f"split-KV decoding, {shape}, float32, on {torch.get_num_threads()} max threads")
    print(table)
    return table


if __name__ == "__main__":
    main()
    sys.exit(0)
