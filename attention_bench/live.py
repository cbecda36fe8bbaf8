"""The Performance page's live comparison: timed while the page builds, on a busy machine.

The stored results (drawn by [`attention_site.performance`][attention_site.performance]) come
from a quiet benchmark run; these functions print what a build measured next to them, with
the conditions it measured under, so that a reader can tell a difference from noise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from attention_bench.implementations import REFERENCE, Shape
from attention_bench.measuring import Timing
from attention_bench.results import select

__all__ = ["compare_table", "live_conditions", "live_verdict"]


def _range_ms(summary: Mapping[str, float]) -> str:
    """The quartiles, `"43.1-45.9 ms"`: one decimal below 100 ms, where whole milliseconds
    would show two different ranges as the same."""
    q1, q3 = 1e3 * summary["q1_s"], 1e3 * summary["q3_s"]
    digits = 0 if q1 >= 100 else 1
    return f"{q1:.{digits}f}-{q3:.{digits}f} ms"


def _medians_ms(seconds: list[float]) -> list[str]:
    """The medians of one table in milliseconds, all to the same decimals: one below 100 ms (as
    the quartiles), more until medians that differ print differently (at most three).

    Examples:
        >>> _medians_ms([0.0142, 0.0138, 0.0141])
        ['14.2 ms', '13.8 ms', '14.1 ms']
        >>> _medians_ms([0.01412, 0.01408]), _medians_ms([0.25, 0.125])
        (['14.12 ms', '14.08 ms'], ['250 ms', '125 ms'])
    """
    ms = [1e3 * s for s in seconds]
    digits = 0 if min(ms, default=0.0) >= 100 else 1
    while digits < 3 and len({f"{m:.{digits}f}" for m in ms}) < len({round(m, 3) for m in ms}):
        digits += 1
    return [f"{m:.{digits}f} ms" for m in ms]


def _stored_rows(
    stored: Mapping[str, Any] | None, shape: Shape | None, mode: str
) -> dict[str, dict[str, Any]]:
    """`{impl: row}` of the stored run at `shape` and `mode` (its GPT-2 or sweep rows)."""
    if stored is None or shape is None:
        return {}
    at = {
        "mode": mode,
        "batch": shape.batch,
        "num_tokens": shape.num_tokens,
        "d_model": shape.d_model,
        "num_heads": shape.num_heads,
    }
    first = next(select(stored, **at), None)
    if first is None:
        return {}
    return {row["impl"]: row for row in select(stored, experiment=first["experiment"], **at)}


def compare_table(
    timings: Mapping[str, Timing],
    *,
    shape: Shape | None = None,
    mode: str = "forward_backward",
    stored: Mapping[str, Any] | None = None,
) -> str:
    """A live comparison: medians, quartiles, rounds, each over the reference's median.

    With `stored` (a results document) and `shape`, a last column gives the same ratio in the
    stored run, from its rows at that shape and `mode` (its GPT-2 or sweep rows), where it has
    them.

    Args:
        timings: from [`compare`][attention_bench.experiments.compare].
        shape: the shape they were timed at.
        mode: `"forward"` or `"forward_backward"`.
        stored: a results document of the same device.

    Returns:
        Plain text, one line per implementation under a header.
    """
    summaries = {name: t.summary() for name, t in timings.items()}
    ref_s = summaries.get(REFERENCE, next(iter(summaries.values())))["median_s"]
    rows = _stored_rows(stored, shape, mode)
    medians = _medians_ms([summary["median_s"] for summary in summaries.values()])
    lines = [f"{'':>18}  {'median':>8}  {'quartiles':>12}  {'rounds':>6}  {'/ ref':>5}  stored"]
    for (name, summary), median in zip(summaries.items(), medians, strict=True):
        row, ref_row = rows.get(name), rows.get(REFERENCE)
        was = f"{row['median_s'] / ref_row['median_s']:.2f}x" if row and ref_row else "-"
        lines.append(
            f"{name:>18}  {median:>8}  {_range_ms(summary):>12}  "
            f"{summary['runs']:>6}  {summary['median_s'] / ref_s:4.2f}x  {was:>6}"
        )
    return "\n".join(lines)


def live_conditions(timings: Mapping[str, Timing]) -> str:
    """How busy the machine was while `timings` were taken: rounds and the load average."""
    rounds = sorted({t.summary()["runs"] for t in timings.values()})
    one_minute = os.getloadavg()[0]
    counts = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}"
    return (
        f"{counts} rounds each, load average {one_minute:.1f} (last minute, {os.cpu_count()} CPUs)"
    )


def _relations(summaries: Mapping[str, Mapping[str, Any]], name: str) -> list[str]:
    """`name` faster than, within the spread of, or slower than each other, by quartiles."""
    mine = summaries[name]
    groups: dict[str, list[str]] = {
        "faster than": [],
        "within the spread of": [],
        "slower than": [],
    }
    for other, summary in summaries.items():
        if other == name:
            continue
        if mine["q3_s"] < summary["q1_s"]:
            groups["faster than"].append(other)
        elif mine["q1_s"] > summary["q3_s"]:
            groups["slower than"].append(other)
        else:
            groups["within the spread of"].append(other)
    return [f"  {what}: {', '.join(names)}" for what, names in groups.items() if names]


def live_verdict(
    timings: Mapping[str, Timing],
    name: str = "production",
    *,
    shape: Shape | None = None,
    mode: str = "forward_backward",
    stored: Mapping[str, Any] | None = None,
) -> str:
    """`name` against each other implementation, by whether their quartile ranges overlap.

    With `stored` and `shape` (as for [`compare_table`][attention_bench.live.compare_table]),
    the same verdict from the stored run's quartiles at that shape follows.

    Args:
        timings: from [`compare`][attention_bench.experiments.compare].
        name: the implementation to judge.
        shape: the shape they were timed at.
        mode: `"forward"` or `"forward_backward"`.
        stored: a results document of the same device.

    Returns:
        Plain text.

    Examples:
        >>> from attention_bench.measuring import Timing
        >>> timings = {"a": Timing([1.0, 1.1, 1.2]), "b": Timing([2.0, 2.1, 2.2]),
        ...            "c": Timing([1.05, 1.15, 1.3])}
        >>> print(live_verdict(timings, "a"))
        a, by quartile ranges in this build:
          faster than: b
          within the spread of: c
    """
    lines = [f"{name}, by quartile ranges in this build:"]
    lines += _relations({n: t.summary() for n, t in timings.items()}, name)
    rows = {n: row for n, row in _stored_rows(stored, shape, mode).items() if n in timings}
    if name in rows and len(rows) > 1:
        lines += ["in the stored run, at this shape:", *_relations(rows, name)]
    return "\n".join(lines)
