r"""What the site shows: attention heatmaps, masks, line and bar charts as inline SVG.

Every figure on the documentation site comes from here. matplotlib is optional (the `docs`
extra) and imported only when a function below is called, so `import attention` never loads
it. Figures are built on a bare `matplotlib.figure.Figure` (no pyplot state, no GUI backend)
and [`svg`][attention_site.plot.svg] turns one into a self-contained SVG string that:

- has a transparent background and draws its text, axes and ticks in `currentColor`, so it
  takes the page's text colour and reads in both the light and the dark palette;
- keeps text as text (`svg.fonttype = "none"`), in the page's own font;
- gives every heatmap cell a hover tooltip `query -> key: weight`;
- prefixes its element ids, so several figures can share one HTML page.

[`source`][attention_site.listing.source], the package's own code for a page to print, is
re-exported here for the pages.

Examples:
    >>> import torch
    >>> from attention_site.plot import heatmap, svg
    >>> attn_weights = torch.tensor([[1.0, 0.0], [0.3, 0.7]])
    >>> html = svg(heatmap(attn_weights, ["Your", "journey"]))
    >>> html.startswith("<svg") and "<title>journey -&gt; Your: 0.3000</title>" in html
    True
"""

from __future__ import annotations

import io
import itertools
import math
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attention_site.listing import source

if TYPE_CHECKING:  # matplotlib is optional: imported lazily, inside the functions
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["bars", "heatmap", "lines", "mask", "phone_px", "row", "source", "svg"]

MAX_HEATMAP_SIDE = 64
"""The most rows or columns [`heatmap`][attention_site.plot.heatmap] draws, one labelled cell
each."""

MAX_CELLS_SIDE = 24
"""Above this many rows or columns, [`heatmap`][attention_site.plot.heatmap] draws one image."""

PHONE = 3.8
"""A figure's width in inches that a phone shows unscaled (about 365 CSS px of its 390)."""

_SLANTED_KEYS = 8
"""Above this many columns, a heatmap drawn as one image (a phone's width) writes its column
labels upright: slanted at 45 degrees, each would run into the next."""

_PHONE_PX = 358
"""The CSS px a phone's column gives a figure (390 px, less the page's margins)."""

_LINES_SIZE = (5.0, 3.2)
"""A line chart's size in inches, before its legend's rows below it (0.2 each) and its title's
lines after the first (0.25 each): on a phone, scaled to its column, the 11 pt ticks and labels
stay at about 11 px and the 10 pt legend at 10 (`phone_px`); on a laptop, 480 px wide."""

_VALUE_PX = 9.0
"""The smallest size, in CSS px, at which a heatmap writes the weights in its cells on a phone:
where they would come out smaller, the page hides them there (`attn-value-small`, in
docs/stylesheets/extra.css), and the colours and the tooltips carry the values."""

_INK = "#010203"
"""Stand-in colour for text, spines and ticks; `svg` rewrites it to `currentColor`."""

_RC = {
    "text.color": _INK,
    "axes.labelcolor": _INK,
    "axes.edgecolor": _INK,
    "axes.titlecolor": _INK,
    "xtick.color": _INK,
    "ytick.color": _INK,
    "legend.labelcolor": _INK,
    "legend.frameon": False,
    "axes.facecolor": "none",
    "figure.facecolor": "none",
    "savefig.facecolor": "none",
    "font.size": 11,
    "svg.fonttype": "none",  # text stays <text>, drawn in the page's font
    "svg.hashsalt": "attention",  # deterministic ids; `svg` makes them unique per figure
}

_SVG_STYLE = "stroke-linejoin: round; stroke-linecap: butt; max-width: 100%; height: auto"

_TOOLTIPS_ATTR = "_attention_tooltips"  # figure attribute: {gid: tooltip text}
_LINES_ATTR = "_attention_lines"  # figure attribute: a line chart (data-lines in its SVG)
_ids = itertools.count()  # prefixes unique across one process (each page's within its own)


def _rc_context() -> Any:
    import matplotlib

    return matplotlib.rc_context(_RC)  # type: ignore[arg-type]


def _literal(labels: Sequence[Any]) -> list[str]:
    """Labels drawn as written: a `$` would otherwise start matplotlib's math mode."""
    return [str(label).replace("$", r"\$") for label in labels]


