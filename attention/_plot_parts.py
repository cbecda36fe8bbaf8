"""The parts of [`attention.plot`][attention.plot] that check and lay out its input.

Private: the figures' argument checks (every message names the argument, what was expected
and what arrived) and the matrix cell that carries a hover tooltip.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is optional: imported lazily, inside the functions
    from matplotlib.axes import Axes

_cell_ids = itertools.count()  # unique cell ids across one process (one docs build)


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
