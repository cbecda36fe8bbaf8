r"""Diagrams of the computations, drawn by code from the shapes of the real objects.

Boxes and arrows for what a chapter computes. Each function takes the objects a page holds (a
module and its input, the tensors themselves), runs them, and writes every size it shows from
the results, so a diagram cannot disagree with the code. Each returns a matplotlib `Figure`
for [`svg`][attention_site.plot.svg], drawn in the plot module's ink (`currentColor` on the page),
its boxes in a faint fill that reads on the light and the dark palette alike.

Examples:
    >>> from attention.derivation.core import causal_mask as mask_of
    >>> from attention_site.plot import svg
    >>> fig = mask_grid(mask_of(3), ["Your", "journey", "starts"])
    >>> "−∞" in [t.get_text() for t in fig.axes[0].texts], svg(fig).startswith("<svg")
    (True, True)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attention.checks import check_size, check_tensor
from attention.derivation.core import attention_scores, explicit_attention
from attention.layer.masks import Mask
from attention.layer.multihead import MultiHeadAttention
from attention.layer.positions import apply_rope, rope_angles, rope_frequencies
from attention.layer.tiled import FULL, SKIPPED, tile_grid
from attention.model.gpt import TransformerBlock
from attention_site.plot import _INK, _literal

if TYPE_CHECKING:  # matplotlib is optional: imported lazily, inside the functions
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

__all__ = [
    "attention_flow",
    "encoder_decoder",
    "gqa_groups",
    "kv_cache",
    "mask_grid",
    "qkv",
    "ring_buffer",
    "rope_rotation",
    "split_heads",
    "tile_grids",
    "transformer_block",
]

_FILL = (0.36, 0.55, 0.94, 0.16)  # the plot module's blue, faint: reads on light and dark
_SEEN = (0.36, 0.55, 0.94, 0.45)  # the same blue, stronger: a key a query sees
_NEW = (0.91, 0.64, 0.24, 0.7)  # orange: what this step writes, or the bottleneck
_FAINT_INK = (*(int(_INK[i : i + 2], 16) / 255 for i in (1, 3, 5)), 0.08)  # grey on either
_HEADS = ("#5b8def", "#e8a33d", "#4caf7a", "#d9607a")  # one colour per head drawn
_Point = tuple[float, float]
_WIDEST = 4.7
"""The widest board, in inches: saved with 0.1 in of margin each side (4.9 in), a phone's column
(358 px) shows it at 358 / (4.9 × 72) px per point, so 9 pt text at 9.1 px."""


def _shape(t: Tensor) -> str:
    return str(tuple(t.shape))


def _sub(n: int) -> str:
    """`n` in subscript digits: `"h" + _sub(12)` reads h₁₂."""
    return str(n).translate(str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉"))


def _width(label: str, size: float) -> float:
    """Inches a box needs for `label` at font `size` (a generous average glyph width)."""
    return max(0.5, 0.072 * size / 10 * max(map(len, label.split("\n"))) + 0.22)


def _span(text: str, size: float = 9) -> float:
    """Inches one line of `text` takes at font `size`, as matplotlib lays it out."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    width, _, _ = TextToPath().get_text_width_height_descent(text, FontProperties(size=size),
                                                             ismath=False)  # fmt: skip
    return width / 72