def _matrix_axes(
    ax: Axes, shape: tuple[int, int], labels: tuple[Sequence[str], Sequence[str]], *,
    xlabel: str = "keys", ylabel: str = "queries", title: str | None = None,
    every: tuple[int, int] = (1, 1),
) -> None:  # fmt: skip
    """Rows top down, labels (every `every`-th row and column) on both axes, no spines."""
    (num_queries, num_keys), (query_labels, key_labels) = shape, labels
    ax.set_xlim(-0.5, num_keys - 0.5)
    ax.set_ylim(num_queries - 0.5, -0.5)  # first query on top, like the matrix
    queries, keys = range(0, num_queries, every[0]), range(0, num_keys, every[1])
    rotate: dict[str, Any] = {"rotation": 45, "ha": "right"} if every[1] == 1 else {}
    ax.set_xticks(keys, _literal([key_labels[j] for j in keys]), **rotate)
    ax.set_yticks(queries, _literal([query_labels[i] for i in queries]))
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)


def heatmap(
    weights: Any,
    query_labels: Sequence[str],
    key_labels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    ax: Axes | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    marked: Any = None,
    marked_label: str = "marked",
    image: bool | None = None,
) -> Figure:
    r"""An attention-weight matrix as a heatmap, with the tokens on both axes.

    Row $i$ is query token $i$ (y axis, "queries"), column $j$ key token $j$ (x axis, "keys");
    each cell shows $\alpha_{ij}$ (or any score) to two decimals and, as an SVG tooltip, to
    four. Non-finite cells (masked $-\infty$ scores) are drawn hatched `//` and labelled.
    Figures side by side that compare values pass the same `vmin` and `vmax`, so one colour
    means one value in all of them.

    Args:
        weights: tensor, array or nested list of shape `(num_queries, num_keys)`.
        query_labels: `num_queries` token strings, one per row.
        key_labels: `num_keys` token strings, one per column; default `query_labels`
            (self-attention).
        title: optional title above the matrix.
        ax: draw into these axes instead of a new figure (e.g. one panel per head).
        vmin: the value at the bottom of the colour scale; default the smallest finite weight.
        vmax: the value at its top; default the largest finite weight.
        marked: optional bool matrix of the same shape: its True cells are crossed and
            outlined (unlike the `//` of masked cells), e.g. the weights dropout zeroed, and a
            legend above the matrix names them.
        marked_label: the legend's name for the marked cells.
        image: draw the matrix as one image, a phone's width, labelled every few rows and
            columns (no values, tooltips or marks), instead of one cell per weight; default:
            when a side is longer than `MAX_CELLS_SIDE`, whose cells would be too small to
            read and too many to ship.

    Returns:
        The matplotlib `Figure`; pass it to [`svg`][attention_site.plot.svg].

    Raises:
        ValueError: `weights` is not 2-D, a label count does not match its dimension, or
            `marked` is not of the shape of `weights` (or given with `image`).

    Examples:
        >>> import torch
        >>> fig = heatmap(torch.eye(3), ["a", "b", "c"], title="identity")
        >>> fig.axes[0].get_ylabel(), fig.axes[0].get_xlabel()
        ('queries', 'keys')
        >>> heatmap(torch.eye(3), ["a", "b"])
        Traceback (most recent call last):
        ...
        ValueError: expected 3 query_labels (one per row of weights (3, 3)), got 2
        >>> fig = heatmap(torch.eye(2) / 2, ["a", "b"], vmin=0, vmax=1, marked=torch.eye(2) > 0)
        >>> [float(v) for v in fig.axes[1].get_ylim()]  # the colour bar spans vmin..vmax
        [0.0, 1.0]
        >>> fig.axes[0].get_legend().get_texts()[0].get_text()
        'marked'
        >>> fig = heatmap(torch.eye(32), [str(t) for t in range(32)])  # 32 > MAX_CELLS_SIDE
        >>> len(fig.axes[0].images), [t.get_text() for t in fig.axes[0].get_xticklabels()][:3]
        (1, ['0', '4', '8'])
    """
    from matplotlib.colors import Normalize
    from matplotlib.patches import Patch

    rows = _to_matrix(weights)
    num_queries, num_keys = len(rows), len(rows[0])
    key_labels = _check_labels(rows, query_labels, key_labels, MAX_HEATMAP_SIDE)
    crossed = None if marked is None else _to_matrix(marked)
    if crossed is not None and (len(crossed), len(crossed[0])) != (num_queries, num_keys):
        got = (len(crossed), len(crossed[0]))
        raise ValueError(
            f"marked must have the shape of weights {num_queries, num_keys}, got {got}"
        )
    if image is None:
        image = max(num_queries, num_keys) > MAX_CELLS_SIDE
    if image and crossed is not None:
        raise ValueError("marked cells need one cell per weight: pass image=False")
    finite = [v for row in rows for v in row if math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    low, high = low if vmin is None else float(vmin), high if vmax is None else float(vmax)
    norm = Normalize(vmin=low, vmax=high if high > low else low + 1.0)

    with _rc_context():
        import matplotlib

        cmap = matplotlib.colormaps["viridis"]
        if image:
            return _image(rows, (query_labels, key_labels), (norm, cmap), title, ax)
        fig, ax, values = _cells_figure(ax, num_queries, num_keys)
        cross: dict[str, Any] = {"fill": False, "hatch": "x", "linewidth": 2}
        tooltips = _draw_cells(ax, fig, rows, crossed, (query_labels, key_labels), (norm, cmap),
                               (marked_label, values), cross)  # fmt: skip
        setattr(fig, _TOOLTIPS_ATTR, tooltips)
        ax.set_aspect("equal")
        _matrix_axes(ax, (num_queries, num_keys), (query_labels, key_labels), title=title)
        if values[0] >= 12:  # a figure of its own, large cells: the tokens as large as the values
            ax.tick_params(labelsize=12)
        if crossed is not None:
            handle = Patch(edgecolor=_INK, label=marked_label, **cross)
            ax.legend(handles=[handle], loc="lower left", bbox_to_anchor=(0, 1), borderaxespad=0.2)
            ax.set_title(title or "", pad=26)
        import matplotlib.cm

        fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.8)
    return fig


