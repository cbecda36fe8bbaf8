"""The plotting helper: labels, tooltips, dark-mode colours, unique ids, lazy matplotlib."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest
import torch

pytest.importorskip("matplotlib")

from attention.derivation.simple import EXAMPLE_TOKENS, example_inputs
from attention_site.plot import bars, heatmap, lines, phone_px, svg

SVG_NS = "{http://www.w3.org/2000/svg}"


def example_weights() -> torch.Tensor:
    inputs = example_inputs()  # (6, 3)
    return torch.softmax(inputs @ inputs.T, dim=-1)  # (6, 6)


def texts(out: str) -> list[str]:
    root = ET.fromstring(out)
    return ["".join(t.itertext()) for t in root.iter(f"{SVG_NS}text")]


@pytest.mark.slow(seconds=3)
def test_import_attention_does_not_import_matplotlib() -> None:
    code = "import sys, attention, attention_site.plot; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_heatmap_labels_both_axes_with_tokens() -> None:
    out = svg(heatmap(example_weights(), EXAMPLE_TOKENS, title="weights"))
    labels = texts(out)
    assert "queries" in labels and "keys" in labels and "weights" in labels
    for token in EXAMPLE_TOKENS:
        assert labels.count(token) == 2  # once as a query (row), once as a key (column)


def test_heatmap_cells_show_values_and_tooltips() -> None:
    weights = example_weights()
    out = svg(heatmap(weights, EXAMPLE_TOKENS))
    titles = re.findall(r"<title>(.*?)</title>", out)
    assert len(titles) == 36  # one per cell
    assert titles[0] == f"Your -&gt; Your: {weights[0, 0].item():.4f}"
    assert titles[1 * 6 + 2] == f"journey -&gt; starts: {weights[1, 2].item():.4f}"
    assert f"{weights[1, 2].item():.2f}" in texts(out)  # the value printed in the cell


def test_heatmap_key_labels_differ_from_query_labels() -> None:
    out = svg(heatmap(torch.full((2, 3), 1 / 3), ["q1", "q2"], ["k1", "k2", "k3"]))
    titles = re.findall(r"<title>(.*?)</title>", out)
    assert titles == [f"q{i} -&gt; k{j}: 0.3333" for i in (1, 2) for j in (1, 2, 3)]


def test_heatmap_masked_scores_are_labelled_not_coloured() -> None:
    scores = torch.tensor([[0.5, float("-inf")], [0.1, 0.9]])
    out = svg(heatmap(scores, ["a", "b"]))
    assert "-inf" in texts(out)
    assert "a -&gt; b: -inf" in out


def test_svg_is_legible_in_light_and_dark_mode() -> None:
    out = svg(heatmap(example_weights(), EXAMPLE_TOKENS))
    root = ET.fromstring(out)  # well-formed XML, no prolog
    assert root.tag == f"{SVG_NS}svg" and root.get("class") == "attention-figure"
    assert "currentColor" in out  # text and axes follow the page's text colour
    assert "#010203" not in out  # the stand-in ink colour was replaced everywhere
    assert "<style" not in out  # no page-wide CSS rule leaks out of the figure
    assert "<text" in out  # text stays text (searchable, in the page's font)


def test_two_figures_on_one_page_have_disjoint_ids() -> None:
    first = svg(heatmap(example_weights(), EXAMPLE_TOKENS))
    second = svg(heatmap(example_weights(), EXAMPLE_TOKENS))
    ids_first = set(re.findall(r'id="([^"]+)"', first))
    ids_second = set(re.findall(r'id="([^"]+)"', second))
    assert ids_first and not ids_first & ids_second
    for ref in re.findall(r"url\(#([^)]+)\)", first):
        assert ref in ids_first  # every reference points inside its own figure


def test_heatmap_into_given_axes_one_panel_per_head() -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4))
    left, right = fig.subplots(1, 2)
    heatmap(torch.eye(2), ["a", "b"], title="head 0", ax=left)
    assert heatmap(torch.eye(2), ["a", "b"], title="head 1", ax=right) is fig
    out = svg(fig)
    assert len(re.findall(r"<title>", out)) == 8
    assert {"head 0", "head 1"} <= set(texts(out))


@pytest.mark.parametrize(
    ("weights", "query_labels", "key_labels", "message"),
    [
        (torch.eye(3), ["a", "b"], None, "expected 3 query_labels"),
        (torch.ones(2, 3), ["a", "b"], ["x"], "expected 3 key_labels"),
        (torch.ones(3), ["a"], None, r"of shape \(num_queries, num_keys\), got .* \(3,\)"),
        (torch.ones(2, 2, 2), ["a", "b"], None, r"select one matrix, e.g. attn_weights\[0, head\]"),
        ([[1.0], [2.0, 3.0]], ["a", "b"], None, "expected a non-empty 2-D matrix"),
        (torch.rand(200, 200), ["t"] * 200, None, r"\(200, 200\) is too many to read"),
    ],
)
def test_heatmap_rejects_mismatched_labels(
    weights: torch.Tensor, query_labels: list[str], key_labels: list[str] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        heatmap(weights, query_labels, key_labels)


def test_lines_draws_each_series_with_legend() -> None:
    fig = lines([1, 2, 4], {"explicit": [1.0, 2.0, 4.0], "fused": [0.5, 0.9, 1.6]},
                xlabel="num_tokens", ylabel="ms", title="time", logx=True)  # fmt: skip
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["explicit", "fused"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    out = svg(fig)
    assert {"num_tokens", "ms", "time", "explicit", "fused"} <= set(texts(out))
    with pytest.raises(ValueError, match="expected 3 values in series 'fused', got 2"):
        lines([1, 2, 4], {"fused": [1.0, 2.0]}, xlabel="x", ylabel="y")


def test_bars_label_each_bar_with_its_value() -> None:
    fig = bars(["Your", "journey"], [0.1385, 0.2379], ylabel="attention weight")
    assert [p.get_height() for p in fig.axes[0].patches] == pytest.approx([0.1385, 0.2379])
    labels = texts(svg(fig))
    assert {"Your", "journey", "0.14", "0.24", "attention weight"} <= set(labels)
    with pytest.raises(ValueError, match="expected 2 values"):
        bars(["a", "b"], [1.0], ylabel="y")


def test_bars_draw_repeated_labels_as_separate_bars() -> None:
    """Categorical x values would stack "the" twice on one spot."""
    fig = bars(["the", "cat", "the"], [0.5, 0.2, 0.3], ylabel="weight")
    ax = fig.axes[0]
    xs = [patch.get_x() for patch in ax.patches]
    assert len(xs) == len(set(xs)) == 3
    assert [t.get_text() for t in ax.get_xticklabels()] == ["the", "cat", "the"]
    assert [round(p.get_height(), 2) for p in ax.patches] == [0.5, 0.2, 0.3]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: heatmap(torch.eye(2), None), TypeError, "query_labels must be a sequence"),
        (lambda: lines([1, 2], [[1.0, 2.0]], xlabel="x", ylabel="y"), TypeError,
         "series must map names to y values, got list"),
        (lambda: bars(["a"], ["high"], ylabel="y"), TypeError,
         "values must be a sequence of real numbers"),
        (lambda: svg(None), TypeError, "fig must be a matplotlib Figure"),
    ],
)  # fmt: skip
def test_plot_helpers_name_what_they_were_given(
    call: Callable[[], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()


def _face_colours(fig: object) -> list[tuple[float, ...]]:
    """The face colour of every filled cell of a matrix figure, in drawing order."""
    ax = fig.axes[0]  # type: ignore[attr-defined]
    return [tuple(p.get_facecolor()) for p in ax.patches if p.get_fill()]


def test_heatmaps_with_one_scale_colour_one_value_alike() -> None:
    low, high = torch.tensor([[0.5, 0.1]]), torch.tensor([[0.5, 0.9]])
    own = [_face_colours(heatmap(w, ["q"], ["a", "b"]))[0] for w in (low, high)]
    assert own[0] != own[1]  # each scaled to its own range: 0.5 is the top of one, not the other
    shared = [_face_colours(heatmap(w, ["q"], ["a", "b"], vmin=0, vmax=1))[0] for w in (low, high)]
    assert shared[0] == shared[1]  # one scale: the same weight, the same colour
    colorbar = heatmap(low, ["q"], ["a", "b"], vmin=0, vmax=1).axes[1]
    assert tuple(float(v) for v in colorbar.get_ylim()) == (0.0, 1.0)


def test_heatmap_marks_cells_apart_from_masked_ones() -> None:
    weights = torch.tensor([[1.0, float("-inf")], [0.0, 0.5]])
    marked = torch.tensor([[False, False], [True, False]])
    fig = heatmap(weights, ["a", "b"], marked=marked, marked_label="dropped")
    ax = fig.axes[0]
    crossed = [p for p in ax.patches if not p.get_fill()]
    assert [p.get_hatch() for p in crossed] == ["x"]  # one mark, not the masked cell's "//"
    assert crossed[0].get_xy() == (-0.5, 0.5)  # row 1, column 0
    assert "//" in [p.get_hatch() for p in ax.patches if p.get_fill()]  # -inf stays hatched
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["dropped"]
    assert "b -&gt; a: 0.0000 (dropped)" in svg(fig)
    with pytest.raises(ValueError, match=r"marked must have the shape of weights \(2, 2\)"):
        heatmap(weights, ["a", "b"], marked=torch.ones(2, 3, dtype=torch.bool))


@pytest.mark.slow(seconds=2)
def test_a_large_heatmap_is_one_image_masked_cells_grey_and_small() -> None:
    scores = torch.rand(32, 32).masked_fill(torch.ones(32, 32).triu(1).bool(), float("-inf"))
    positions = [str(t) for t in range(32)]
    fig = heatmap(scores, positions, vmin=0, vmax=1)
    ax = fig.axes[0]
    assert not ax.patches and len(ax.images) == 1  # no 1,024 cells: one image
    drawn = ax.images[0].get_array()
    assert drawn.mask[0, 1] and not drawn.mask[1, 0]  # -inf above the diagonal: masked
    assert [t.get_text() for t in ax.get_yticklabels()] == positions[::4]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("keys", "queries")
    assert fig.get_size_inches()[0] < 4  # a phone's width
    assert len(svg(fig)) < 60_000  # one embedded image, not a path per cell
    assert len(heatmap(torch.eye(24), positions[:24]).axes[0].patches) == 24 * 24  # cells
    assert not heatmap(torch.eye(4), positions[:4], image=True).axes[0].patches
    with pytest.raises(ValueError, match="marked cells need one cell per weight"):
        heatmap(scores, positions, marked=scores > 0.5)


def test_mask_draws_two_looks_and_a_legend_without_a_colour_scale() -> None:
    from attention import causal_mask
    from attention_site.plot import mask

    fig = mask(causal_mask(4), ["a", "b", "c", "d"], title="m")
    assert len(fig.axes) == 1  # no colour bar
    ax = fig.axes[0]
    colours = _face_colours(fig)
    assert len(colours) == 16 and len(set(colours)) == 2
    hidden = [p for p in ax.patches if p.get_hatch() == "//"]
    assert len(hidden) == 6  # the strict upper triangle of 4 x 4
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["hidden", "visible"]
    out = svg(fig)
    assert "a -&gt; b: hidden" in out and "b -&gt; a: visible" in out
    assert {"queries", "keys", "m"} <= set(texts(out))


def test_mask_names_its_axes_and_thins_long_labels() -> None:
    from attention_site.plot import mask

    reach = torch.zeros(4, 24, dtype=torch.bool)
    reach[:, :10] = True
    fig = mask(reach, [f"{n} layers" for n in range(4)], [str(j) for j in range(24)],
               legend=("cannot reach", "reaches"), xlabel="input token", ylabel="depth")  # fmt: skip
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("input token", "depth")
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{n} layers" for n in range(4)]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(j) for j in range(0, 24, 2)]
    with pytest.raises(ValueError, match="seen must be a bool matrix"):
        mask(torch.full((2, 2), 0.5), ["a", "b"])


def test_lines_keep_given_styles_and_can_put_the_legend_below() -> None:
    styles = {"fused": {"color": "C3", "marker": "s", "linestyle": "--"}}
    fig = lines([1, 2], {"explicit": [1.0, 2.0], "fused": [0.5, 0.9]}, xlabel="x", ylabel="y",
                styles=styles, legend="below")  # fmt: skip
    explicit, fused = fig.axes[0].lines
    assert (fused.get_marker(), fused.get_linestyle()) == ("s", "--")
    assert fused.get_color() == "C3" and explicit.get_marker() == "o"  # the default look
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1  # under the axes


def test_lines_can_count_on_x_and_start_y_at_zero() -> None:
    fig = lines([0, 1, 2, 3], {"norm": [2.0, 2.5, 3.0, 3.5]}, xlabel="block", ylabel="norm",
                integer_x=True, ymin=0)  # fmt: skip
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert ax.get_ylim()[0] == 0
    plain = lines([0, 1, 2, 3], {"norm": [2.0, 2.5, 3.0, 3.5]}, xlabel="b", ylabel="n")
    assert plain.axes[0].get_ylim()[0] > 1  # by default, just below the lowest value
    assert any(not float(t).is_integer() for t in plain.axes[0].get_xticks())
    with pytest.raises(ValueError, match="ymin must be a finite number, got nan"):
        lines([0, 1], {"a": [1.0, 2.0]}, xlabel="x", ylabel="y", ymin=float("nan"))


def test_bars_write_whole_numbers_whole() -> None:
    labels = texts(svg(bars(["GPT-2", "Llama"], [36.0, 512.0], ylabel="KiB")))
    assert {"36", "512"} <= set(labels) and "512.00" not in labels


@pytest.mark.slow(seconds=2)
def test_heatmap_values_are_sized_to_the_cell_and_marked_where_a_phone_shrinks_them() -> None:
    """Cells of 0.62 inch carry 12 pt values, shown on a phone; a 16 x 16 figure is wider than
    a phone shows unscaled, so its values are grouped as `attn-value-small` (hidden there by
    the page's CSS); in a caller's axes the values keep 9 pt."""
    out = svg(heatmap(example_weights(), EXAMPLE_TOKENS))
    assert len(re.findall(r'<g id="f\d+-attn-value-\d+">', out)) == 36
    assert "attn-value-small" not in out and "font-size: 12px" in out
    big = svg(heatmap(torch.eye(16), [str(i) for i in range(16)]))
    assert len(re.findall(r'<g id="f\d+-attn-value-small-\d+">', big)) == 256
    from matplotlib.figure import Figure

    fig = Figure()
    heatmap(example_weights(), EXAMPLE_TOKENS, ax=fig.add_subplot())
    assert {t.get_fontsize() for t in fig.axes[0].texts} == {9.0}


def test_a_heatmap_image_writes_many_column_labels_upright() -> None:
    """Slanted, the labels of 12 columns a phone's width apart would run into each other."""
    labels = [f"h{i} x" for i in range(12)]
    fig = heatmap(torch.eye(12), labels, image=True)
    assert {t.get_rotation() for t in fig.axes[0].get_xticklabels()} == {90.0}
    few = heatmap(torch.eye(6), labels[:6], image=True)
    assert {t.get_rotation() for t in few.axes[0].get_xticklabels()} == {45.0}


def test_a_line_chart_reads_on_a_phone_with_its_legend_under_it() -> None:
    """Scaled to a 390 px phone's column, no text of a line chart (long names, a title) is
    under 9 px; the legend sits under the axes, off the data, by default."""
    names = ["plain: final state h_n only", "Bahdanau attention", "chance: a uniform guess"]
    fig = lines(list(range(1, 13)), {name: [0.5] * 12 for name in names},
                xlabel="input length n (tokens)", ylabel="token accuracy (greedy)",
                title="Copying a random sequence: accuracy by length")  # fmt: skip
    assert phone_px(fig) >= 9.0
    assert fig.legends and fig.axes[0].get_legend() is None  # the figure's, below the axes
    assert phone_px(fig, width_px=10_000) == pytest.approx(10 * 4 / 3)  # never scaled up
