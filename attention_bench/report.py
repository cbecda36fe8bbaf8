"""The Performance page's tables and figures, each drawn from one results document.

Tables are Markdown strings; figures are matplotlib figures for
[`attention.plot.svg`][attention.plot.svg]. The page only calls these.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from attention_bench.implementations import REFERENCE, Shape
from attention_bench.measuring import Timing
from attention_bench.results import select

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "compare_table",
    "compile_table",
    "decode_table",
    "gpt2_table",
    "heading",
    "memory_table",
    "method",
    "ratio_figure",
    "sweep_figures",
    "targets_table",
    "variants_table",
]

IMPLS = (
    "sdpa_reference",
    "production",
    "explicit",
    "wrapper",
    "torch_mha",
    "torch_mha_weights",
    "production_padded",
    "production_left_padded",
    "torch_mha_padded",
    "production_gqa",
    "production_window",
)
"""The table's rows, in order."""

SHORT = {
    "sdpa_reference": "reference",
    "torch_mha": "nn.MHA",
    "torch_mha_weights": "nn.MHA\nweights",
    "production_padded": "production\npadded",
    "production_left_padded": "production\nleft-padded",
    "torch_mha_padded": "nn.MHA\npadded",
    "production_gqa": "production\nGQA",
    "production_window": "production\nwindow",
}
"""Bar labels that fit under a bar."""


def heading(res: Mapping[str, Any]) -> str:
    """The machine, the date and the GPT-2 shape of one results document, in bold."""
    shape = Shape(**res["config"]["gpt2"])
    return f"**{res['machine']['label']}**, {res['date'][:10]}, {shape}"


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.2f} ms"