def _image(
    rows: list[list[float]],
    labels: tuple[Sequence[str], Sequence[str]],
    colours: tuple[Any, Any],
    title: str | None,
    ax: Axes | None,
) -> Figure:
    """`heatmap` as one image: every label up to 16 a side, else every 4th (8th...), masked grey."""
    import matplotlib.cm
    import numpy as np
    from matplotlib.figure import Figure

    (norm, cmap), shape = colours, (len(rows), len(rows[0]))
    if ax is None:
        fig = Figure(figsize=(PHONE, 3.5), layout="constrained")  # a phone's width
        ax = fig.add_subplot()
    else:
        fig = ax.get_figure()  # type: ignore[assignment]
    every = tuple(1 if side <= 16 else math.ceil(side / 32) * 4 for side in shape)
    masked = cmap.with_extremes(bad=(0.5, 0.5, 0.5, 0.25))  # non-finite cells: grey
    ax.imshow(np.ma.masked_invalid(rows), cmap=masked, norm=norm, interpolation="nearest")
    _matrix_axes(ax, shape, labels, title=title, every=every)  # type: ignore[arg-type]
    ax.tick_params(length=3)
    if every[1] == 1 and shape[1] > _SLANTED_KEYS:  # a column is narrower than a slanted label
        ax.tick_params(axis="x", labelrotation=90, labelsize=11 if shape[1] <= 12 else 9)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("center")
    fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.8)
    return fig


def _cells_figure(
    ax: Axes | None, num_queries: int, num_keys: int
) -> tuple[Figure, Axes, tuple[float, str]]:
    """The figure and axes of a heatmap of one cell per weight, and its values' font size and
    group id (`_value_style`): a figure of its own sized to
    the cells, or the caller's axes, whose values keep the 9 pt they always had."""
    from matplotlib.figure import Figure

    if ax is not None:
        return ax.get_figure(), ax, (9.0, "attn-value")  # type: ignore[return-value]
    cell = 0.62  # inches per cell: token labels and two decimals stay readable
    width = min(11.0, max(4.2, 1.9 + cell * num_keys))
    height = min(10.0, max(3.4, 1.4 + cell * num_queries))
    fig = Figure(figsize=(width, height), layout="constrained")
    cell = min(cell, (width - 1.9) / num_keys, (height - 1.4) / num_queries)
    return fig, fig.add_subplot(), _value_style(width, cell)


