r"""What the site shows: attention heatmaps, line and bar charts as inline SVG, and source.

Every figure on the documentation site comes from here. matplotlib is optional (the `docs`
extra) and imported only when a function below is called, so `import attention` never loads
it. Figures are built on a bare `matplotlib.figure.Figure` (no pyplot state, no GUI backend)
and [`svg`][attention.plot.svg] turns one into a self-contained SVG string that:

- has a transparent background and draws its text, axes and ticks in `currentColor`, so it
  takes the page's text colour and reads in both the light and the dark palette;
- keeps text as text (`svg.fonttype = "none"`), in the page's own font;
- gives every heatmap cell a hover tooltip `query -> key: weight`;
- prefixes its element ids, so several figures can share one HTML page.

Examples:
    >>> import torch
    >>> from attention.plot import heatmap, svg
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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is optional: imported lazily, inside the functions
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["bars", "heatmap", "lines", "row", "source", "svg"]

MAX_HEATMAP_SIDE = 64
"""The most rows or columns [`heatmap`][attention.plot.heatmap] draws, one labelled cell each."""

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
_ids = itertools.count()  # unique prefixes across one process (one docs build)


def _rc_context() -> Any:
    import matplotlib

    return matplotlib.rc_context(_RC)  # type: ignore[arg-type]


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


def _literal(labels: Sequence[Any]) -> list[str]:
    """Labels drawn as written: a `$` would otherwise start matplotlib's math mode."""
    return [str(label).replace("$", r"\$") for label in labels]


def _numbers(name: str, values: Any) -> list[float]:
    """`values` as a list of floats, or a TypeError naming `name`."""
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of real numbers, got {values!r:.40}") from None