def gpt2_table(res: Mapping[str, Any]) -> str:
    """Time per implementation at the GPT-2 shape: both modes, ratios, share of the matmul."""
    lines = [
        "| | forward | ratio | fwd+bwd | ratio | % of matmul |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for impl in IMPLS:
        rows = {
            mode: next(select(res, experiment="gpt2", impl=impl, mode=mode), None)
            for mode in ("forward", "forward_backward")
        }
        cells = []
        for row in rows.values():
            cells += ["-", "-"] if row is None else [
                _ms(row["median_s"]), f"{row['ratio_to_reference']:.2f}x"
            ]  # fmt: skip
        frac = (rows["forward_backward"] or {}).get("matmul_fraction")
        cells.append("-" if frac is None else f"{100 * frac:.0f}%")
        lines.append(f"| `{impl}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_figure(res: Mapping[str, Any]) -> Figure:
    """Bars: forward+backward time over the reference's, at the GPT-2 shape."""
    from attention.plot import bars

    rows = list(select(res, experiment="gpt2", mode="forward_backward"))
    return bars(
        [SHORT.get(row["impl"], row["impl"]) for row in rows],
        [row["ratio_to_reference"] for row in rows],
        ylabel="time / SDPA reference",
        title=f"GPT-2 small, forward+backward\n{res['machine']['label']}",
    )


def _sweep_series(
    res: Mapping[str, Any], mode: str, value: Callable[[dict[str, Any]], float]
) -> tuple[list[int], dict[str, list[float]]]:
    """{implementation: [value per context length]}, NaN where not measured."""
    tokens: list[int] = res["config"]["sweep_tokens"]
    series: dict[str, list[float]] = {}
    for row in select(res, experiment="sweep", mode=mode):
        values = series.setdefault(row["impl"], [math.nan] * len(tokens))
        values[tokens.index(row["num_tokens"])] = value(row)
    return tokens, series


def _sweep_figure(
    tokens: list[int], series: dict[str, list[float]], ylabel: str, title: str
) -> Figure:
    from attention.plot import lines

    fig = lines(tokens, series, xlabel="context length T (tokens)", ylabel=ylabel,
                title=title, logx=True, logy=True)  # fmt: skip
    ax = fig.axes[0]
    ax.set_xticks(tokens, labels=[str(t) for t in tokens], minor=False)
    ax.set_xticks([], minor=True)
    # the lines rise to the right: the legend goes top left, in the axes' colour
    ax.legend(loc="upper left", fontsize="small", frameon=False,
              labelcolor=ax.xaxis.label.get_color())  # fmt: skip
    return fig


def sweep_figures(res: Mapping[str, Any]) -> list[Figure]:
    """Time (forward+backward, forward) and peak forward memory against the context length."""
    label = res["machine"]["label"]
    figures = []
    for mode, what in (("forward_backward", "forward+backward"), ("forward", "forward")):
        tokens, series = _sweep_series(res, mode, lambda row: 1e3 * row["median_s"])
        figures.append(_sweep_figure(tokens, series, "time (ms)", f"{what} time, batch 1\n{label}"))
    tokens, series = _sweep_series(res, "forward", lambda row: row["peak_bytes"] / 2**20)
    title = f"peak memory during the forward, batch 1\n{label}"
    figures.append(_sweep_figure(tokens, series, "peak memory (MiB)", title))
    return figures


def memory_table(res: Mapping[str, Any]) -> str:
    """Peak forward memory at the longest context, and each padded call's over the unpadded."""
    longest = max(res["config"]["sweep_tokens"])
    rows = list(select(res, experiment="sweep", mode="forward", num_tokens=longest))
    peaks = {row["impl"]: row["peak_bytes"] for row in rows}
    lines = [
        f"| forward at T={longest} | peak | parameters and buffers | over unpadded |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratio = ""
        if row["impl"].startswith("production") and "production" in peaks:
            ratio = f"{row['peak_bytes'] / peaks['production']:.2f}x"
        lines.append(
            f"| `{row['impl']}` | {row['peak_bytes'] / 2**20:.1f} MiB "
            f"| {row['state_bytes'] / 2**20:.1f} MiB | {ratio} |"
        )
    return "\n".join(lines)


def variants_table(res: Mapping[str, Any]) -> str:
    """Grouped heads and a window over plain multi-head attention, at every swept length.

    Each cell is the variant's over `production`'s, in the same run: time forward+backward,
    time forward, peak forward memory.
    """
    variants = ("production_gqa", "production_window")
    lines = [
        "| T | " + " | ".join(f"`{v}`: fwd+bwd, fwd, memory" for v in variants) + " |",
        "| ---: | " + " | ".join("---:" for _ in variants) + " |",
    ]
    for num_tokens in res["config"]["sweep_tokens"]:
        at = {"experiment": "sweep", "num_tokens": num_tokens}
        cells = []
        for variant in variants:
            ratios = []
            for mode, key in (
                ("forward_backward", "median_s"),
                ("forward", "median_s"),
                ("forward", "peak_bytes"),
            ):
                base = next(select(res, impl="production", mode=mode, **at), None)
                row = next(select(res, impl=variant, mode=mode, **at), None)
                ok = base and row and base.get(key) and row.get(key)
                ratios.append(f"{row[key] / base[key]:.2f}x" if ok else "-")  # type: ignore[index]
            cells.append(", ".join(ratios))
        lines.append(f"| {num_tokens} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def method(res: Mapping[str, Any], *keys: str, width: int = 76) -> str:
    """How the given quantities were measured, as the results document records it."""
    return "\n".join(textwrap.fill(f"{key}: {res['method'][key]}", width) for key in keys)


def targets_table(res: Mapping[str, Any]) -> str:
    """The production module's targets, as the run recorded them."""
    lines = ["| what | measured | target | |", "| --- | ---: | ---: | --- |"]
    for t in res["targets"]:
        verdict = {True: "met", False: "**missed**", None: "n/a"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        sign = "≥" if t.get("at_least") else "≤"
        lines.append(f"| {t['target']} | {value} | {sign} {t['limit']} | {verdict} |")
    return "\n".join(lines)


def decode_table(res: Mapping[str, Any]) -> str:
    """Generation with and without the cache, and decode against the bandwidth limit."""
    lines = [
        "| batch | prefill | decode, cached | uncached | generation speedup "
        "| limit (all weights) | of it | limit (weights read) | of it |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in select(res, experiment="decode"):
        lines.append(
            f"| {row['batch']} | {_ms(row['prefill_s'])} "
            f"| {row['cached_tokens_per_s']:.1f} tokens/s | {row['uncached_tokens_per_s']:.1f} "
            f"| {row['generation_speedup']:.1f}x | {row['limit_tokens_per_s']:.1f} "
            f"| {row['fraction_of_limit']:.0%} | {row['limit_read_tokens_per_s']:.1f} "
            f"| {row['fraction_of_read_limit']:.0%} |"
        )
    return "\n".join(lines)


def compile_table(res: Mapping[str, Any]) -> str:
    """Eager against `torch.compile`, both modes, with the first (compiling) call."""
    lines = [
        "| | mode | median | vs eager | first call (compiles) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in select(res, experiment="compile"):
        first = row.get("first_call_s")
        lines.append(
            f"| `{row['impl']}` | {row['mode']} | {_ms(row['median_s'])} "
            f"| {row['ratio_to_eager']:.2f}x | {'-' if first is None else f'{first:.1f} s'} |"
        )
    return "\n".join(lines)


def compare_table(timings: Mapping[str, Timing]) -> str:
    """A live comparison's medians, and each over the reference's (the first if absent)."""
    medians = {name: t.summary()["median_s"] for name, t in timings.items()}
    ref_s = medians.get(REFERENCE, next(iter(medians.values())))
    return "\n".join(
        f"{name:>18}: {_ms(median_s):>9}, {median_s / ref_s:4.2f}x reference"
        for name, median_s in medians.items()
    )