def _value_style(width: float, cell: float) -> tuple[float, str]:
    """The font size of the weights written in a heatmap's cells of `cell` inches, in a figure
    `width` inches wide, and their group id: `attn-value-small` where a phone, which scales the
    figure down to its column, would show them under `_VALUE_PX`.

    Examples:
        >>> _value_style(5.62, 0.62)  # 6 tokens a side: 10 px on a phone
        (12.0, 'attn-value')
        >>> _value_style(11.0, 0.57)  # 16 a side: 5 px on a phone, hidden there
        (11.1, 'attn-value-small')
    """
    size = round(min(12.0, 0.27 * 72 * cell), 1)  # "0.00" fills two thirds of the cell
    on_phone = size * min(4 / 3, _PHONE_PX / (72 * width))  # CSS px: 1 pt = 4/3 px, scaled
    return size, "attn-value" if on_phone >= _VALUE_PX else "attn-value-small"


def _draw_cells(
    ax: Axes,
    fig: Figure,
    rows: list[list[float]],
    crossed: list[list[float]] | None,
    labels: tuple[Sequence[str], Sequence[str]],
    colours: tuple[Any, Any],
    legend_values: tuple[str, tuple[float, str]],
    cross: dict[str, Any],
) -> dict[str, str]:
    """One coloured cell per weight, its value written in it (at `legend_values`' font size, in
    a group of its id), its tooltip; crossed if marked (named as `legend_values` says)."""
    (query_labels, key_labels), (norm, cmap) = labels, colours
    marked_label, (value_size, value_gid) = legend_values
    num_queries, num_keys = len(rows), len(rows[0])
    tooltips: dict[str, str] = getattr(fig, _TOOLTIPS_ATTR, {})
    annotate = num_queries <= 16 and num_keys <= 16
    for i, j in itertools.product(range(num_queries), range(num_keys)):
        value = rows[i][j]
        ok = math.isfinite(value)
        face = cmap(norm(value)) if ok else (0.5, 0.5, 0.5, 0.25)
        r, g, b, _ = face
        contrast = "#ffffff" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "#000000"
        is_marked = crossed is not None and crossed[i][j] != 0
        tip = f"{query_labels[i]} -> {key_labels[j]}: {value:.4f}"
        tip += f" ({marked_label})" if is_marked else ""
        # An edge in the face colour hides anti-aliasing seams between cells.
        _cell(ax, i, j, tip, tooltips, facecolor=face, edgecolor=face, linewidth=0.5,
              hatch=None if ok else "//")  # fmt: skip
        if is_marked:
            _cell(ax, i, j, None, tooltips, edgecolor=contrast, **cross)
        if annotate:
            ax.text(
                j, i, f"{value:.2f}" if ok else ("-inf" if value < 0 else str(value)),
                ha="center", va="center", fontsize=value_size, color=contrast if ok else _INK,
                gid=f"{value_gid}-{next(_cell_ids)}",
            )  # fmt: skip
    return tooltips


_HIDDEN: dict[str, Any] = {"facecolor": (0.5, 0.5, 0.5, 0.25), "hatch": "//", "hatchcolor": _INK}
_SHOWN: dict[str, Any] = {"facecolor": "#5b8def"}


