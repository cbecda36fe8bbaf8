"""The Performance page's tables and figures, each drawn from one results document.

Tables are Markdown strings; figures are matplotlib figures for
[`attention_site.plot.svg`][attention_site.plot.svg]. The page only calls these.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from attention_bench.implementations import WINDOW, Impl, Shape, implementations
from attention_bench.measuring import milliseconds as _ms
from attention_bench.results import select
from attention_bench.targets import DECODE_FRACTION, DECODE_READ_FRACTION
from attention_site.plot import _INK

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "STYLES",
    "bandwidth_table",
    "compile_table",
    "decode_limits",
    "decode_table",
    "gpt2_table",
    "graph_table",
    "heading",
    "hf_table",
    "matmul_fraction",
    "memory_table",
    "method",
    "mha_comparison",
    "padded_batch_table",
    "ratio_figure",
    "sweep_figures",
    "targets_table",
    "variants_summary",
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

STYLES: dict[str, dict[str, Any]] = {
    "sdpa_reference": {"color": _INK, "marker": "s", "linestyle": "-"},  # the page's text colour
    "production": {"color": "C0", "marker": "o", "linestyle": "-"},
    "production_padded": {"color": "C0", "marker": "v", "linestyle": "--"},
    "production_left_padded": {"color": "C0", "marker": "^", "linestyle": ":"},
    "production_gqa": {"color": "C2", "marker": "D", "linestyle": "-"},
    "production_window": {"color": "C4", "marker": "P", "linestyle": "-"},
    "explicit": {"color": "C3", "marker": "X", "linestyle": "-"},
    "wrapper": {"color": "C8", "marker": "*", "linestyle": "-"},
    "torch_mha": {"color": "C1", "marker": "s", "linestyle": "--"},
    "torch_mha_weights": {"color": "C6", "marker": "d", "linestyle": "--"},
    "torch_mha_padded": {"color": "C1", "marker": "v", "linestyle": ":"},
}
"""One look per implementation (colour, marker, line style), the same in every figure."""

_IMPLS: dict[str, Impl] = {impl.name: impl for impl in implementations(0)}

OURS = {"experiment": "decode", "impl": "gpt2_124m"}
"""Our generation rows (a run may also hold Hugging Face's, `impl` `"hf_gpt2"`)."""
HF = {"experiment": "decode", "impl": "hf_gpt2"}


def heading(res: Mapping[str, Any], what: str = "gpt2") -> str:
    """The machine and the date of one results document, in bold, and the shape of its rows.

    Args:
        res: a results document.
        what: whose shape: `"gpt2"` (the GPT-2 table, also the `torch.compile` one),
            `"sweep"` (every context length), `"memory"` (the sweep's longest context,
            forward), `"decode"` (the generation rows) or `"run"` (none: the targets name
            their own).

    Returns:
        One line of Markdown.
    """
    cfg = res["config"]
    gpt2 = Shape(**cfg["gpt2"])
    width = f"d_model={gpt2.d_model}, num_heads={gpt2.num_heads}"
    tokens, batch = cfg["sweep_tokens"], cfg["sweep_batch"]
    prompt, new = cfg.get("decode_tokens", ["?", "?"])
    batches = " and ".join(str(row["batch"]) for row in select(res, **OURS))
    shapes = {
        "gpt2": f"batch={gpt2.batch}, num_tokens={gpt2.num_tokens}, {width}",
        "sweep": f"batch={batch}, num_tokens={tokens[0]} to {tokens[-1]}, {width}",
        "memory": f"forward, batch={batch}, num_tokens={max(tokens)}, {width}",
        "decode": f"the book's 124M GPT, batch {batches}, prompt {prompt} tokens, {new} new",
        "run": "the whole run",
    }
    return f"**{res['machine']['label']}**, {res['date'][:10]}: {shapes[what]}"


def matmul_fraction(res: Mapping[str, Any], row: Mapping[str, Any]) -> float | None:
    """A row's achieved FLOP/s over the matmul's, counting the FLOPs of its own arithmetic.

    [`Impl.flops`][attention_bench.implementations.Impl.flops] counts grouped heads' smaller
    key/value projections and a window's band of pairs, so a variant's share is not inflated
    by work it does not do (the results files before that stored the full count).

    Args:
        res: the results document the row comes from (its `matmul_flops_per_s`).
        row: a timed row of one implementation.

    Returns:
        The fraction, or None where the row or the matmul was not measured.
    """
    impl = _IMPLS.get(row["impl"].split("[")[0])  # "production[flash]" is production
    rate = (res.get("matmul_flops_per_s") or {}).get(row.get("dtype"))
    if impl is None or not rate or not row.get("median_s"):
        return None
    shape = Shape(row["batch"], row["num_tokens"], row["d_model"], row["num_heads"])
    flops = impl.flops(shape, backward=row["mode"] == "forward_backward")
    return float(flops / row["median_s"] / rate)


def gpt2_table(res: Mapping[str, Any]) -> str:
    """Time per implementation at the GPT-2 shape, both modes, and over the reference's.

    The last column is the forward+backward share of the matmul's FLOP/s,
    [`matmul_fraction`][attention_site.performance.matmul_fraction].
    """
    lines = [
        "| | forward: time, over the reference's | forward+backward | % of matmul |",
        "| --- | ---: | ---: | ---: |",
    ]
    for impl in IMPLS:
        rows = {
            mode: next(select(res, experiment="gpt2", impl=impl, mode=mode), None)
            for mode in ("forward", "forward_backward")
        }
        cells = [
            "-" if row is None else f"{_ms(row['median_s'])}, {row['ratio_to_reference']:.2f}x"
            for row in rows.values()
        ]
        frac = None if rows["forward_backward"] is None else matmul_fraction(
            res, rows["forward_backward"]
        )  # fmt: skip
        cells.append("-" if frac is None else f"{100 * frac:.0f}%")
        lines.append(f"| `{impl}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_figure(res: Mapping[str, Any]) -> Figure:
    """Bars: forward+backward time over the reference's, at the GPT-2 shape."""
    from attention_site.plot import bars

    rows = list(select(res, experiment="gpt2", mode="forward_backward"))
    machine = textwrap.fill(res["machine"]["label"], 40)  # a phone's width, in lines
    return bars(
        [SHORT.get(row["impl"], row["impl"]).replace("\n", " ") for row in rows],
        [row["ratio_to_reference"] for row in rows],
        ylabel="time / SDPA reference",
        title=f"GPT-2 small, forward+backward\n{machine}",
        horizontal=True,  # eight labels: in rows, a phone's width
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
    from attention_site.plot import lines

    series = {name: series[name] for name in IMPLS if name in series}  # the table's order
    fig = lines(tokens, series, xlabel="context length T (tokens)", ylabel=ylabel, title=title,
                logx=True, logy=True, styles=STYLES, legend="below")  # fmt: skip
    ax = fig.axes[0]
    ax.set_xticks(tokens, labels=[str(t) for t in tokens], minor=False)
    ax.set_xticks([], minor=True)
    return fig


def sweep_figures(res: Mapping[str, Any]) -> list[Figure]:
    """Time (forward+backward, forward) and peak forward memory against the context length.

    Each implementation keeps its look ([`STYLES`][attention_site.performance.STYLES]) in all three.
    """
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
    """Peak forward memory at the longest context, and each over plain `production`'s."""
    longest = max(res["config"]["sweep_tokens"])
    rows = list(select(res, experiment="sweep", mode="forward", num_tokens=longest))
    peaks = {row["impl"]: row["peak_bytes"] for row in rows}
    lines = [
        "| | peak | parameters and buffers | peak over `production`'s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        ratio = "-"
        if peaks.get("production") and row.get("peak_bytes") is not None:
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


def _sweep_ratio(res: Mapping[str, Any], impl: str, mode: str, key: str, num_tokens: int) -> float:
    """`impl`'s `key` over plain `production`'s in the sweep at `num_tokens`; NaN if missing."""
    at = {"experiment": "sweep", "mode": mode, "num_tokens": num_tokens}
    row = next(select(res, impl=impl, **at), None)
    base = next(select(res, impl="production", **at), None)
    if row is None or base is None or not row.get(key) or not base.get(key):
        return math.nan
    return float(row[key] / base[key])


def _listing(pairs: list[tuple[int, float]]) -> str:
    """`[(4096, 1.03), (8192, 1.14)]` -> "$T$ = 4,096 (1.03x) and 8,192 (1.14x)"."""
    items = [f"{t:,} ({r:.2f}x)" for t, r in pairs]
    return "$T$ = " + (", ".join(items[:-1]) + " and " if len(items) > 1 else "") + items[-1]


def variants_summary(res: Mapping[str, Any]) -> str:
    """What the variants table shows, in sentences computed from its rows.

    Grouped heads' forward+backward time and FLOPs over multi-head attention's, and where
    grouped heads are the slower; the window's memory over multi-head attention's from
    $T = 2w$ on, and its time at the longest context.

    Args:
        res: a results document.

    Returns:
        A paragraph of Markdown (empty if the sweep has no variant rows).
    """
    cfg = res["config"]
    tokens = cfg["sweep_tokens"]
    gqa = {
        t: _sweep_ratio(res, "production_gqa", "forward_backward", "median_s", t) for t in tokens
    }
    gqa = {t: r for t, r in gqa.items() if not math.isnan(r)}
    memory = {t: _sweep_ratio(res, "production_window", "forward", "peak_bytes", t) for t in tokens}
    memory = {t: r for t, r in memory.items() if t >= 2 * WINDOW and not math.isnan(r)}
    if not gqa or not memory:
        return ""
    gpt2 = Shape(**cfg["gpt2"])

    def flops(name: str, t: int) -> int:
        shape = Shape(cfg["sweep_batch"], t, gpt2.d_model, gpt2.num_heads)
        return _IMPLS[name].flops(shape, backward=True)

    first, last = min(gqa), max(gqa)
    counts = [flops("production_gqa", t) / flops("production", t) for t in (first, last)]
    text = (
        f"At batch {cfg['sweep_batch']}, grouped heads take {min(gqa.values()):.2f}x to "
        f"{max(gqa.values()):.2f}x multi-head attention's forward+backward time. They count "
        f"{counts[0]:.2f}x its FLOPs at $T$ = {first:,} but {counts[1]:.2f}x at $T$ = {last:,}: "
        "the projections they shrink grow like $T$, the attention they leave as it is like $T^2$."
    )
    slower = [(t, r) for t, r in gqa.items() if r > 1]
    if slower:
        text += (
            f" They are *slower* than multi-head attention at {_listing(slower)}, although they "
            "do less arithmetic there: the kernel runs the grouped heads' attention more slowly "
            "than the same work on ungrouped heads."
        )
    window_time = _sweep_ratio(res, "production_window", "forward_backward", "median_s", last)
    return text + (
        f" The window ($w$ = {WINDOW}) needs {min(memory.values()):.2f}x to "
        f"{max(memory.values()):.2f}x multi-head attention's peak forward memory at every "
        f"$T \\ge 2w$ = {2 * WINDOW} (its blocks of $w$ queries run one after another, each "
        "over a slice of the keys), and takes "
        f"{window_time:.2f}x its forward+backward time at $T$ = {last:,}."
    )


def method(res: Mapping[str, Any], *keys: str, width: int = 76) -> str:
    """How the given quantities were measured, as the results document records it."""
    return "\n".join(textwrap.fill(f"{key}: {res['method'][key]}", width) for key in keys)


def targets_table(res: Mapping[str, Any]) -> str:
    """The production module's targets, as the run recorded them.

    The decode target is judged against the all-weights limit; its row also gives the
    fraction of the stricter weights-read limit
    ([`decode_limits`][attention_site.performance.decode_limits]).
    """
    decode = next(select(res, **OURS, batch=1), None)
    lines = ["| what | measured | target | |", "| --- | ---: | ---: | --- |"]
    for t in res["targets"]:
        verdict = {True: "met", False: "**missed**", None: "n/a"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        sign = "≥" if t.get("at_least") else "≤"
        what = t["target"]
        if what == DECODE_FRACTION and decode is not None:
            read = decode["fraction_of_read_limit"]
            what += f" (all weights; of the weights-read limit: {read:.2f})"
        lines.append(f"| {what} | {value} | {sign} {t['limit']} | {verdict} |")
    return "\n".join(lines)


def mha_comparison(res: Mapping[str, Any]) -> str:
    """The `nn.MultiheadAttention` target judged twice: its default call, and no weights.

    The stored target compares with the default `need_weights=True`, which also computes and
    returns the averaged weights; `need_weights=False` lets it call the fused kernel too. Both
    ratios come from the same run's forward+backward rows at the GPT-2 shape, against the
    target's own limit.

    Returns:
        One line per call of `nn.MultiheadAttention` (production's time over its time, and
        the verdict), or a line saying the rows were not measured.
    """
    target = next((t for t in res["targets"] if "MultiheadAttention" in t["target"]), None)
    prod = next(select(res, experiment="gpt2", impl="production", mode="forward_backward"), None)
    if target is None or prod is None:
        return "nn.MultiheadAttention target: not measured in this run"
    lines = []
    for impl, call in (("torch_mha_weights", "need_weights=True"),
                       ("torch_mha", "need_weights=False")):  # fmt: skip
        row = next(select(res, experiment="gpt2", impl=impl, mode="forward_backward",
                          dtype=prod["dtype"]), None)  # fmt: skip
        if row is None:
            continue
        ratio = prod["median_s"] / row["median_s"]
        verdict = "met" if ratio <= target["limit"] else "MISSED"
        lines.append(f"{call + ':':<19} {_ms(prod['median_s'])} / {_ms(row['median_s'])} = "
                     f"{ratio:.3f}, {verdict} (<= {target['limit']})")  # fmt: skip
    return "\n".join(lines)


def decode_table(res: Mapping[str, Any]) -> str:
    """Generation with and without the cache: prefill, decode rates, the whole run's speedup."""
    lines = [
        "| batch | prefill | decode, cached (tokens/s) | decode, uncached (tokens/s) "
        "| generation speedup |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in select(res, **OURS):
        lines.append(
            f"| {row['batch']} | {_ms(row['prefill_s'])} | {row['cached_tokens_per_s']:.1f} "
            f"| {row['uncached_tokens_per_s']:.1f} | {row['generation_speedup']:.1f}x |"
        )
    return "\n".join(lines)


def bandwidth_table(res: Mapping[str, Any]) -> str:
    """Cached decode against the two bandwidth limits, in tokens/s, and its fraction of each."""
    lines = [
        "| batch | decode, cached (tokens/s) | limit, all weights (tokens/s) | of it "
        "| limit, weights read (tokens/s) | of it |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in select(res, **OURS):
        lines.append(
            f"| {row['batch']} | {row['cached_tokens_per_s']:.1f} "
            f"| {row['limit_tokens_per_s']:.1f} | {row['fraction_of_limit']:.0%} "
            f"| {row['limit_read_tokens_per_s']:.1f} | {row['fraction_of_read_limit']:.0%} |"
        )
    return "\n".join(lines)


def decode_limits(res: Mapping[str, Any]) -> str:
    """The batch-1 decode's fraction of each bandwidth limit, against each one's target, in prose.

    Args:
        res: a results document.

    Returns:
        Markdown (empty if the run has no batch-1 decode row or no decode target).
    """
    row = next(select(res, **OURS, batch=1), None)
    target = next((t for t in res["targets"] if t["target"] == DECODE_FRACTION), None)
    if row is None or target is None:
        return ""
    read = next((t for t in res["targets"] if t["target"] == DECODE_READ_FRACTION), None)
    verdict = "."  # a run from before the weights-read target
    if read is not None:
        met = row["fraction_of_read_limit"] >= read["limit"]
        verdict = f", {'above' if met else 'short of'} the {read['limit']:.0%} its own target asks."
    return (
        f"The target asks batch 1 for {target['limit']:.0%} of the *all-weights* limit "
        f"({row['limit_tokens_per_s']:.1f} tokens/s): the bytes of the whole model, what its "
        f"checkpoint weighs, the simplest bound to state; it reaches "
        f"{row['fraction_of_limit']:.0%}. That limit is the lenient one. Against the stricter "
        f"*weights-read* limit ({row['limit_read_tokens_per_s']:.1f} tokens/s), which leaves out "
        "the embedding tables as gpt-fast's bandwidth figure does, it reaches "
        f"{row['fraction_of_read_limit']:.0%}{verdict}"
    )


def _seconds(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else _ms(seconds)


def hf_table(res: Mapping[str, Any]) -> str:
    """Ours against Hugging Face's GPT-2 on the same weights, timed in turns in one run.

    Prefill (one forward over the prompt, filling a cache), cached decode (tokens/s), the whole
    greedy generation (each library's own `generate`), and the decode's fraction of the
    weights-read bandwidth limit, at each batch size; the last column is ours over theirs
    (below 1: ours takes less time; above 1: ours makes more tokens/s).

    Args:
        res: a results document.

    Returns:
        A Markdown table, or a sentence where the run has no Hugging Face rows (`transformers`
        was not installed, or the run predates the comparison).
    """
    pairs = []

    def float32(row: Mapping[str, Any]) -> bool:  # a GPU run's float16: graph_table
        return bool(row.get("dtype", "float32") == "float32")

    for ours in filter(float32, select(res, **OURS)):
        hf = next(filter(float32, select(res, **HF, batch=ours["batch"])), None)
        if hf is not None:
            pairs.append((ours, hf))
    if not pairs:
        return "This run has no Hugging Face rows (`transformers` was not installed for it)."
    version = pairs[0][1].get("transformers", "?")
    lines = [
        f"| | ours | HF GPT-2 (transformers {version}) | ours / HF |",
        "| --- | ---: | ---: | ---: |",
    ]
    measures: list[tuple[str, str, Callable[[float], str]]] = [
        ("prefill", "prefill_s", _seconds),
        ("decode (tokens/s)", "cached_tokens_per_s", lambda v: f"{v:.1f}"),
        ("generation", "generate_s", _seconds),
    ]
    for what, key, fmt in measures:
        for ours, hf in pairs:
            if ours.get(key) is None or hf.get(key) is None:
                continue
            lines.append(f"| {what}, batch {ours['batch']} | {fmt(ours[key])} | {fmt(hf[key])} "
                         f"| {ours[key] / hf[key]:.2f}x |")  # fmt: skip
    for ours, hf in pairs:
        lines.append(f"| decode, batch {ours['batch']}: of the weights-read limit "
                     f"| {ours['fraction_of_read_limit']:.0%} | {hf['fraction_of_read_limit']:.0%} "
                     "| |")  # fmt: skip
    return "\n".join(lines)


def graph_table(res: Mapping[str, Any]) -> str:
    """On CUDA: decode eager, replayed from one CUDA graph, and Hugging Face's, per dtype.

    Tokens/s of the cached decode step at each batch size and dtype, the graphed step over
    Hugging Face's, and its fraction of the bandwidth limit (all weights and the cache).

    Returns:
        A Markdown table, or "" for a run without graphed rows (the CPU's).
    """
    lines = []
    for graphed in select(res, experiment="decode", impl="gpt2_124m_graph"):
        at = {"batch": graphed["batch"], "dtype": graphed["dtype"]}
        eager = next(select(res, **OURS, **at), {})
        hf = next(select(res, **HF, **at), {})
        rate = "cached_tokens_per_s"
        cells = [f"{row[rate]:.0f}" if rate in row else "-" for row in (eager, graphed, hf)]
        versus = f"{graphed[rate] / hf[rate]:.2f}x" if rate in hf else "-"
        lines.append(f"| {at['dtype']}, batch {at['batch']} | {' | '.join(cells)} | {versus} "
                     f"| {graphed['fraction_of_limit']:.0%} |")  # fmt: skip
    if not lines:
        return ""
    head = (
        "| decode (tokens/s) | ours, eager | ours, one CUDA graph | HF GPT-2 | graph / HF "
        "| graph: of the bandwidth limit |\n| --- | ---: | ---: | ---: | ---: | ---: |"
    )
    return "\n".join([head, *lines])


def padded_batch_table(res: Mapping[str, Any]) -> str:
    """Prompts of different lengths generated as one padded batch, one by one, and by HF.

    Args:
        res: a results document.

    Returns:
        A Markdown table (time, time per token, and the padded batch over each), or a
        sentence where the run predates the experiment.
    """
    rows = {(r["impl"], r["way"]): r for r in select(res, experiment="padded_batch")}
    batch = rows.get(("gpt2_124m", "padded_batch"))
    if batch is None:
        return "This run has no padded-batch rows (it predates the experiment)."
    lines = [
        f"| prompts of {', '.join(map(str, batch['lengths']))} tokens, {batch['new_tokens']} "
        "new each | time | per token | padded batch / this |",
        "| --- | ---: | ---: | ---: |",
    ]
    names = {("gpt2_124m", "padded_batch"): "ours, one padded batch",
             ("gpt2_124m", "one_by_one"): "ours, one prompt after another",
             ("hf_gpt2", "padded_batch"): "HF GPT-2, one padded batch"}  # fmt: skip
    for key, name in names.items():
        if key in rows:
            row = rows[key]
            lines.append(f"| {name} | {_seconds(row['median_s'])} | {_ms(row['s_per_token'])} "
                         f"| {batch['median_s'] / row['median_s']:.2f}x |")  # fmt: skip
    same = "the same tokens" if batch["same_tokens_as_alone"] else "**other tokens**"
    lines.append(f"\nThe padded batch wrote {same} as the prompts one by one.")
    return "\n".join(lines)


def compile_table(res: Mapping[str, Any]) -> str:
    """Eager against `torch.compile`, both modes, with the first (compiling) call.

    Followed by where the eager times come from: this group, not the GPT-2 table's, whose
    `production` row is the same module at the same shape timed earlier in the same run.
    """
    lines = [
        "| | mode | median | vs eager | first call (compiles) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    eager, earlier = [], []
    for row in select(res, experiment="compile"):
        first = row.get("first_call_s")
        lines.append(
            f"| `{row['impl']}` | {row['mode']} | {_ms(row['median_s'])} "
            f"| {row['ratio_to_eager']:.2f}x | {'-' if first is None else f'{first:.1f} s'} |"
        )
        gpt2 = next(select(res, experiment="gpt2", impl=row["impl"], mode=row["mode"]), None)
        if gpt2 is not None:
            eager.append(_ms(row["median_s"]))
            earlier.append(_ms(gpt2["median_s"]))
    if eager:
        lines.append(
            f"\nEager and compiled calls take turns in a group of their own, timed after the "
            f"others; the GPT-2 table's `production` row, the same module at the same shape, comes "
            f"from its own group earlier in the same run: {' and '.join(earlier)} there "
            f"(forward, forward+backward) against {' and '.join(eager)} here. Times from "
            "different groups differ by the machine's drift between them; compare ratios within "
            "one table."
        )
    return "\n".join(lines)