def heatmap(
    weights: Any,
    query_labels: Sequence[str],
    key_labels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    r"""An attention-weight matrix as a heatmap, with the tokens on both axes.

    Row $i$ is query token $i$ (y axis, "queries"), column $j$ key token $j$ (x axis, "keys");
    each cell shows $\alpha_{ij}$ (or any score) to two decimals and, as an SVG tooltip, to
    four. Non-finite cells (masked $-\infty$ scores) are drawn hatched and labelled.

    Args:
        weights: tensor, array or nested list of shape `(num_queries, num_keys)`.
        query_labels: `num_queries` token strings, one per row.
        key_labels: `num_keys` token strings, one per column; default `query_labels`
            (self-attention).
        title: optional title above the matrix.
        ax: draw into these axes instead of a new figure (e.g. one panel per head).

    Returns:
        The matplotlib `Figure`; pass it to [`svg`][attention.plot.svg].

    Raises:
        ValueError: `weights` is not 2-D, or a label count does not match its dimension.

    Examples:
        >>> import torch
        >>> fig = heatmap(torch.eye(3), ["a", "b", "c"], title="identity")
        >>> fig.axes[0].get_ylabel(), fig.axes[0].get_xlabel()
        ('queries', 'keys')
        >>> heatmap(torch.eye(3), ["a", "b"])
        Traceback (most recent call last):
        ...
        ValueError: expected 3 query_labels (one per row of weights (3, 3)), got 2
    """
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    rows = _to_matrix(weights)
    num_queries, num_keys = len(rows), len(rows[0])
    if max(num_queries, num_keys) > MAX_HEATMAP_SIDE:
        raise ValueError(
            f"a heatmap draws one labelled cell per weight: ({num_queries}, {num_keys}) is too "
            f"many to read (at most {MAX_HEATMAP_SIDE} per side); pass a slice, e.g. "
            f"weights[:{MAX_HEATMAP_SIDE // 2}, :{MAX_HEATMAP_SIDE // 2}]"
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

    finite = [v for row in rows for v in row if math.isfinite(v)]
    vmin, vmax = (min(finite), max(finite)) if finite else (0.0, 1.0)
    norm = Normalize(vmin=vmin, vmax=vmax if vmax > vmin else vmin + 1.0)

    with _rc_context():
        import matplotlib

        cmap = matplotlib.colormaps["viridis"]
        if ax is None:
            cell = 0.62  # inches per cell: token labels and two decimals stay readable
            width = min(11.0, max(4.2, 1.9 + cell * num_keys))
            height = min(10.0, max(3.4, 1.4 + cell * num_queries))
            fig = Figure(figsize=(width, height), layout="constrained")
            ax = fig.add_subplot()
        else:
            fig = ax.get_figure()  # type: ignore[assignment]
        tooltips: dict[str, str] = getattr(fig, _TOOLTIPS_ATTR, {})
        annotate = num_queries <= 16 and num_keys <= 16
        for i, j in itertools.product(range(num_queries), range(num_keys)):
            value = rows[i][j]
            ok = math.isfinite(value)
            face = cmap(norm(value)) if ok else (0.5, 0.5, 0.5, 0.25)
            # An edge in the face colour hides anti-aliasing seams between cells.
            patch = Rectangle(
                (j - 0.5, i - 0.5), 1, 1, facecolor=face, edgecolor=face, linewidth=0.5,
                hatch=None if ok else "//",
            )  # fmt: skip
            gid = f"attn-cell-{next(_ids)}"
            patch.set_gid(gid)
            ax.add_patch(patch)
            tooltips[gid] = f"{query_labels[i]} -> {key_labels[j]}: {value:.4f}"
            if annotate:
                r, g, b, _ = face
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(
                    j, i, f"{value:.2f}" if ok else ("-inf" if value < 0 else str(value)),
                    ha="center", va="center", fontsize=9,
                    color=("#ffffff" if dark else "#000000") if ok else _INK,
                )  # fmt: skip
        setattr(fig, _TOOLTIPS_ATTR, tooltips)
        ax.set_xlim(-0.5, num_keys - 0.5)
        ax.set_ylim(num_queries - 0.5, -0.5)  # first query on top, like the matrix
        ax.set_aspect("equal")
        ax.set_xticks(range(num_keys), _literal(key_labels), rotation=45, ha="right")
        ax.set_yticks(range(num_queries), _literal(query_labels))
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        ax.set_xlabel("keys")
        ax.set_ylabel("queries")
        if title is not None:
            ax.set_title(title)
        import matplotlib.cm

        fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.8)
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

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: a series' length differs from `len(x)`.

    Examples:
        >>> fig = lines([1, 2, 4], {"time": [1.0, 2.1, 3.9]}, xlabel="tokens", ylabel="ms")
        >>> fig.axes[0].get_xlabel(), len(fig.axes[0].lines)
        ('tokens', 1)
    """
    from matplotlib.figure import Figure

    x = _numbers("x", x)
    if not isinstance(series, Mapping):
        raise TypeError(f"series must map names to y values, got {type(series).__name__}")
    for name, ys in series.items():
        if len(_numbers(f"series {name!r}", ys)) != len(x):
            raise ValueError(f"expected {len(x)} values in series {name!r}, got {len(ys)}")
    with _rc_context():
        fig = Figure(figsize=(7.0, 4.2), layout="constrained")
        ax = fig.add_subplot()
        for name, ys in series.items():
            ax.plot(list(x), list(ys), marker="o", label=name)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if title is not None:
            ax.set_title(title)
        if series:
            ax.legend()
    return fig


def bars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    ylabel: str,
    title: str | None = None,
) -> Figure:
    """A bar per label, its value written above it.

    Args:
        labels: `n` bar names (tokens, say).
        values: `n` heights.
        ylabel: y-axis label.
        title: optional title.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `labels` and `values` differ in length.

    Examples:
        >>> fig = bars(["the", "cat", "the"], [0.5, 0.2, 0.3], ylabel="weight")
        >>> len(fig.axes[0].patches), [t.get_text() for t in fig.axes[0].get_xticklabels()]
        (3, ['the', 'cat', 'the'])
    """
    from matplotlib.figure import Figure

    values = _numbers("values", values)
    if isinstance(labels, str) or not isinstance(labels, Sequence):
        raise TypeError(f"labels must be a sequence of strings, got {labels!r:.40}")
    if len(labels) != len(values):
        raise ValueError(f"expected {len(labels)} values (one per label), got {len(values)}")
    with _rc_context():
        fig = Figure(figsize=(max(4.5, 1.5 + 0.8 * len(labels)), 3.8), layout="constrained")
        ax = fig.add_subplot()
        # One bar per position, labelled afterwards: categorical x values would draw a
        # repeated token ("the cat the") twice at one place.
        positions = range(len(values))
        container = ax.bar(positions, values, color="#5b8def")
        ax.set_xticks(positions, _literal(labels))
        ax.bar_label(container, fmt="%.2f", fontsize=9)
        ax.set_ylabel(ylabel)
        ax.tick_params(axis="x", rotation=45 if len(labels) > 6 else 0)
        ax.spines[["top", "right"]].set_visible(False)
        if title is not None:
            ax.set_title(title)
    return fig


def svg(fig: Figure) -> str:
    """The figure as an inline SVG string for an HTML page; closes the figure.

    Text, axes and ticks are drawn in `currentColor` on a transparent background (legible in
    light and dark mode), heatmap cells carry a `<title>` tooltip `query -> key: weight`, and
    every element id gets a prefix unique to this figure.

    Args:
        fig: a figure from [`heatmap`][attention.plot.heatmap],
            [`lines`][attention.plot.lines] or [`bars`][attention.plot.bars].

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
    if axes_titles:
        aria = f' aria-label="{escape(axes_titles[0])}"'
    root = f'<svg class="attention-figure" role="img"{aria} style="{_SVG_STYLE}" '
    return text.replace("<svg ", root, 1)


def row(*figures: Figure) -> str:
    """Figures side by side where the column is wide enough, stacked where it is not.

    Args:
        figures: matplotlib figures, each turned into SVG by [`svg`][attention.plot.svg].

    Returns:
        One HTML `<div class="figure-row">` (a CSS grid: the site's stylesheet sets each
        column to at least 18rem, or the whole width on a phone).

    Examples:
        >>> html = row(bars(["a"], [1.0], ylabel="y"), bars(["b"], [2.0], ylabel="y"))
        >>> html.startswith('<div class="figure-row">') and html.count("<svg") == 2
        True
    """
    return '<div class="figure-row">' + "".join(svg(fig) for fig in figures) + "</div>"


def source(*objs: Any, docstrings: bool = False) -> str:
    """The package's own source of `objs`, as one fenced python block for a page to print.

    Pages show the code that runs, never a copy of it: a chapter prints
    `source(CausalAttention.forward)` from an `exec="1"` block and the reader sees the lines
    the package executes today.

    Args:
        *objs: functions, methods or classes.
        docstrings: keep their docstrings (by default they are dropped: the page's prose and
            the API reference carry them).

    Returns:
        Markdown: a fenced python block holding each object's dedented source, in order.

    Examples:
        >>> from attention.core import softmax_stable
        >>> block = source(softmax_stable)
        >>> block.splitlines()[:2]
        ['```python', 'def softmax_stable(x: Tensor, dim: int = -1) -> Tensor:']
        >>> "Softmax that cannot overflow" in block  # the docstring is dropped
        False
    """
    import ast
    import inspect
    import textwrap

    blocks = []
    for obj in objs:
        src = textwrap.dedent(inspect.getsource(obj))
        dropped: set[int] = set()
        if not docstrings:
            for node in ast.walk(ast.parse(src)):
                body = getattr(node, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                    value = body[0].value
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        end = body[0].end_lineno or body[0].lineno
                        dropped.update(range(body[0].lineno, end + 1))
        kept = [line for n, line in enumerate(src.splitlines(), 1) if n not in dropped]
        blocks.append("\n".join(kept))
    return "```python\n" + "\n\n".join(blocks) + "\n```"