def mask(
    seen: Any,
    query_labels: Sequence[str],
    key_labels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    legend: tuple[str, str] = ("hidden", "visible"),
    xlabel: str = "keys",
    ylabel: str = "queries",
) -> Figure:
    """A boolean mask drawn as a mask: two looks and a legend, no colour scale.

    True cells (may attend, as in [`causal_mask`][attention.derivation.core.causal_mask]) are
    blue; False cells (hidden) are grey and hatched `//` like the masked cells of
    [`heatmap`][attention_site.plot.heatmap]. Beyond 16 columns (or rows) only every few labels
    are written.

    Args:
        seen: bool tensor, array or nested list `(num_queries, num_keys)`; True = may attend.
        query_labels: one label per row.
        key_labels: one label per column; default `query_labels`.
        title: optional title.
        legend: the legend's names for the hidden (False) and the visible (True) cells.
        xlabel: x-axis label (the columns).
        ylabel: y-axis label (the rows).

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `seen` is not a 2-D matrix of 0/1 values, or a label count is wrong.

    Examples:
        >>> from attention import causal_mask
        >>> fig = mask(causal_mask(3), ["a", "b", "c"])
        >>> len(fig.axes), [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        (1, ['hidden', 'visible'])
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = _to_matrix(seen)
    if any(v not in (0.0, 1.0) for row in rows for v in row):
        raise ValueError(f"seen must be a bool matrix (True = may attend), got {seen!r:.60}")
    num_queries, num_keys = len(rows), len(rows[0])
    key_labels = _check_labels(rows, query_labels, key_labels, MAX_HEATMAP_SIDE)
    with _rc_context():
        cell_w = min(0.55, 3.6 / num_keys)
        cell_h = min(0.55, 4.0 / num_queries, 2 * cell_w)
        fig = Figure(figsize=(1.6 + cell_w * num_keys, 2.0 + cell_h * num_queries),
                     layout="constrained")  # fmt: skip
        ax = fig.add_subplot()
        tooltips: dict[str, str] = {}
        for i, j in itertools.product(range(num_queries), range(num_keys)):
            hide = rows[i][j] == 0.0
            tip = f"{query_labels[i]} -> {key_labels[j]}: {legend[0] if hide else legend[1]}"
            look = _HIDDEN if hide else _SHOWN
            _cell(ax, i, j, tip, tooltips, edgecolor=look["facecolor"], linewidth=0.5, **look)
        setattr(fig, _TOOLTIPS_ATTR, tooltips)
        every = (math.ceil(num_queries / 16), math.ceil(num_keys / 16))
        _matrix_axes(ax, (num_queries, num_keys), (query_labels, key_labels),
                     xlabel=xlabel, ylabel=ylabel, every=every)  # fmt: skip
        handles = [Patch(**_HIDDEN, label=legend[0]), Patch(**_SHOWN, label=legend[1])]
        ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1), ncols=2,
                  borderaxespad=0.2, handlelength=1.2)  # fmt: skip
        if title is not None:
            ax.set_title(title, pad=26)
    return fig


def lines(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    logx: bool = False,
    logy: bool = False,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
    legend: str = "below",
    integer_x: bool = False,
    ymin: float | None = None,
) -> Figure:
    """One line per named series over shared x values, with markers and a legend.

    Args:
        x: the x values, length `n`.
        series: name -> `n` y values (e.g. `{"explicit": [...], "fused": [...]}`).
        xlabel: x-axis label.
        ylabel: y-axis label.
        title: optional title.
        logx: logarithmic x axis.
        logy: logarithmic y axis.
        styles: name -> matplotlib line properties (`color`, `marker`, `linestyle`, ...) for
            the series it names, so that one series looks the same in every figure; the
            others take the colour cycle, with circles.
        legend: where the legend goes: `"below"` (the default), under the axes, off the data
            and as wide as the chart, or matplotlib's `loc` inside the axes.
        integer_x: ticks on whole numbers only, for an x that counts (layers, blocks).
        ymin: where the y axis starts (0 for sizes and norms, so that their ratios read
            true), instead of just below the lowest value.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: a series' length differs from `len(x)`, or `ymin` is not finite.

    Examples:
        >>> fig = lines([1, 2, 4], {"time": [1.0, 2.1, 3.9]}, xlabel="tokens", ylabel="ms",
        ...             styles={"time": {"color": "C3", "marker": "s"}})
        >>> fig.axes[0].get_xlabel(), fig.axes[0].lines[0].get_marker()
        ('tokens', 's')
    """
    from matplotlib.figure import Figure

    x = _numbers("x", x)
    if not isinstance(series, Mapping):
        raise TypeError(f"series must map names to y values, got {type(series).__name__}")
    for name, ys in series.items():
        if len(_numbers(f"series {name!r}", ys)) != len(x):
            raise ValueError(f"expected {len(x)} values in series {name!r}, got {len(ys)}")
    if ymin is not None and not math.isfinite(_numbers("ymin", [ymin])[0]):
        raise ValueError(f"ymin must be a finite number, got {ymin!r}")
    # wrapped to the chart's width (a wider title would widen it); a legend below in two
    # columns where two names fit side by side; the figure taller by the lines they add
    title = None if title is None else "\n".join(textwrap.fill(t, 46) for t in title.split("\n"))
    ncols = min(2 if max(map(len, series), default=0) <= 24 else 1, len(series)) or 1
    below = -(-len(series) // ncols) if legend == "below" else 0  # the legend's rows
    height = _LINES_SIZE[1] + 0.2 * below + 0.25 * (title or "").count("\n")
    with _rc_context():
        fig = Figure(figsize=(_LINES_SIZE[0], height), layout="constrained")
        ax = fig.add_subplot()
        for name, ys in series.items():
            style = {"marker": "o", **(styles or {}).get(name, {})}
            ax.plot(list(x), list(ys), label=name, **style)
        _scale_axes(ax, logx=logx, logy=logy, integer_x=integer_x, ymin=ymin)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if title is not None:
            ax.set_title(title)
        if series and legend == "below":
            fig.legend(loc="outside lower center", ncols=ncols, fontsize=10)
        elif series:
            ax.legend(loc=legend, fontsize=10)  # type: ignore[call-overload]
    setattr(fig, _LINES_ATTR, True)  # data-lines in its SVG
    return fig


def _scale_axes(ax: Any, *, logx: bool, logy: bool, integer_x: bool, ymin: float | None) -> None:
    """`lines`' axis options, set on `ax`."""
    from matplotlib.ticker import MaxNLocator

    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ymin is not None:
        ax.set_ylim(bottom=ymin)