class _Board:
    """One diagram: a bare figure whose axes measure inches, holding boxes, arrows and grids."""

    def __init__(self, width: float, height: float, title: str) -> None:
        from matplotlib.figure import Figure

        self.fig = Figure(figsize=(width, height))
        self.ax = self.fig.add_axes((0.0, 0.0, 1.0, 1.0))
        self.ax.set(xlim=(0, width), ylim=(0, height))
        self.ax.set_axis_off()
        self.ax.set_title(title, fontsize=11, color=_INK)

    def text(self, x: float, y: float, s: str, size: float = 9, **kw: Any) -> None:
        kw = {"ha": "center", "va": "center", **kw}
        self.ax.text(x, y, s, fontsize=size, color=_INK, linespacing=1.3, **kw)

    def box(self, x: float, y: float, label: str, *, w: float = 0.0, h: float = 0.46,
            fill: Any = _FILL, size: float = 10) -> Patch:  # fmt: skip
        """A rounded box centred on `(x, y)`, as wide as its longest line unless `w` is given."""
        from matplotlib.patches import FancyBboxPatch

        w = w or _width(label, size)
        style = "round,pad=0,rounding_size=0.06"
        patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, style, facecolor=fill, edgecolor=_INK)
        self.ax.add_patch(patch)
        self.text(x, y, label, size)
        return patch

    def chain(self, x: float, y: float, labels: Sequence[str], size: float = 9) -> list[Patch]:
        """Boxes left to right from `x`, each with an arrow to the next; returns the boxes."""
        boxes = []
        for label in labels:
            w = _width(label, size)
            boxes.append(self.box(x + w / 2, y, label, size=size))
            x += w + 0.3
        for a, b in itertools.pairwise(boxes):
            self.arrow(a, b)
        return boxes

    def arrow(self, a: Patch | _Point, b: Patch | _Point, label: str = "", *,
              at: _Point = (0.0, 0.14), bend: str = "arc3", style: str = "-|>",
              width: float = 0.9, **kw: Any) -> None:  # fmt: skip
        """An arrow from box or point `a` to box or point `b`, `label` beside its middle."""
        from matplotlib.patches import FancyArrowPatch

        def centre(p: Patch | _Point) -> _Point:
            if isinstance(p, tuple):
                return p
            box = p.get_extents().transformed(self.ax.transData.inverted())
            return (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2

        (x0, y0), (x1, y1) = centre(a), centre(b)
        self.ax.add_patch(FancyArrowPatch(
            (x0, y0), (x1, y1), arrowstyle=style, mutation_scale=9, color=_INK, lw=width,
            connectionstyle=bend, shrinkA=1, shrinkB=1,
            patchA=None if isinstance(a, tuple) else a, patchB=None if isinstance(b, tuple) else b,
        ))  # fmt: skip
        if label:
            self.text((x0 + x1) / 2 + at[0], (y0 + y1) / 2 + at[1], label, **kw)

    def cells(self, x: float, y: float, rows: int, cols: int, face: Any, cell: float) -> None:
        """A `rows x cols` grid, top left corner at `(x, y)`; cell (i, j) in `face(i, j)`."""
        from matplotlib.patches import Rectangle

        for i in range(rows):
            for j in range(cols):
                colour = face(i, j) if callable(face) else face
                corner = (x + j * cell, y - (i + 1) * cell)
                self.ax.add_patch(Rectangle(corner, cell, cell, fc=colour, ec=_INK, lw=0.4))

    def legend(self, x: float, y: float, items: Sequence[tuple[Any, str]], dx: float = 0.0,
               dy: float = -0.4, size: float = 9) -> None:  # fmt: skip
        """A small swatch and its label per `(colour, label)`, each `(dx, dy)` after the last."""
        for n, (face, label) in enumerate(items):
            self.cells(x + n * dx, y + n * dy + 0.1, 1, 1, face, 0.2)
            self.text(x + n * dx + 0.28, y + n * dy, label, ha="left", size=size)

    def plus(self, x: float, y: float) -> Patch:
        """A circled "+" centred on `(x, y)`: where a branch adds into the residual stream."""
        from matplotlib.patches import Circle

        patch = Circle((x, y), 0.15, facecolor=_FILL, edgecolor=_INK, lw=1.0)
        self.ax.add_patch(patch)
        self.text(x, y + 0.01, "+", size=11)
        return patch

    def ray(
        self, origin: _Point, angle: float, r: float, colour: Any, width: float = 1.4
    ) -> _Point:
        """An arrow from `origin`, `r` inches long at `angle` radians; returns its tip."""
        from matplotlib.patches import FancyArrowPatch

        tip = (origin[0] + r * math.cos(angle), origin[1] + r * math.sin(angle))
        arrow = FancyArrowPatch(origin, tip, arrowstyle="-|>", mutation_scale=9, color=colour,
                                lw=width, shrinkA=0, shrinkB=0)  # fmt: skip
        self.ax.add_patch(arrow)
        return tip

    def dial(self, origin: _Point, r: float) -> None:
        """A faint circle of radius `r` with its two axes: the plane of one pair."""
        from matplotlib.patches import Circle

        self.ax.add_patch(
            Circle(origin, r, facecolor="none", edgecolor=(*_FAINT_INK[:3], 0.45), lw=0.6)
        )
        for dx, dy in ((1, 0), (0, 1)):
            xs, ys = (
                (origin[0] - dx * r, origin[0] + dx * r),
                (origin[1] - dy * r, origin[1] + dy * r),
            )
            self.ax.plot(xs, ys, color=_INK, lw=0.3, alpha=0.45)

    def done(self, note: str, size: float = 9) -> Figure:
        """The figure, with `note` (what the sizes are) along its bottom edge."""
        self.text(0.05, 0.12, note, size=size, ha="left")
        return self.fig


def _matrix(name: str, W: object, d_in: int) -> Tensor:
    """`W` (an `nn.Linear`, which stores it transposed, or a matrix) as the math's `(d_in, d)`."""
    matrix = W.weight.T if isinstance(W, nn.Linear) else check_tensor(name, W, ndim=2)
    if matrix.shape[0] != d_in:
        raise ValueError(f"{name} must take d_in={d_in} inputs (x's last dimension), got a "
                         f"(d_in, d) matrix of shape {tuple(matrix.shape)}")  # fmt: skip
    return matrix


def qkv(x: Tensor, W_query: Tensor | nn.Linear, W_key: Tensor | nn.Linear,
        W_value: Tensor | nn.Linear) -> Figure:  # fmt: skip
    r"""$X$ projected three times, $Q = X W_q$, $K = X W_k$, $V = X W_v$, with their shapes.

    Args:
        x: the embeddings $X$, `(num_tokens, d_in)` or `(batch, num_tokens, d_in)`.
        W_query: $W_q$, an `nn.Linear(d_in, d_q)` or a `(d_in, d_q)` matrix.
        W_key: $W_k$, likewise.
        W_value: $W_v$, likewise.

    Returns:
        The diagram; each box states the shape its projection returned.

    Raises:
        TypeError: `x` is not a floating-point tensor, or a matrix not a tensor.
        ValueError: `x` is not 2-D or 3-D, or a matrix does not take `d_in` inputs.

    Examples:
        >>> from attention import SelfAttentionV2, example_inputs
        >>> sa = SelfAttentionV2(d_in=3, d_out=2)
        >>> fig = qkv(example_inputs(), sa.W_query, sa.W_key, sa.W_value)
        >>> texts = [t.get_text() for t in fig.axes[0].texts]
        >>> "X\n(6, 3)" in texts, "W_q\n(3, 2)" in texts, "V\n(6, 2)" in texts
        (True, True, True)
    """
    check_tensor("x", x, ndim=(2, 3), floating=True)
    d_in, wide = x.shape[-1], x.ndim == 3
    board = _Board(4.8 if wide else 4.7, 2.7, "queries, keys and values: three projections of X")
    source = board.box(0.55, 1.4, f"X\n{_shape(x)}")
    widths = []
    rows = (("W_query", "q", "Q", W_query, "what each token\nasks"),
            ("W_key", "k", "K", W_key, "what each token\noffers"),
            ("W_value", "v", "V", W_value, "what each token\nhands over"))  # fmt: skip
    for (name, sym, big, W, role), y in zip(rows, (2.15, 1.4, 0.65), strict=True):
        matrix = _matrix(name, W, d_in)
        with torch.no_grad():
            out = W(x) if isinstance(W, nn.Linear) else x @ matrix
        widths.append(out.shape[-1])
        weight = board.box(1.8, y, f"W_{sym}\n{_shape(matrix)}", w=0.72, fill="none")
        result = board.box(3.05, y, f"{big}\n{_shape(out)}", w=0.95 if wide else 0.72)
        board.arrow(source, weight)
        board.arrow(weight, result)
        board.text(3.65 if wide else 3.55, y, role, ha="left", size=9.5)  # two lines: a phone
    batch = f"b = {x.shape[0]} · " if wide else ""
    return board.done(f"{batch}T = {x.shape[-2]} tokens · d_in = {d_in} · d_q = {widths[0]} · "
                      f"d_k = {widths[1]} · d_v = {widths[2]}", size=9.5)  # fmt: skip


def attention_flow(queries: Tensor, keys: Tensor, values: Tensor,
                   mask: Tensor | None = None) -> Figure:  # fmt: skip
    r"""From $Q$, $K$, $V$ to $Z$: scores, scaling, softmax, weighted sum, with every shape.

    Args:
        queries: $Q$, `(..., num_queries, d_k)`.
        keys: $K$, `(..., num_keys, d_k)`.
        values: $V$, `(..., num_keys, d_v)`.
        mask: optional bool mask, True = may attend (drawn as $+ M$ before the softmax).

    Raises:
        TypeError: an argument is not a floating-point tensor.
        ValueError: shapes that do not fit together (as `explicit_attention` says).

    Examples:
        >>> q = k = v = torch.ones(4, 8)
        >>> texts = [t.get_text() for t in attention_flow(q, k, v).axes[0].texts]
        >>> "ω = Q Kᵀ\n(4, 4)" in texts, "÷ √d_k (d_k = 8)\nsoftmax per row" in texts
        (True, True)
    """
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        check_tensor(name, t, floating=True)
    with torch.no_grad():
        scores = attention_scores(queries, keys)
        context_vec, weights = explicit_attention(queries, keys, values, mask)
    board = _Board(4.6, 2.55, "from queries, keys and values to context vectors")  # a phone's
    q = board.box(0.55, 2.0, f"Q\n{_shape(queries)}")
    k = board.box(0.55, 1.25, f"K\n{_shape(keys)}")
    v = board.box(0.55, 0.55, f"V\n{_shape(values)}")
    omega = board.box(1.8, 1.62, f"ω = Q Kᵀ\n{_shape(scores)}")
    alpha = board.box(3.25, 1.62, f"α\n{_shape(weights)}")
    z = board.box(4.1, 1.62, f"Z = α V\n{_shape(context_vec)}")
    board.arrow(q, omega)
    board.arrow(k, omega)
    step = f"÷ √d_k (d_k = {keys.shape[-1]}){'' if mask is None else ', + M'}\nsoftmax per row"
    board.arrow(omega, alpha, step, at=(0.0, 0.5), size=9.5)
    board.arrow(alpha, z)
    board.arrow(v, z, bend="angle,angleA=0,angleB=90,rad=0")
    return board.done("each row of α sums to 1: row i of Z mixes the rows of V")


def mask_grid(mask: Tensor, tokens: Sequence[str] | None = None) -> Figure:
    r"""The mask as a grid: which keys each query sees ($M_{ij} = 0$), which are hidden.

    Args:
        mask: bool `(num_queries, num_keys)`, True = may attend, as
            [`attention.derivation.core.causal_mask`][attention.derivation.core.causal_mask] or
            [`chunk_mask`][attention.layer.masks.chunk_mask] return it; at most 16 keys.
        tokens: one label per key; the queries are the last `num_queries` of them (a chunk's
            queries are the newest tokens). Default: the positions `0, 1, ...`.

    Returns:
        The diagram: $M_{ij}$ in each (query, key) cell, and how many keys each query sees.

    Raises:
        TypeError: `mask` is not a bool tensor.
        ValueError: `mask` is not 2-D, has more than 16 keys or more queries than keys, or
            `tokens` is not one label per key.

    Examples:
        >>> from attention.derivation.core import causal_mask as mask_of
        >>> fig = mask_grid(mask_of(4), ["a", "b", "c", "d"])
        >>> texts = [t.get_text() for t in fig.axes[0].texts]
        >>> texts.count("−∞"), texts.count("0")  # 6 future cells, 10 seen
        (6, 10)
    """
    check_tensor("mask", mask, ndim=2)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}")
    n_q, n_k = mask.shape
    if not 1 <= n_q <= n_k <= 16:
        raise ValueError("mask must be (num_queries, num_keys) with 1 <= num_queries <= "
                         f"num_keys <= 16, got {tuple(mask.shape)}: draw a slice")  # fmt: skip
    labels = [str(j) for j in range(n_k)] if tokens is None else tokens
    if isinstance(labels, str) or not isinstance(labels, Sequence) or len(labels) != n_k:
        raise ValueError(f"tokens must be {n_k} labels (one per key), got {tokens!r:.60}")
    labels, hidden = _literal(labels), (~mask).cpu().tolist()
    cell = min(0.36, 2.6 / n_k)
    left, top = 1.1, 0.95 + n_q * cell  # the legend under the grid: a phone's width (4 in)
    right = left + n_k * cell
    board = _Board(max(right + 0.6, 3.9), top + 0.8, "causal mask: which keys each query sees")
    board.cells(left, top, n_q, n_k, lambda i, j: _FAINT_INK if hidden[i][j] else _SEEN, cell)
    for i in range(n_q):
        y = top - (i + 0.5) * cell
        board.text(left - 0.08, y, labels[n_k - n_q + i], ha="right")
        board.text(right + 0.12, y, str(n_k - sum(hidden[i])), ha="left")
        for j in range(n_k):
            board.text(left + (j + 0.5) * cell, y, "−∞" if hidden[i][j] else "0", size=8.5)
    for j in range(n_k):
        board.text(left + (j + 0.5) * cell, top + 0.06, labels[j], rotation=45, ha="left",
                   va="bottom", rotation_mode="anchor")  # fmt: skip
    board.text(left - 0.08, top + 0.12, "query ↓  key →", ha="right", va="bottom")
    board.text(right + 0.12, top + 0.12, "sees", ha="left", va="bottom")
    board.legend(0.1, 0.62, [(_SEEN, "sees: M = 0"), (_FAINT_INK, "hidden: M = −∞")], dx=1.5,
                 dy=0.0, size=9)  # fmt: skip
    return board.done(f"mask {_shape(mask)} · α = softmax(ω / √d_k + M), and e^(−∞) = 0")