def bars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    ylabel: str,
    title: str | None = None,
    horizontal: bool = False,
) -> Figure:
    """A bar per label, its value written above it (to two decimals, or whole if all are).

    Args:
        labels: `n` bar names (tokens, say).
        values: `n` heights.
        ylabel: the value axis' label.
        title: optional title.
        horizontal: bars left to right, one row per label and its value at the bar's end, in a
            figure a phone's width (`PHONE`) however many bars: for many bars or long labels,
            which side by side would need a wider figure than a phone shows unscaled.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `labels` and `values` differ in length.

    Examples:
        >>> fig = bars(["the", "cat", "the"], [0.5, 0.2, 0.3], ylabel="weight")
        >>> len(fig.axes[0].patches), [t.get_text() for t in fig.axes[0].get_xticklabels()]
        (3, ['the', 'cat', 'the'])
        >>> fig = bars(list("abcdefgh"), [1.0] * 8, ylabel="y", horizontal=True)
        >>> float(fig.get_figwidth()), fig.axes[0].get_yticklabels()[0].get_text()  # PHONE
        (3.8, 'a')
        >>> fig = bars(["a"], [1.0], ylabel="y", title="ones", horizontal=True)
        >>> 'aria-label="ones"' in svg(fig)  # the title is the figure's, over the labels too
        True
    """
    from matplotlib.figure import Figure

    values = _numbers("values", values)
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(f"labels must be a sequence of strings, got {labels!r:.40}")
    if len(labels) != len(values):
        raise ValueError(f"expected {len(labels)} values (one per label), got {len(values)}")
    with _rc_context():
        n = len(labels)
        # upright: 0.6 inch a bar, so that up to 6 keep a phone's scale (10 pt values at 9 px)
        size = (PHONE, 1.4 + 0.4 * n) if horizontal else (max(4.5, 1.5 + 0.6 * n), 3.8)
        fig = Figure(figsize=size, layout="constrained")
        ax = fig.add_subplot()
        # One bar per position, labelled afterwards: categorical x values would draw a
        # repeated token ("the cat the") twice at one place.
        positions = range(n)
        whole = all(v.is_integer() for v in values)  # 512 KiB, not 512.00
        if horizontal:
            container = ax.barh(positions, values, color="#5b8def")
            ax.set_yticks(positions, _literal(labels))
            ax.set_ylim(n - 0.5, -0.5)  # the first label on top, as it reads
            ax.set_xlabel(ylabel)
            ax.margins(x=0.15)  # room for the value after the longest bar
            ax.spines[["top", "right"]].set_visible(False)
        else:
            container = ax.bar(positions, values, color="#5b8def")
            ax.set_xticks(positions, _literal(labels))
            ax.set_ylabel(ylabel)
            ax.tick_params(axis="x", rotation=45 if n > 6 else 0)
            ax.spines[["top", "right"]].set_visible(False)
        ax.bar_label(container, fmt="%.0f" if whole else "%.2f", fontsize=10, padding=2)
        if title is not None and horizontal:
            fig.suptitle(title)  # over the labels too: the axes alone are narrow
        elif title is not None:  # wrapped: a wider title would widen the figure
            ax.set_title(textwrap.fill(title, 46))
    return fig


def svg(fig: Figure) -> str:
    """The figure as an inline SVG string for an HTML page; closes the figure.

    Text, axes and ticks are drawn in `currentColor` on a transparent background (legible in
    light and dark mode), heatmap cells carry a `<title>` tooltip `query -> key: weight`, and
    every element id gets a prefix unique to this figure.

    Args:
        fig: a figure from [`heatmap`][attention_site.plot.heatmap],
            [`lines`][attention_site.plot.lines] or [`bars`][attention_site.plot.bars].

    Returns:
        `<svg ...>...</svg>` with no XML prolog, ready to print from a markdown-exec block.

    Examples:
        >>> out = svg(bars(["a"], [1.0], ylabel="y"))
        >>> out.startswith('<svg class="attention-figure"'), "currentColor" in out
        (True, True)
    """
    from html import escape

    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        what = type(fig).__name__
        raise TypeError(f"fig must be a matplotlib Figure (heatmap, lines, bars), got {what}")
    buffer = io.StringIO()
    with _rc_context():
        fig.savefig(buffer, format="svg", transparent=True, bbox_inches="tight")
    if "matplotlib.pyplot" in sys.modules:  # a figure made with pyplot: drop its reference
        import matplotlib.pyplot as plt

        plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE
    text = text.replace(_INK, "currentColor")
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.DOTALL)
    # matplotlib's global `*{...}` rule would style the whole page: keep it on this svg only
    text = re.sub(r"\s*<style[^>]*>.*?</style>", "", text, count=1, flags=re.DOTALL)
    text = re.sub(r"<defs>\s*</defs>\s*", "", text)
    tips = getattr(fig, _TOOLTIPS_ATTR, {})
    if tips:  # one pass over the text, whatever the number of cells
        text = re.sub(
            r'<g id="(attn-cell-\d+)">',
            lambda m: f"{m[0]}<title>{escape(tips[m[1]])}</title>" if m[1] in tips else m[0],
            text,
        )
    prefix = f"f{next(_ids)}-"
    text = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}\1)", text)
    text = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}\1"', text)
    aria = ""
    axes_titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    axes_titles = [fig.get_suptitle()] if fig.get_suptitle() else axes_titles
    if axes_titles:
        aria = f' aria-label="{escape(axes_titles[0])}"'
    kind = ' data-lines="1"' if getattr(fig, _LINES_ATTR, False) else ""
    root = f'<svg class="attention-figure"{kind} role="img"{aria} style="{_SVG_STYLE}" '
    return text.replace("<svg ", root, 1)


def row(*figures: Figure) -> str:
    """Figures side by side where the column is wide enough, stacked where it is not.

    Args:
        figures: matplotlib figures, each turned into SVG by [`svg`][attention_site.plot.svg].

    Returns:
        One HTML `<div class="figure-row">` (a CSS grid: each column at least 18rem, or the
        whole width on a phone); no figure shrinks below its `--figure-min`, half the widest
        figure (smaller, its text could not be read): on a phone such a row scrolls sideways.

    Examples:
        >>> html = row(bars(["a"], [1.0], ylabel="y"), bars(["b"], [2.0], ylabel="y"))
        >>> html.startswith('<div class="figure-row" style="--figure-min: '), html.count("<svg")
        (True, 2)
    """
    images = [svg(fig) for fig in figures]
    points = [float(m[1]) for s in images if (m := re.search(r'width="([\d.]+)pt"', s))]
    half = round(max(points, default=0.0) * 2 / 3)  # half the widest, in CSS px (1pt = 4/3 px)
    return f'<div class="figure-row" style="--figure-min: {half}px">' + "".join(images) + "</div>"