def _outline(board: _Board, x: float, y: float, w: float, h: float) -> None:
    """A thick frame, top left corner at `(x, y)`: the cells one token's numbers fill."""
    from matplotlib.patches import Rectangle

    board.ax.add_patch(Rectangle((x, y - h), w, h, fill=False, ec=_INK, lw=1.8, zorder=3))


def _split_grids(board: _Board, top: float, size: tuple[int, int, int], k: int,
                 xs: tuple[float, float, float]) -> None:  # fmt: skip
    """The three grids of `split_heads` (`size` = tokens, heads, columns drawn; `xs` their left
    edges), with token `k` outlined in each and a line per head from the view to the transpose."""
    rows, heads, cols = size
    (x_a, x_b, x_c), c, gap = xs, 0.1, 0.07  # a cell; the gap between tokens in the view
    board.cells(x_a, top, rows, heads * cols, lambda i, j: _HEADS[j // cols], c)  # (T, d_out)
    _outline(board, x_a, top - k * c, heads * cols * c, c)
    for t in range(rows):  # the view: token t's d_out numbers as h rows of d_h
        y = top - t * (heads * c + gap)
        board.cells(x_b, y, heads, cols, lambda i, j: _HEADS[i], c)
        board.text(x_b - 0.06, y - heads * c / 2, f"token {t}", ha="right")
    for t in sorted({0, rows - 1}):  # the first and the last row: 9 pt is taller than a cell
        board.text(x_a - 0.06, top - (t + 0.5) * c, str(t), ha="right")
    _outline(board, x_b, top - k * (heads * c + gap), cols * c, heads * c)
    for head in range(heads):  # the transpose: row `head` of every token's block
        y = top - head * (rows * c + 0.14)
        board.cells(x_c, y, rows, cols, _HEADS[head], c)
        board.text(x_c + cols * c + 0.08, y - rows * c / 2, f"head {head}", ha="left")
        _outline(board, x_c, y - k * c, cols * c, c)
        source = (x_b + cols * c, top - k * (heads * c + gap) - (head + 0.5) * c)
        board.ax.plot([source[0], x_c], [source[1], y - (k + 0.5) * c], color=_HEADS[head],
                      lw=0.9)  # fmt: skip


def split_heads(mha: MultiHeadAttention, x: Tensor) -> Figure:
    r"""Queries cut into heads (`view`), heads moved before tokens (`transpose`), and back.

    Runs `mha` on `x`; draws one sequence, a cell per number (where they fit) coloured by head,
    and follows one token's numbers (outlined) through the `view` and the `transpose`.

    Args:
        mha: a [`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention].
        x: its input, `(batch, num_tokens, d_in)`.

    Raises:
        TypeError: `mha` is not a `MultiHeadAttention`.
        ValueError: `x` is not an input `mha` accepts (as `mha` says).

    Examples:
        >>> from attention import MultiHeadAttention
        >>> mha = MultiHeadAttention(3, 12, context_length=6, dropout=0.0, num_heads=3)
        >>> texts = [t.get_text() for t in split_heads(mha, torch.ones(2, 6, 3)).axes[0].texts]
        >>> ".view(b, T, h, d_h)\n(2, 6, 3, 4)" in texts, "head 2" in texts, "token 5" in texts
        (True, True, True)
    """
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"mha must be a MultiHeadAttention, got {type(mha).__name__}")
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # dropout leaves no trace
        out, weights = mha(x, need_weights=True)  # checks x
        queries = mha.W_query(x)  # (b, T, d_out)
        viewed = queries.view(*queries.shape[:2], mha.num_heads, mha.head_dim)  # (b, T, h, d_h)
        split, _, values = mha.project(x)  # (b, h, T, d_h), (b, h_kv, T, d_h): as forward does
        context = weights @ values.repeat_interleave(mha.num_heads // mha.num_kv_heads, dim=1)
        joined = context.transpose(1, 2)  # (b, T, h, d_h)
        merged = joined.reshape(*joined.shape[:2], -1)  # (b, T, d_out)
    b, T, h, d_h = viewed.shape
    rows, heads, cols = min(T, 6), min(h, 4), min(d_h, 4)
    k = min(1, rows - 1)  # the token followed through both steps
    grids = max(rows * (heads * 0.1 + 0.07), heads * (rows * 0.1 + 0.14))  # the tallest
    top = max(2.15 + grids, 3.6 + rows * 0.1)  # room for the grids, and for the notes under Q
    x_a = 0.5
    x_b = x_a + heads * cols * 0.1 + 0.95
    x_c = x_b + cols * 0.1 + 0.7
    # under 4.8 inches wide, the joining steps in two rows: a phone shows its 9 pt at 9 px
    board = _Board(max(4.7, x_c + cols * 0.1 + 0.6), top + 0.8,
                   "splitting d_out into heads, and back")  # fmt: skip
    _split_grids(board, top, (rows, heads, cols), k, (x_a, x_b, x_c))
    for x0, text, t in ((x_a - 0.25, "Q = W_query(x)", queries), (x_b - 0.5, ".view(b, T, h, "
                        "d_h)", viewed), (x_c - 0.1, ".transpose(1, 2)", split)):  # fmt: skip
        board.text(x0, top + 0.08, f"{text}\n{_shape(t)}", ha="left", va="bottom")
    board.arrow((x_a + heads * cols * 0.1 + 0.08, top - 0.3), (x_b - 0.55, top - 0.3))
    notes = (f"view: each token's d_out\nnumbers re-read as {h} rows\nof d_h; no number moves",
             "transpose: row i of every\ntoken's block goes to head i,\n"
             f"which holds all {T} tokens", f"outlined: token {k}'s numbers")  # fmt: skip
    for n, note in enumerate(notes):
        board.text(0.25, top - rows * 0.1 - 0.3 - 0.62 * n, note, ha="left", va="top",
                   style="italic")  # fmt: skip
    board.text(0.05, 1.6, f"after attention (weights {_shape(weights)}), joining:", ha="left")
    first = board.chain(0.05, 1.15, [f"α V per head\n{_shape(context)}",
                                     f"transpose(1, 2)\n{_shape(joined)}"])  # fmt: skip
    then = board.chain(0.05, 0.55, [f"reshape\n{_shape(merged)}", f"out_proj\n{_shape(out)}"])
    board.arrow(first[-1], then[0])
    drawn = "" if (rows, heads, cols) == (T, h, d_h) else " · grid schematic"
    return board.done(f"b = {b} · T = {T} · h = {h} heads · d_h = {d_h} · d_out = {h * d_h}{drawn}")


def encoder_decoder(encoder: nn.RNNBase, inputs: Tensor) -> Figure:
    r"""The encoder-decoder without attention (only $h_n$ reaches the decoder) and with it.

    The decoder's $s_t$ read one vector $c = h_n$ (top), or each its own blend of every encoder
    state, $c_t = \sum_i \alpha_{t,i} h_i$ (bottom); `encoder` runs on `inputs` for the sizes.

    Args:
        encoder: a batch-first recurrent layer (an `nn.GRU`, a `Seq2Seq`'s `encoder`).
        inputs: its input, `(batch, n, input_size)`, at most 12 tokens; the decoder writes as
            many (as in copying).

    Raises:
        TypeError: `encoder` is not a recurrent layer, or `inputs` not a floating-point tensor.
        ValueError: `encoder` is not batch-first, or `inputs` does not fit it.

    Examples:
        >>> fig = encoder_decoder(nn.GRU(4, 8, batch_first=True), torch.zeros(1, 5, 4))
        >>> [t.get_text() for t in fig.axes[0].texts][-1]
        'h₁ … h₅: (1, 5, 8) · final state h₅: 8 numbers, whatever n is'
    """
    if not isinstance(encoder, nn.RNNBase):
        kind = type(encoder).__name__
        raise TypeError(f"encoder must be an nn.GRU, nn.LSTM or nn.RNN, got {kind}")
    if not encoder.batch_first:
        raise ValueError("encoder must be batch-first (nn.GRU(..., batch_first=True)), got "
                         "batch_first=False")  # fmt: skip
    check_tensor("inputs", inputs, ndim=3, floating=True)
    if not 1 <= inputs.shape[1] <= 12 or inputs.shape[-1] != encoder.input_size:
        raise ValueError(f"inputs must be (batch, n, {encoder.input_size}) with 1 <= n <= 12, "
                         f"got {_shape(inputs)}")  # fmt: skip
    with torch.no_grad():
        states, _ = encoder(inputs)  # (b, n, H)
    n, H = states.shape[1], states.shape[-1]  # the decoder writes n tokens too
    gap, left = min(0.58, 3.5 / n), 0.95  # n boxes and the row names: _WIDEST at most
    board = _Board(left + gap * n + 0.2, 4.9, "the encoder-decoder, without and with attention")
    for panel, y0 in ((0, 2.75), (1, 0.6)):
        heading = (f"without: all {n} tokens pass through one vector" if panel == 0
                   else f"with attention: each step reads all {n} states")  # fmt: skip
        board.text(0.05, y0 + 1.65, heading, ha="left", size=9.5, weight="bold")
        last = n - 1 if panel == 0 else -1  # the bottleneck, highlighted
        enc = [board.box(left + (i + 0.5) * gap, y0, f"h{_sub(i + 1)}", w=gap - 0.14, h=0.34,
                         fill=_NEW if i == last else _FILL) for i in range(n)]  # fmt: skip
        dec = [board.box(left + (t + 0.5) * gap, y0 + 1.2, f"s{_sub(t + 1)}", w=gap - 0.14,
                         h=0.34, fill="none") for t in range(n)]  # fmt: skip
        for row, name, y in ((enc, "encoder", y0), (dec, "decoder", y0 + 1.2)):
            board.text(0.05, y, name, ha="left")
            for a, z in itertools.pairwise(row):
                board.arrow(a, z, width=0.7)
        if panel == 0:  # one vector for every step: a bus from h_n under the decoder
            board.box(left + gap * n / 2, y0 + 0.62, f"c = h{_sub(n)}: {H} numbers, the same at "
                      "every step", w=gap * n - 0.14, h=0.28, fill=_NEW, size=9)  # fmt: skip
            board.arrow(enc[-1], (left + (n - 0.5) * gap, y0 + 0.48))
            for t in range(n):
                board.arrow((left + (t + 0.5) * gap, y0 + 0.76), dec[t], width=0.6)
        else:  # one step's context: a blend of every state
            t = (n - 1) // 2
            point = (left + (t + 0.5) * gap, y0 + 0.66)
            for h_i in enc:
                board.arrow(h_i, point, style="-", width=0.5)
            board.arrow(point, dec[t], f"c{_sub(t + 1)} = Σᵢ α{_sub(t + 1)},ᵢ hᵢ",
                        at=(0.08, -0.06), ha="left")  # fmt: skip
    return board.done(f"h₁ … h{_sub(n)}: {_shape(states)} · final state h{_sub(n)}: {H} numbers, "
                      "whatever n is")  # fmt: skip


def kv_cache(mha: MultiHeadAttention, prompt_tokens: int, decode_steps: int,
             max_tokens: int | None = None) -> Figure:  # fmt: skip
    """Prefill, then decode: what each call appends to the key/value cache, and what it reads.

    Runs `mha` on zeros (its RNG state restored) with a cache from its own `init_cache`.

    Args:
        mha: a causal [`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention].
        prompt_tokens: the prompt's length.
        decode_steps: one-token calls after it, at most 8.
        max_tokens: the cache's slots, at most 24; default `prompt_tokens + decode_steps`.

    Returns:
        The diagram: one row per call, the cache's slots filled so far.

    Raises:
        TypeError: `mha` is not a `MultiHeadAttention`, or a size not an int.
        ValueError: a size out of range, or `mha` not causal.

    Examples:
        >>> from attention import MultiHeadAttention
        >>> mha = MultiHeadAttention(8, 8, context_length=16, dropout=0.0, num_heads=2)
        >>> texts = [t.get_text() for t in kv_cache(mha, 3, 2).axes[0].texts]
        >>> "prefill" in texts, "(1, 3, 8)" in texts, "(1, 2, 1, 5)" in texts  # x, weights
        (True, True, True)
    """
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"mha must be a MultiHeadAttention, got {type(mha).__name__}")
    if not mha.causal:
        raise ValueError("mha needs causal=True: a generating layer's cache (with causal=False "
                         "a cache holds another sequence's keys, for cross-attention)")  # fmt: skip
    check_size("prompt_tokens", prompt_tokens)
    if check_size("decode_steps", decode_steps) > 8:
        raise ValueError(f"decode_steps must be at most 8 to draw, got {decode_steps}")
    total = prompt_tokens + decode_steps
    slots = total if max_tokens is None else check_size("max_tokens", max_tokens)
    if not total <= slots <= 24:
        raise ValueError(f"max_tokens must hold the {total} tokens and be at most 24 to draw, "
                         f"got {slots}")  # fmt: skip
    cache = mha.init_cache(1, slots)  # one sequence
    weight = mha.W_query.weight
    x = torch.zeros(1, total, mha.d_in, dtype=weight.dtype, device=weight.device)
    calls = []
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for start in [0, *range(prompt_tokens, total)]:
            chunk = x[:, start : start + (prompt_tokens if start == 0 else 1)]
            _, weights = mha(chunk, need_weights=True, cache=cache)
            calls.append((start, cache.length, _shape(chunk), _shape(weights)))
    # a table, one row per call: its name, its x, the cache's slots after it, its weights
    names = ["prefill", *(f"decode {n}" for n in range(1, len(calls)))]
    x_at = 0.2 + max(_span(name) for name in names)  # the x column's left edge
    left = x_at + 0.1 + max(_span(call[2]) for call in calls)  # the slots' left edge
    weights_w = max(_span(call[3]) for call in calls)
    cell = min(0.22, (_WIDEST - 0.15 - left - weights_w) / slots)
    top = 1.0 + 0.34 * len(calls)
    board = _Board(_WIDEST, top + 0.75, "the key/value cache: prefill, then decode")
    shape = f"(b, h_kv, max_tokens, d_h) = {_shape(cache.keys)}"
    board.text(0.05, top + 0.45, f"the cache: keys and values, each\n{shape}", ha="left")
    board.text(x_at, top + 0.08, "x", ha="left")
    board.text(left + slots * cell + 0.1, top + 0.08, "weights", ha="left")
    for j in range(0, slots, 1 if slots <= 12 else 4):  # the slots' positions
        board.text(left + (j + 0.5) * cell, top + 0.08, str(j))
    for row, (start, length, chunk_shape, weights_shape) in enumerate(calls):
        y = top - 0.06 - row * 0.34
        board.cells(left, y, 1, slots, lambda i, j, a=start, z=length: (
            _NEW if a <= j < z else _FILL if j < z else "none"), cell)  # fmt: skip
        board.text(0.05, y - cell / 2, names[row], ha="left")
        board.text(x_at, y - cell / 2, chunk_shape, ha="left")
        board.text(left + slots * cell + 0.1, y - cell / 2, weights_shape, ha="left")
    board.legend(0.1, 0.62, [(_NEW, "appended by this call"), (_FILL, "cached, read")], 2.0, 0)
    heads = f"h = {mha.num_heads} heads · h_kv = {mha.num_kv_heads} · d_h = {mha.head_dim}"
    return board.done(f"{heads}\neach query reads every cached row")


def _block_shapes(block: TransformerBlock, x: Tensor) -> dict[str, Tensor]:
    """Each tensor `block` computes from `x`, by name, as its forward computes it."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # dropout leaves no trace
        normed = block.norm1(x)
        att = block.att(normed)  # checks x: its length, its width
        mid = x + block.drop_shortcut(att)
        normed2 = block.norm2(mid)
        hidden = block.ff.layers[1](block.ff.layers[0](normed2))  # (b, T, 4 emb_dim), GELU'd
        ff = block.ff.layers[2](hidden)
        out = block(x)
    return {"norm1": normed, "att": att, "mid": mid, "norm2": normed2, "hidden": hidden,
            "ff": ff, "out": out}  # fmt: skip


def transformer_block(block: TransformerBlock, x: Tensor) -> Figure:
    r"""One GPT block: two branches, each normed, each added back into the residual stream.

    $x \to x + \text{att}(\text{norm1}(x)) \to h + \text{ff}(\text{norm2}(h))$: the stream (left)
    keeps its width `emb_dim` from input to output; the attention and the feed-forward branch
    (right) each read a normalised copy and add their result back. Runs `block` on `x` (its RNG
    state restored); every shape drawn is a shape it returned.

    Args:
        block: a [`TransformerBlock`][attention.model.gpt.TransformerBlock].
        x: its input, `(batch, num_tokens, emb_dim)`.

    Raises:
        TypeError: `block` is not a `TransformerBlock`, or `x` not a floating-point tensor.
        ValueError: `x` is not 3-D, not `emb_dim` wide, or longer than the context.

    Examples:
        >>> from attention.model.gpt import TransformerBlock
        >>> cfg = {"emb_dim": 64, "context_length": 8, "n_heads": 4, "drop_rate": 0.0,
        ...        "qkv_bias": False}
        >>> texts = [t.get_text() for t in transformer_block(TransformerBlock(cfg),
        ...                                                  torch.zeros(2, 8, 64)).axes[0].texts]
        >>> "att: MultiHeadAttention\n4 heads × d_h = 16" in texts, texts.count("(2, 8, 64)")
        (True, 7)
    """
    if not isinstance(block, TransformerBlock):
        raise TypeError(f"block must be a TransformerBlock, got {type(block).__name__}")
    check_tensor("x", x, ndim=3, floating=True)
    emb_dim = block.norm1.scale.shape[0]
    if x.shape[-1] != emb_dim:
        raise ValueError(f"x must be (batch, num_tokens, emb_dim={emb_dim}), got {_shape(x)}")
    t = _block_shapes(block, x)
    board = _Board(_WIDEST, 4.75, "a transformer block: two branches add into the stream")
    stream, branch = 1.25, 3.5
    source = board.box(stream, 0.62, f"input x\n{_shape(x)}", h=0.5)
    plus1, plus2 = board.plus(stream, 2.05), board.plus(stream, 3.55)
    output = board.box(stream, 4.2, f"output\n{_shape(t['out'])}", h=0.5)
    for a, b, shape, y in ((source, plus1, x, 1.6), (plus1, plus2, t["mid"], 3.1),
                           (plus2, output, t["out"], 3.82)):  # fmt: skip
        board.arrow(a, b, width=1.8)
        board.text(stream - 0.1, y, _shape(shape), ha="right")
    att, ff = block.att, block.ff.layers
    heads = f"{att.num_heads} heads × d_h = {att.head_dim}"
    if att.num_kv_heads != att.num_heads:
        heads += f", h_kv = {att.num_kv_heads}"
    rows = ((1.15, 2.05, "norm1", f"att: MultiHeadAttention\n{heads}", "att", plus1),
            (2.55, 3.55, "norm2", f"ff: Linear, GELU, Linear\n{ff[0].in_features} → "
             f"{ff[0].out_features} → {ff[2].out_features}\nhidden {_shape(t['hidden'])}", "ff",
             plus2))  # fmt: skip
    for y_norm, y_out, norm_name, label, name, plus in rows:
        norm = board.box(branch, y_norm, f"{norm_name}: LayerNorm", w=1.45, h=0.36, size=9)
        body = board.box(branch, y_out, label, w=2.2, h=0.5 if name == "att" else 0.68, size=9)
        board.arrow((stream, y_norm), norm)
        board.arrow(norm, body, _shape(t[norm_name]), at=(0.08, -0.04), ha="left")
        board.arrow(body, plus, _shape(t[name]), at=(-0.55, 0.13))
    board.text(0.2, 2.3, "the residual stream", rotation=90, style="italic")
    drop = block.drop_shortcut.p
    note = f"emb_dim = {emb_dim}" + (f"\ndropout {drop:g} on each branch" if drop else "")
    return board.done(f"b = {x.shape[0]} · T = {x.shape[1]} tokens · {note}")


def _pair_angles(x: Tensor, pair: int, num_positions: int, base: float) -> list[float]:
    """The angle of pair `pair` of vector `x` after `apply_rope` at positions 0, 1, ..."""
    head_dim = x.shape[-1]
    cos, sin = rope_angles(num_positions, head_dim, base, dtype=torch.float64)
    turned = apply_rope(x.expand(num_positions, head_dim), cos, sin)  # (positions, head_dim)
    return torch.atan2(turned[:, pair + head_dim // 2], turned[:, pair]).tolist()


_ROPE_TEXT = 10.5
"""The font size of `rope_rotation`'s labels. The figure is about a phone's width, so a phone
shows it at nearly its own size: labels of 13 px or more."""


def _rope_panel(board: _Board, centre: _Point, angles: list[float], heading: str) -> None:
    """One pair's plane: the vector at each position, its tip labelled with the position."""
    board.dial(centre, 0.55)
    board.text(centre[0], centre[1] + 1.05, heading, size=_ROPE_TEXT)
    spots: list[_Point] = []
    for m, angle in enumerate(angles):
        alpha = 0.35 + 0.65 * m / max(1, len(angles) - 1)
        board.ray(centre, angle, 0.55, (*_SEEN[:3], alpha))
        spots.append((centre[0] + 0.72 * math.cos(angle), centre[1] + 0.72 * math.sin(angle)))
    placed: list[_Point] = []  # the last and the first position labelled, then any other
    for m in (len(spots) - 1, *range(len(spots) - 1)):  # clear of every label placed
        if all(math.dist(spots[m], other) > 0.25 for other in placed):
            board.text(spots[m][0], spots[m][1], str(m), size=_ROPE_TEXT)
            placed.append(spots[m])


def rope_rotation(head_dim: int = 8, num_positions: int = 6, base: float = 10000.0,
                  slow_pair: int = 1) -> Figure:  # fmt: skip
    r"""RoPE as turning pairs: one vector at positions $0, 1, \dots$, and why only $m - n$ counts.

    Top left: pair 0 of a vector, placed at positions $0 \dots$ `num_positions - 1` by
    [`apply_rope`][attention.layer.positions.apply_rope], turns by $\theta_0 = 1$ radian per token;
    top right: pair `slow_pair`, by $\theta_i = \text{base}^{-2i/d_h}$ (from
    [`rope_frequencies`][attention.layer.positions.rope_frequencies]). Below: a query at $m$ and
    a key at $n$ in pair 0, for $(m, n) = (1, 0)$ and $(4, 3)$: both turned, the angle between them
    (and so their score) the same, since it depends on $m - n$ only. A phone's width
    (`attention_site.plot.PHONE`), so that a phone shows its labels at their size.

    Args:
        head_dim: $d_h$, even, at least 4.
        num_positions: how many positions to draw, 2 to 8.
        base: RoPE's base.
        slow_pair: which pair to show turning slowly, 1 to `head_dim / 2 - 1`.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size out of range, `head_dim` odd, or `base` not a finite number > 1.

    Examples:
        >>> texts = [t.get_text() for t in rope_rotation(8, 6, base=10000.0).axes[0].texts]
        >>> "pair 1, slow:\nθ₁ = 0.1 rad per token" in texts
        True
        >>> [t for t in texts if t.startswith("m = ")]  # the angle of q at m from k at n
        ['m = 1, n = 0: 1.50 rad', 'm = 4, n = 3: 1.50 rad']
    """
    if check_size("head_dim", head_dim, minimum=4) % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: head_dim must be even, got {head_dim}")
    if check_size("num_positions", num_positions, minimum=2) > 8:
        raise ValueError(f"num_positions must be at most 8 to draw, got {num_positions}")
    theta = rope_frequencies(head_dim, base).tolist()  # checks base
    if not 1 <= check_size("slow_pair", slow_pair) < head_dim // 2:
        raise ValueError(f"slow_pair must be 1 to {head_dim // 2 - 1} (head_dim={head_dim} has "
                         f"{head_dim // 2} pairs), got {slow_pair}")  # fmt: skip
    board = _Board(3.8, 4.45, "RoPE: each pair turns with the position")
    unit = torch.zeros(head_dim, dtype=torch.float64)
    unit[0] = unit[slow_pair] = 1.0  # pair i: dimensions (i, i + d_h / 2)
    for pair, x, speed in ((0, 0.9, "fast"), (slow_pair, 2.9, "slow")):
        heading = f"pair {pair}, {speed}:\nθ{_sub(pair)} = {theta[pair]:.3g} rad per token"
        _rope_panel(board, (x, 3.15), _pair_angles(unit, pair, num_positions, base), heading)
    _offset_panel(board, (0.9, 1.3), head_dim, base)
    return board.done(f"d_h = {head_dim}: {head_dim // 2} pairs, θᵢ = {base:g}^(−2i/{head_dim})\n"
                      "numbers: the positions", size=_ROPE_TEXT)  # fmt: skip


def _offset_panel(board: _Board, centre: _Point, head_dim: int, base: float) -> None:
    """Pair 0 of a query at m and a key at n, for two (m, n) one token apart: the same angle;
    the heading and the legend to the right of the plane."""
    from matplotlib.patches import Arc

    q, k = torch.zeros(head_dim, dtype=torch.float64), torch.zeros(head_dim, dtype=torch.float64)
    q[0], q[head_dim // 2], k[0] = math.cos(0.5), math.sin(0.5), 1.0  # q 0.5 rad ahead of k
    q_at, k_at = _pair_angles(q, 0, 5, base), _pair_angles(k, 0, 5, base)
    board.dial(centre, 0.55)
    right = centre[0] + 0.95
    board.text(right, centre[1] + 0.5, "pair 0, q at m, k at n:\nsame n − m, same angle",
               size=_ROPE_TEXT, ha="left")  # fmt: skip
    legend = []
    for (m, n), colour in (((1, 0), _HEADS[1]), ((4, 3), _HEADS[2])):
        for name, angle in ((f"q{_sub(m)}", q_at[m]), (f"k{_sub(n)}", k_at[n])):
            board.ray(centre, angle, 0.55, colour)
            board.text(centre[0] + 0.74 * math.cos(angle), centre[1] + 0.74 * math.sin(angle), name,
                       size=_ROPE_TEXT)  # fmt: skip
        between = (q_at[m] - k_at[n]) % math.tau
        start = math.degrees(k_at[n])
        board.ax.add_patch(Arc(centre, 0.5, 0.5, theta1=start, theta2=start + math.degrees(between),
                               color=colour, lw=1.4))  # fmt: skip
        legend.append((colour, f"m = {m}, n = {n}: {between:.2f} rad"))
    board.legend(right, centre[1] - 0.15, legend, dy=-0.32, size=_ROPE_TEXT)


def _gqa_row(board: _Board, top: float, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """One layout: the query heads, their key/value heads, a line from each to the one it reads."""
    width = num_heads * head_dim
    with torch.device("meta"):  # shapes only: no numbers, no random draws
        layer = MultiHeadAttention(width, width, context_length=1, dropout=0.0,
                                   num_heads=num_heads, num_kv_heads=num_kv_heads)  # fmt: skip
        cache = layer.init_cache(1, 1)  # one token: keys, values (1, h_kv, 1, d_h)
    per_token = cache.keys[0, :, 0].numel() + cache.values[0, :, 0].numel()
    group = num_heads // num_kv_heads  # query head i reads key/value head i // group
    reads = torch.arange(num_kv_heads).repeat_interleave(group).tolist()  # as the module does
    kind = "MHA" if group == 1 else "MQA" if num_kv_heads == 1 else f"GQA, groups of {group}"
    board.text(0.05, top, f"{kind}: h_kv = {num_kv_heads}", ha="left", weight="bold")
    board.text(_WIDEST - 0.05, top, f"cache per token: 2 × {num_kv_heads} × {head_dim} = "
               f"{per_token:,}", ha="right")  # fmt: skip
    step = (_WIDEST - 0.2) / num_heads
    colour = [(*_rgb(_HEADS[j % len(_HEADS)]), 0.5) for j in range(num_kv_heads)]
    queries = [board.box(0.15 + (i + 0.5) * step, top - 0.38, str(i), w=step - 0.06, h=0.28,
                         fill=colour[reads[i]], size=9) for i in range(num_heads)]  # fmt: skip
    kv_step = (_WIDEST - 0.2) / num_kv_heads
    values = [board.box(0.15 + (j + 0.5) * kv_step, top - 1.0, f"K, V {j}" if kv_step > 0.5
                        else str(j), w=min(kv_step - 0.06, 1.2), h=0.28, fill=colour[j],
                        size=9) for j in range(num_kv_heads)]  # fmt: skip
    for i, j in enumerate(reads):
        board.arrow(queries[i], values[j], style="-", width=0.7)


def _rgb(colour: str) -> tuple[float, float, float]:
    return (int(colour[1:3], 16) / 255, int(colour[3:5], 16) / 255, int(colour[5:7], 16) / 255)


def gqa_groups(num_heads: int = 8, num_kv_heads: int | Sequence[int] = (8, 2, 1),
               head_dim: int = 64) -> Figure:  # fmt: skip
    r"""Which key/value head each query head reads: MHA, GQA, MQA, and their caches per token.

    One row per `num_kv_heads`: the `num_heads` query heads (top, numbered), each joined to the
    key/value head it reads, $g(i) = \lfloor i \, h_{kv} / h \rfloor$, as the module's
    `repeat_interleave` assigns them. The cache per token (one layer, numbers) is read from a
    real cache's shapes: keys and values, $2 \times h_{kv} \times d_h$.

    Args:
        num_heads: $h$, 1 to 16.
        num_kv_heads: $h_{kv}$, a divisor of `num_heads`, or up to 3 of them (one row each).
        head_dim: $d_h$.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size out of range, or a `num_kv_heads` that does not divide `num_heads`.

    Examples:
        >>> texts = [t.get_text() for t in gqa_groups(8, (8, 2, 1), 64).axes[0].texts]
        >>> [t for t in texts if t.startswith("cache")][1:]  # GQA, MQA
        ['cache per token: 2 × 2 × 64 = 256', 'cache per token: 2 × 1 × 64 = 128']
        >>> "GQA, groups of 4: h_kv = 2" in texts
        True
    """
    if check_size("num_heads", num_heads) > 16:
        raise ValueError(f"num_heads must be at most 16 to draw, got {num_heads}")
    rows = [num_kv_heads] if isinstance(num_kv_heads, int) else list(num_kv_heads)
    if not 1 <= len(rows) <= 3:
        raise ValueError(f"num_kv_heads must be one to three sizes, got {num_kv_heads!r:.60}")
    for h_kv in rows:
        if num_heads % check_size("num_kv_heads", h_kv):
            raise ValueError(f"num_kv_heads must divide num_heads={num_heads}, got {h_kv}")
    check_size("head_dim", head_dim)
    height = max(2.3, 0.6 + 1.45 * len(rows))
    board = _Board(_WIDEST, height, "query heads and the key/value heads they read")
    for n, h_kv in enumerate(rows):
        _gqa_row(board, height - 0.55 - 1.45 * n, num_heads, h_kv, head_dim)
    return board.done(f"h = {num_heads} query heads · d_h = {head_dim}\ncache: numbers per token, "
                      "one layer")  # fmt: skip


def _ring(board: _Board, centre: _Point, held: list[int], sinks: int, tokens: int) -> None:
    """One cache after `tokens` tokens: its window slots around a ring, its sinks below."""
    from matplotlib.patches import Wedge

    ring = held[sinks:]
    span = 360 / len(ring)
    for j, position in enumerate(ring):  # slot sinks + j, clockwise from the top
        face = "none" if position < 0 else _NEW if position == tokens - 1 else _FILL
        start = 90 - (j + 1) * span
        board.ax.add_patch(Wedge(centre, 0.5, start, start + span, width=0.22, facecolor=face,
                                 edgecolor=_INK, lw=0.6))  # fmt: skip
        middle = math.radians(start + span / 2)
        board.text(centre[0] + 0.39 * math.cos(middle), centre[1] + 0.39 * math.sin(middle),
                   "" if position < 0 else str(position))  # fmt: skip
    board.text(centre[0], centre[1] + 0.72, f"after {tokens} tokens")
    board.text(*centre, "window")
    if sinks:
        board.text(centre[0], centre[1] - 1.0, "sinks")
    cell, left = 0.26, centre[0] - sinks * 0.13
    for j, position in enumerate(held[:sinks]):
        face = "none" if position < 0 else _NEW if position == tokens - 1 else _FILL
        board.cells(left + j * cell, centre[1] - 0.62, 1, 1, face, cell)
        board.text(left + (j + 0.5) * cell, centre[1] - 0.75, "" if position < 0 else
                   str(position))  # fmt: skip


def ring_buffer(window: int = 4, sinks: int = 2, tokens: Sequence[int] = (3, 6, 9, 13)) -> Figure:
    r"""A windowed layer's cache: a ring of `window` slots (and `sinks` kept slots), wrapping.

    Feeds zeros, one token at a time, to a
    [`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention] with this `window` and
    `sinks`, through the ring buffer its `init_cache` makes, and draws after each count in
    `tokens` the position each slot holds (`cache.positions`): the window's slots around the
    ring, clockwise from the top, the sinks below it. Position $p \geq k$ goes to slot
    $k + (p - k) \bmod w$, overwriting the oldest.

    Args:
        window: $w$, 2 to 12 slots in the ring.
        sinks: $k$, 0 to 4 slots kept for good.
        tokens: 1 to 4 token counts, increasing, each 1 to 99.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size out of range, or `tokens` not increasing.

    Examples:
        >>> texts = [t.get_text() for t in ring_buffer(4, 2, (6, 9)).axes[0].texts]
        >>> [t for t in texts if t.isdigit()]  # ring clockwise, then sinks; after 6, after 9
        ['2', '3', '4', '5', '0', '1', '6', '7', '8', '5', '0', '1']
    """
    if not 2 <= check_size("window", window) <= 12:
        raise ValueError(f"window must be 2 to 12 slots to draw, got {window}")
    if check_size("sinks", sinks, minimum=0) > 4:
        raise ValueError(f"sinks must be at most 4 to draw, got {sinks}")
    counts = [tokens] if isinstance(tokens, int) else list(tokens)
    if not 1 <= len(counts) <= 4 or any(not 1 <= check_size("tokens", t) <= 99 for t in counts):
        raise ValueError(f"tokens must be 1 to 4 counts, each 1 to 99, got {tokens!r:.60}")
    if counts != sorted(set(counts)):
        raise ValueError(f"tokens must be increasing, got {counts}")
    held = {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # its weights leave no trace
        layer = MultiHeadAttention(4, 4, context_length=2, dropout=0.0, num_heads=1,
                                   window=window, sinks=sinks).eval()  # fmt: skip
        cache = layer.init_cache(1)  # a ring buffer: window + sinks slots, any length
        for t in range(1, counts[-1] + 1):
            layer(torch.zeros(1, 1, 4), cache=cache)
            if t in counts:
                held[t] = cache.positions[0, : cache.slots].tolist()  # each slot's position
    title = f"a window's cache: {window + sinks} slots, {sinks} of them sinks"
    board = _Board(_WIDEST, 2.75, title)
    step = _WIDEST / len(counts)
    for n, t in enumerate(counts):
        _ring(board, (step * (n + 0.5), 1.65), held[t], sinks, t)
    legend = [(_NEW, "the newest token"), (_FILL, "kept; the next overwrites the oldest")]
    board.legend(0.15, 0.38, legend, 1.55, 0)
    return board.done(f"{cache.slots} slots (window {window} + sinks {sinks}) · numbers: "
                      "the positions held")  # fmt: skip


def _tile_panel(board: _Board, corner: _Point, mask: Mask, num_tokens: int, block: int,
                side: float) -> None:  # fmt: skip
    """One mask's tiles at `corner` (top left), `side` inches wide: each tile in its fate's
    colour and, in a tile the mask shows in part, its visible pairs in blue, row by row."""
    from matplotlib.patches import Rectangle

    pos = torch.arange(num_tokens)
    fates = tile_grid(mask, pos, pos, block_q=block, block_k=block).tolist()
    seen = mask.grid(pos, pos).tolist()  # (T, T) bool
    cell, (x, y) = side / num_tokens, corner
    faces = {SKIPPED: _FAINT_INK, FULL: _NEW}
    for ti, row in enumerate(fates):
        for tj, fate in enumerate(row):
            lo = tj * block
            board.ax.add_patch(Rectangle((x + lo * cell, y - (ti + 1) * block * cell),
                                         block * cell, block * cell,
                                         fc=faces.get(fate, _FILL), ec=_INK, lw=0.5))  # fmt: skip
            for i in range(ti * block, (ti + 1) * block) if fate != FULL else ():
                top = y - (i + 1) * cell  # query i's row
                for a, b in _runs(seen[i][lo : lo + block]):  # a run of visible keys
                    run = Rectangle((x + (lo + a) * cell, top), (b - a) * cell, cell, lw=0)
                    board.ax.add_patch(run).set_facecolor(_SEEN)


def _runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """`(start, stop)` of each run of True in `flags`."""
    runs, start = [], None
    for j, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = j
        elif not flag and start is not None:
            runs.append((start, j))
            start = None
    return runs


def tile_grids(masks: dict[str, Mask], num_tokens: int = 32, block: int = 4) -> Figure:
    r"""Which tiles a tiled pass computes: one panel per mask, tiles skipped by its bounds.

    Each panel is the $T \times T$ grid of (query, key) pairs cut into tiles of
    `block` x `block`, coloured by [`tile_grid`][attention.layer.tiled.tile_grid]'s fate:
    skipped (grey), computed with the mask (faint blue), computed without (orange); the pairs
    the mask shows are drawn over them in blue.

    Args:
        masks: one or two masks to draw, by title.
        num_tokens: $T$, 4 to 64, a multiple of `block`.
        block: tokens per tile side.

    Raises:
        ValueError: not one or two masks, or sizes out of range.

    Examples:
        >>> from attention.layer.masks import causal
        >>> fig = tile_grids({"causal": causal()}, num_tokens=8, block=4)
        >>> "3 of 4 tiles computed" in [t.get_text() for t in fig.axes[0].texts]
        True
    """
    if not 1 <= len(masks) <= 2:
        raise ValueError(f"masks must hold one or two masks to draw, got {len(masks)}")
    if not 4 <= check_size("num_tokens", num_tokens) <= 64 or num_tokens % check_size(
            "block", block):  # fmt: skip
        raise ValueError(f"num_tokens must be 4 to 64, a multiple of block={block}, "
                         f"got {num_tokens}")  # fmt: skip
    side, top = 1.55, 2.35
    board = _Board(3.9, 2.95, f"tiles of {block} x {block} over {num_tokens} tokens")
    pos = torch.arange(num_tokens)
    for n, (title, mask) in enumerate(masks.items()):
        x = 0.3 + n * (side + 0.45)
        fates = tile_grid(mask, pos, pos, block_q=block, block_k=block)
        computed = int((fates != SKIPPED).sum())
        board.text(x + side / 2, top + 0.32, title, size=9.5)
        board.text(x + side / 2, top + 0.12, f"{computed} of {fates.numel()} tiles computed",
                   size=8)  # fmt: skip
        _tile_panel(board, (x, top), mask, num_tokens, block, side)
    legend = [(_FAINT_INK, "skipped"), (_FILL, "masked"), (_NEW, "full: no mask")]  # tiles
    board.legend(0.2, 0.55, legend, dx=1.25, dy=0.0, size=8.5)
    return board.done("rows: queries · columns: keys · blue: pairs the mask shows")