# The figures' argument checks (every message names the argument, what was expected and
# what arrived) and the matrix cell that carries a hover tooltip.

_cell_ids = itertools.count()  # cell ids unique across one process (a page's in its own)


def _to_matrix(weights: Any) -> list[list[float]]:
    """A 2-D tensor/array/nested list as a list of rows of floats."""
    if hasattr(weights, "detach"):  # torch.Tensor
        if weights.device.type == "meta":
            raise ValueError("weights on the meta device have no values to draw")
        if weights.ndim != 2 or weights.is_complex():
            raise ValueError(
                "expected real weights of shape (num_queries, num_keys), "
                f"got {weights.dtype} of shape {tuple(weights.shape)}: select one matrix, "
                "e.g. attn_weights[0, head]"
            )
        weights = weights.detach().cpu().tolist()
    elif hasattr(weights, "tolist"):  # numpy array
        weights = weights.tolist()
    if not (
        isinstance(weights, list | tuple)
        and weights
        and all(isinstance(row, list | tuple) and len(row) == len(weights[0]) for row in weights)
        and weights[0]
    ):
        raise ValueError(
            f"expected a non-empty 2-D matrix (num_queries, num_keys), got {weights!r:.60}"
        )
    try:
        return [[float(v) for v in row] for row in weights]
    except (TypeError, ValueError):
        raise ValueError(f"expected a 2-D matrix of numbers, got {weights!r:.60}") from None


def _numbers(name: str, values: Any) -> list[float]:
    """`values` as a list of floats, or a TypeError naming `name`."""
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of real numbers, got {values!r:.40}") from None


def _check_labels(
    rows: list[list[float]],
    query_labels: Sequence[str],
    key_labels: Sequence[str] | None,
    max_side: int,
) -> Sequence[str]:
    """`key_labels` (default `query_labels`), after checking one label per row and column."""
    num_queries, num_keys = len(rows), len(rows[0])
    if max(num_queries, num_keys) > max_side:
        raise ValueError(
            f"a heatmap draws one labelled cell per weight: ({num_queries}, {num_keys}) is too "
            f"many to read (at most {max_side} per side); pass a slice, e.g. "
            f"weights[:{max_side // 2}, :{max_side // 2}]"
        )
    key_labels = query_labels if key_labels is None else key_labels
    for name, labels, n, what in (
        ("query_labels", query_labels, num_queries, "row"),
        ("key_labels", key_labels, num_keys, "column"),
    ):
        if isinstance(labels, str) or not isinstance(labels, Sequence):
            raise TypeError(f"{name} must be a sequence of strings, got {labels!r:.40}")
        if len(labels) != n:
            raise ValueError(
                f"expected {n} {name} (one per {what} of weights ({num_queries}, {num_keys})), "
                f"got {len(labels)}"
            )
    return key_labels


def _cell(
    ax: Axes, i: int, j: int, tip: str | None, tooltips: dict[str, str], **style: Any
) -> None:
    """One matrix cell at row `i`, column `j`, with its hover tooltip (none if `tip` is None)."""
    from matplotlib.patches import Rectangle

    patch = Rectangle((j - 0.5, i - 0.5), 1, 1, **style)
    if tip is not None:
        gid = f"attn-cell-{next(_cell_ids)}"
        patch.set_gid(gid)
        tooltips[gid] = tip
    ax.add_patch(patch)


def phone_px(fig: Figure, width_px: float = _PHONE_PX) -> float:
    """The smallest text of `fig` as a phone shows it, in CSS px: each visible text's size
    (1 pt = 4/3 px), scaled down as the page scales the SVG (`svg`: the tight bounding box, plus
    its 0.1 inch pad) to a column `width_px` wide; never scaled up.

    Examples:
        >>> phone_px(lines([1, 2], {"a": [1.0, 2.0]}, xlabel="x", ylabel="y")) >= 9
        True
    """
    from matplotlib.text import Text

    box = fig.get_tightbbox()
    scale = min(1.0, width_px / (96 * (box.width + 0.2)))  # 96 CSS px per inch
    shown = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    sizes = [float(t.get_fontsize()) for t in shown if t.get_window_extent().width > 0]
    return float(4 / 3 * min(sizes, default=math.inf) * scale)
