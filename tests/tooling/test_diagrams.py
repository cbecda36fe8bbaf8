"""The diagrams: every size they state comes from the objects passed in, and they fit a phone."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest
import torch
from torch import nn

pytest.importorskip("matplotlib")

from matplotlib.figure import Figure

from attention import MultiHeadAttention, SelfAttentionV1, SelfAttentionV2
from attention.derivation.core import causal_mask
from attention.lab.rnn import Seq2Seq
from attention.layer.masks import causal, chunk_mask, sinks, window
from attention.model.gpt import TransformerBlock
from attention_site import diagrams
from attention_site.plot import svg

SVG_NS = "{http://www.w3.org/2000/svg}"
PHONE_COLUMN_PX = 358  # a 390 px wide phone, less the page's side padding


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts]


def mha(
    d_in: int = 3, d_out: int = 12, num_heads: int = 3, length: int = 16, **kw: object
) -> MultiHeadAttention:
    return MultiHeadAttention(d_in, d_out, length, dropout=0.0, num_heads=num_heads, **kw)  # type: ignore[arg-type]


def block(emb_dim: int = 768, n_heads: int = 12, **cfg: object) -> TransformerBlock:
    return TransformerBlock(
        {"emb_dim": emb_dim, "context_length": 1024, "n_heads": n_heads, "drop_rate": 0.1,
         "qkv_bias": False, **cfg}
    )  # fmt: skip


def every_diagram() -> dict[str, Callable[[], Figure]]:
    """Each diagram on the pages' objects (the sizes the site draws), as a thunk."""
    from attention import EXAMPLE_TOKENS, example_inputs

    inputs = example_inputs()  # (6, 3)
    sa = SelfAttentionV2(3, 2)
    q, k, v = (sa.W_query(inputs).detach(), sa.W_key(inputs).detach(), sa.W_value(inputs).detach())
    gpt_layer = MultiHeadAttention(768, 768, context_length=1024, dropout=0.0, num_heads=12)
    return {
        "qkv": lambda: diagrams.qkv(inputs, sa.W_query, sa.W_key, sa.W_value),
        "attention_flow": lambda: diagrams.attention_flow(q, k, v),
        "mask_grid": lambda: diagrams.mask_grid(causal_mask(6), EXAMPLE_TOKENS),
        "split_heads": lambda: diagrams.split_heads(mha(), torch.stack((inputs, inputs))),
        "encoder_decoder": lambda: diagrams.encoder_decoder(
            nn.GRU(4, 8, batch_first=True), torch.randn(1, 6, 4)
        ),
        "kv_cache": lambda: diagrams.kv_cache(gpt_layer.eval(), 4, 5, 10),
        "kv_cache, 24 slots": lambda: diagrams.kv_cache(mha(8, 8, 2, 32, window=4), 16, 8),
        "transformer_block": lambda: diagrams.transformer_block(block(), torch.zeros(2, 4, 768)),
        "rope_rotation": lambda: diagrams.rope_rotation(),
        "gqa_groups": lambda: diagrams.gqa_groups(),
        "gqa_groups, 16 heads": lambda: diagrams.gqa_groups(16, 4, 128),
        "ring_buffer": lambda: diagrams.ring_buffer(),
        "ring_buffer, 12 slots": lambda: diagrams.ring_buffer(12, 0, (5, 30, 99)),
        "mask_grid, 16 keys": lambda: diagrams.mask_grid(causal_mask(16)),
        "encoder_decoder, 12 tokens": lambda: diagrams.encoder_decoder(
            nn.GRU(2, 32, batch_first=True), torch.randn(3, 12, 2)
        ),
        "tile_grids": lambda: diagrams.tile_grids(
            {"causal()": causal(), "window(8) | sinks(2)": causal() & (window(8) | sinks(2))}
        ),
    }


# --- the shapes stated are the shapes of the objects passed in -------------------------------


@pytest.mark.parametrize(("num_tokens", "d_in", "d_out"), [(6, 3, 2), (7, 5, 4), (2, 16, 24)])
def test_qkv_states_the_projections_shapes(num_tokens: int, d_in: int, d_out: int) -> None:
    x = torch.randn(num_tokens, d_in)
    sa = SelfAttentionV2(d_in, d_out)
    labels = texts(diagrams.qkv(x, sa.W_query, sa.W_key, sa.W_value))
    assert f"X\n({num_tokens}, {d_in})" in labels
    for sym, big in (("q", "Q"), ("k", "K"), ("v", "V")):
        assert f"W_{sym}\n({d_in}, {d_out})" in labels  # the math's (d_in, d_out), not .weight's
        assert f"{big}\n({num_tokens}, {d_out})" in labels
    assert f"T = {num_tokens} tokens · d_in = {d_in}" in labels[-1]


def test_qkv_takes_raw_matrices_of_different_widths_and_a_batch() -> None:
    sa = SelfAttentionV1(16, 24)  # W_query, W_key: (16, 24) Parameters
    W_value = torch.rand(16, 28)  # d_v = 28 != d_k
    labels = texts(diagrams.qkv(torch.randn(2, 6, 16), sa.W_query, sa.W_key, W_value))
    assert "X\n(2, 6, 16)" in labels and "W_v\n(16, 28)" in labels and "V\n(2, 6, 28)" in labels
    assert labels[-1] == "b = 2 · T = 6 tokens · d_in = 16 · d_q = 24 · d_k = 24 · d_v = 28"


def test_attention_flow_states_every_intermediate_shape() -> None:
    q, k, v = torch.randn(5, 3), torch.randn(7, 3), torch.randn(7, 4)  # 5 queries, 7 keys
    labels = texts(diagrams.attention_flow(q, k, v))
    assert {"Q\n(5, 3)", "K\n(7, 3)", "V\n(7, 4)", "ω = Q Kᵀ\n(5, 7)", "α\n(5, 7)"} <= set(labels)
    assert "Z = α V\n(5, 4)" in labels
    assert "÷ √d_k (d_k = 3)\nsoftmax per row" in labels
    masked = texts(diagrams.attention_flow(q, k, v, chunk_mask(2, 5)))
    assert "÷ √d_k (d_k = 3), + M\nsoftmax per row" in masked


@pytest.mark.parametrize("n", [1, 4, 9])
def test_causal_mask_draws_one_cell_per_entry(n: int) -> None:
    labels = texts(diagrams.mask_grid(causal_mask(n), [f"t{i}" for i in range(n)]))
    assert labels.count("−∞") == n * (n - 1) // 2  # the future, above the diagonal
    assert labels.count("0") == n * (n + 1) // 2
    for i in range(1, n + 1):
        assert str(i) in labels  # query i - 1 sees i keys
    assert labels.count("t0") == 2  # once as a query, once as a key
    assert labels[-1].startswith(f"mask ({n}, {n})")


def test_causal_mask_of_a_chunk_labels_the_newest_tokens_as_queries() -> None:
    mask = chunk_mask(3, 2)  # queries at positions 3 and 4 over keys 0..4: (2, 5)
    assert mask is not None
    labels = texts(diagrams.mask_grid(mask, list("abcde")))
    assert labels.count("d") == 2 and labels.count("a") == 1  # a is only a key
    assert labels.count("−∞") == 1 and labels.count("0") == 9
    assert {"4", "5"} <= set(labels)  # query d sees 4 keys, query e all 5


@pytest.mark.parametrize(
    ("d_out", "num_heads", "batch", "num_tokens"), [(12, 3, 2, 6), (16, 2, 1, 5), (64, 8, 3, 10)]
)
def test_split_heads_reads_the_module(
    d_out: int, num_heads: int, batch: int, num_tokens: int
) -> None:
    d_h = d_out // num_heads
    labels = texts(
        diagrams.split_heads(mha(3, d_out, num_heads), torch.randn(batch, num_tokens, 3))
    )
    assert f"Q = W_query(x)\n({batch}, {num_tokens}, {d_out})" in labels
    assert f".view(b, T, h, d_h)\n({batch}, {num_tokens}, {num_heads}, {d_h})" in labels
    assert f".transpose(1, 2)\n({batch}, {num_heads}, {num_tokens}, {d_h})" in labels
    assert f"out_proj\n({batch}, {num_tokens}, {d_out})" in labels
    assert f"reshape\n({batch}, {num_tokens}, {d_out})" in labels
    assert "head 1" in labels
    drawn_tokens = min(num_tokens, 6)
    assert [f"token {t}" in labels for t in range(7)] == [t < drawn_tokens for t in range(7)]
    assert "outlined: token 1's numbers" in labels  # followed through view and transpose
    schematic = num_tokens > 6 or num_heads > 4 or d_h > 4
    assert labels[-1].endswith(" · grid schematic") == schematic
    assert f"h = {num_heads} heads · d_h = {d_h}" in labels[-1]


def test_split_heads_joins_the_followed_token_to_its_row_in_every_head() -> None:
    fig = diagrams.split_heads(mha(3, 16, 4), torch.randn(1, 3, 3))  # 4 heads of 4, 3 tokens
    assert len(fig.axes[0].lines) == 4  # one line per head, from the view to the transpose
    one = diagrams.split_heads(mha(3, 4, 2), torch.randn(1, 1, 3))  # a single token: token 0
    assert "outlined: token 0's numbers" in texts(one)


def test_split_heads_with_grouped_keys_and_values() -> None:
    labels = texts(diagrams.split_heads(mha(3, 16, 4, num_kv_heads=2), torch.randn(1, 3, 3)))
    assert "α V per head\n(1, 4, 3, 4)" in labels  # every query head gets a context


@pytest.mark.parametrize(
    ("encoder", "inputs"),
    [
        (nn.GRU(4, 8, batch_first=True), torch.randn(1, 6, 4)),
        (nn.LSTM(3, 5, batch_first=True), torch.randn(2, 4, 3)),
    ],
)
def test_encoder_decoder_reads_the_encoder(encoder: nn.RNNBase, inputs: torch.Tensor) -> None:
    b, n, _ = inputs.shape
    H = encoder.hidden_size
    sub = "₀₁₂₃₄₅₆₇₈₉"[n]
    labels = texts(diagrams.encoder_decoder(encoder, inputs))
    assert f"c = h{sub}: {H} numbers, the same at every step" in labels
    assert labels.count(f"h{sub}") == 2 and f"h{'₀₁₂₃₄₅₆₇₈₉'[n + 1]}" not in labels
    assert (
        labels[-1]
        == f"h₁ … h{sub}: ({b}, {n}, {H}) · final state h{sub}: {H} numbers, whatever n is"
    )


def test_encoder_decoder_of_the_copy_task_model() -> None:
    model = Seq2Seq(vocab_size=20, hidden_size=32)
    src = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])  # 12 tokens
    labels = texts(diagrams.encoder_decoder(model.encoder, model.src_embed(src)))
    assert "c = h₁₂: 32 numbers, the same at every step" in labels
    assert "with attention: each step reads all 12 states" in labels


def test_kv_cache_states_each_calls_shapes() -> None:
    layer = mha(8, 16, 4, num_kv_heads=2)  # d_h = 4, 2 key/value heads
    labels = texts(diagrams.kv_cache(layer, 3, 2, max_tokens=7))
    assert "the cache: keys and values, each\n(b, h_kv, max_tokens, d_h) = (1, 2, 7, 4)" in labels
    rows = [labels[labels.index(name) : labels.index(name) + 3] for name in
            ("prefill", "decode 1", "decode 2")]  # fmt: skip
    assert rows == [["prefill", "(1, 3, 8)", "(1, 4, 3, 3)"],  # the call, its x, its weights
                    ["decode 1", "(1, 1, 8)", "(1, 4, 1, 4)"],
                    ["decode 2", "(1, 1, 8)", "(1, 4, 1, 5)"]]  # fmt: skip
    assert "decode 3" not in labels and labels.count("(1, 1, 8)") == 2
    assert [str(j) for j in range(7)] == [t for t in labels if t.isdigit()]  # one per slot
    assert labels[-1].startswith("h = 4 heads · h_kv = 2 · d_h = 4")


@pytest.mark.parametrize(("emb_dim", "n_heads", "n_kv_heads"), [(768, 12, None), (64, 8, 2)])
def test_transformer_block_states_every_shape(
    emb_dim: int, n_heads: int, n_kv_heads: int | None
) -> None:
    fig = diagrams.transformer_block(block(emb_dim, n_heads, n_kv_heads=n_kv_heads),
                                     torch.randn(3, 5, emb_dim))  # fmt: skip
    labels = texts(fig)
    stream = f"(3, 5, {emb_dim})"
    assert labels.count(stream) == 7  # 3 along the stream, 4 on the branches' arrows
    assert f"input x\n{stream}" in labels and f"output\n{stream}" in labels
    assert {"norm1: LayerNorm", "norm2: LayerNorm", "+", "the residual stream"} <= set(labels)
    assert labels.count("+") == 2  # each branch adds into the stream
    heads = f"{n_heads} heads × d_h = {emb_dim // n_heads}"
    heads += f", h_kv = {n_kv_heads}" if n_kv_heads else ""
    assert f"att: MultiHeadAttention\n{heads}" in labels
    wide = 4 * emb_dim
    assert (f"ff: Linear, GELU, Linear\n{emb_dim} → {wide} → {emb_dim}\nhidden (3, 5, {wide})"
            in labels)  # fmt: skip
    assert labels[-1] == f"b = 3 · T = 5 tokens · emb_dim = {emb_dim}\ndropout 0.1 on each branch"
    arrows = [p for p in fig.axes[0].patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == 9  # 3 along the stream, 3 per branch


def patches(fig: Figure, kind: str) -> int:
    return sum(type(p).__name__ == kind for p in fig.axes[0].patches)


@pytest.mark.parametrize(("head_dim", "num_positions", "base", "slow_pair"),
                         [(8, 6, 10000.0, 1), (16, 3, 100.0, 3)])  # fmt: skip
def test_rope_rotation_turns_each_pair_by_its_frequency(
    head_dim: int, num_positions: int, base: float, slow_pair: int
) -> None:
    fig = diagrams.rope_rotation(head_dim, num_positions, base, slow_pair)
    labels = texts(fig)
    slow = base ** (-2 * slow_pair / head_dim)
    assert "pair 0, fast:\nθ₀ = 1 rad per token" in labels
    assert (
        f"pair {slow_pair}, slow:\nθ{'₀₁₂₃₄₅₆₇₈₉'[slow_pair]} = {slow:.3g} rad per token" in labels
    )
    assert str(num_positions - 1) in labels and str(num_positions) not in labels
    assert labels.count("0") == 2  # position 0 in both pairs' planes
    assert {"q₁", "k₀", "q₄", "k₃"} <= set(labels)
    assert "m = 1, n = 0: 1.50 rad" in labels and "m = 4, n = 3: 1.50 rad" in labels
    assert patches(fig, "FancyArrowPatch") == 2 * num_positions + 4  # 4: two (q, k) couples
    assert patches(fig, "Arc") == 2 and patches(fig, "Circle") == 3


@pytest.mark.parametrize(("num_heads", "kv_heads"), [(8, (8, 2, 1)), (12, (4,)), (16, (16, 1))])
@pytest.mark.slow(seconds=1)
def test_gqa_groups_joins_each_query_head_to_its_key_value_head(
    num_heads: int, kv_heads: tuple[int, ...]
) -> None:
    fig = diagrams.gqa_groups(num_heads, kv_heads, 64)
    labels = texts(fig)
    for h_kv in kv_heads:
        assert f"cache per token: 2 × {h_kv} × 64 = {2 * h_kv * 64:,}" in labels
    bare = sum(4.5 / h_kv <= 0.5 for h_kv in kv_heads)  # rows whose K, V boxes are bare numbers
    assert labels.count(str(num_heads - 1)) == len(kv_heads) + bare  # the last query head
    assert patches(fig, "FancyArrowPatch") == num_heads * len(kv_heads)  # one line per head
    assert patches(fig, "FancyBboxPatch") == num_heads * len(kv_heads) + sum(kv_heads)
    kinds = {"MHA: h_kv = 8", "GQA, groups of 4: h_kv = 2", "MQA: h_kv = 1"}
    if kv_heads == (8, 2, 1):
        assert kinds <= set(labels) and "K, V 7" in labels and "K, V 8" not in labels


def test_ring_buffer_draws_the_positions_the_cache_holds() -> None:
    fig = diagrams.ring_buffer(4, 2, (3, 6, 9, 13))
    numbers = [t for t in texts(fig) if t.isdigit()]
    assert numbers == ["2", "0", "1", "2", "3", "4", "5", "0", "1",
                       "6", "7", "8", "5", "0", "1", "10", "11", "12", "9", "0", "1"]  # fmt: skip
    assert patches(fig, "Wedge") == 4 * 4  # window slots, per count
    assert patches(fig, "Rectangle") == 4 * 2 + 2  # the sinks, per count; the legend
    labels = texts(fig)
    assert labels.count("sinks") == 4 and "after 13 tokens" in labels
    assert labels[-1] == "6 slots (window 4 + sinks 2) · numbers: the positions held"
    no_sinks = texts(diagrams.ring_buffer(8, 0, 30))
    assert [t for t in no_sinks if t.isdigit()] == ["24", "25", "26", "27", "28", "29", "22", "23"]
    assert "sinks" not in no_sinks


def test_diagrams_that_run_a_module_leave_the_random_state_alone() -> None:
    layer = MultiHeadAttention(8, 8, context_length=16, dropout=0.5, num_heads=2).train()
    gpt_block = block(8, 2).train()
    before = torch.random.get_rng_state()
    diagrams.kv_cache(layer, 2, 1)
    diagrams.split_heads(layer, torch.randn(1, 4, 8))
    diagrams.transformer_block(gpt_block, torch.ones(1, 3, 8))
    diagrams.ring_buffer(3, 1, (2, 7))
    after_randn = torch.random.get_rng_state()
    torch.random.set_rng_state(before)
    torch.randn(1, 4, 8)  # the one draw the test itself made
    assert torch.equal(torch.random.get_rng_state(), after_randn)


# --- the figures as the page gets them ----------------------------------------------------------


@pytest.mark.parametrize(("name", "make"), list(every_diagram().items()), ids=list(every_diagram()))
@pytest.mark.slow(seconds=2)
def test_svg_is_valid_legible_and_fits_a_phone(name: str, make: Callable[[], Figure]) -> None:
    fig = make()
    title = fig.axes[0].get_title()
    out = svg(fig)
    root = ET.fromstring(out)  # well-formed XML
    assert root.tag == f"{SVG_NS}svg" and root.get("class") == "attention-figure"
    assert root.get("aria-label") == title
    assert "currentColor" in out and "#010203" not in out  # the page's text colour, both modes
    drawn = ["".join(t.itertext()) for t in root.iter(f"{SVG_NS}text")]
    assert title in drawn and len(drawn) > 5
    width, height = (float(v) for v in root.get("viewBox", "").split()[2:])
    assert 0.8 <= width / height <= 2.2, "wide, but not a strip"
    # At most 6 inches wide; on a phone the SVG scales down to the column (max-width: 100%).
    assert width <= 6 * 72
    scale = min(PHONE_COLUMN_PX, width * 4 / 3) / width  # CSS px per SVG unit
    sizes = [float(s) for s in re.findall(r"font-size: ([\d.]+)px", out)]
    assert min(sizes) * scale >= 9.0, f"smallest text {min(sizes) * scale:.1f} px on a phone"
    assert max(sizes) == 11  # the title, the plot module's size


# --- bad arguments are refused by name --------------------------------------------------------


def bad_calls() -> list[tuple[Callable[[], object], type[Exception], str]]:
    x = torch.randn(6, 3)
    sa = SelfAttentionV2(3, 2)
    layer = mha()
    gru = nn.GRU(4, 8, batch_first=True)
    return [
        (
            lambda: diagrams.qkv(x.long(), sa.W_query, sa.W_key, sa.W_value),
            TypeError,
            "x must be a floating-point",
        ),
        (
            lambda: diagrams.qkv(torch.randn(3), sa.W_query, sa.W_key, sa.W_value),
            ValueError,
            r"x must have 2 or 3 dimensions",
        ),
        (
            lambda: diagrams.qkv(torch.randn(6, 4), sa.W_query, sa.W_key, sa.W_value),
            ValueError,
            r"W_query must take d_in=4 inputs.*\(3, 2\)",
        ),
        (
            lambda: diagrams.qkv(x, sa.W_query, [[1.0]], sa.W_value),
            TypeError,
            "W_key must be a torch.Tensor, got list",
        ),
        (
            lambda: diagrams.qkv(x, sa.W_query, sa.W_key, torch.rand(5, 2)),
            ValueError,
            r"W_value must take d_in=3.*\(5, 2\)",
        ),
        (
            lambda: diagrams.attention_flow(x, "k", x),
            TypeError,
            "keys must be a torch.Tensor, got str",
        ),
        (lambda: diagrams.attention_flow(x, torch.randn(6, 4), x), ValueError, "d_k"),
        (
            lambda: diagrams.mask_grid(causal_mask(4).float()),
            TypeError,
            r"mask must be a bool tensor.*float32",
        ),
        (
            lambda: diagrams.mask_grid(causal_mask(17)),
            ValueError,
            r"num_keys <= 16, got \(17, 17\)",
        ),
        (
            lambda: diagrams.mask_grid(torch.zeros(3, 2, dtype=torch.bool)),
            ValueError,
            r"1 <= num_queries <= num_keys",
        ),
        (
            lambda: diagrams.mask_grid(causal_mask(3), ["a", "b"]),
            ValueError,
            r"tokens must be 3 labels.*\['a', 'b'\]",
        ),
        (
            lambda: diagrams.mask_grid(causal_mask(3), "abc"),
            ValueError,
            "tokens must be 3 labels",
        ),
        (
            lambda: diagrams.split_heads(sa, x),
            TypeError,
            "mha must be a MultiHeadAttention, got SelfAttentionV2",
        ),
        (lambda: diagrams.split_heads(layer, torch.randn(2, 6, 4)), ValueError, "d_in=3"),
        (
            lambda: diagrams.encoder_decoder(nn.GRUCell(4, 8), torch.randn(1, 6, 4)),
            TypeError,
            "encoder must be an nn.GRU.*got GRUCell",
        ),
        (
            lambda: diagrams.encoder_decoder(nn.GRU(4, 8), torch.randn(1, 6, 4)),
            ValueError,
            "encoder must be batch-first",
        ),
        (
            lambda: diagrams.encoder_decoder(gru, torch.randn(1, 13, 4)),
            ValueError,
            r"inputs must be \(batch, n, 4\) with 1 <= n <= 12, got \(1, 13, 4\)",
        ),
        (
            lambda: diagrams.encoder_decoder(gru, torch.randn(1, 6, 3)),
            ValueError,
            r"inputs must be \(batch, n, 4\)",
        ),
        (
            lambda: diagrams.encoder_decoder(gru, torch.randn(6, 4)),
            ValueError,
            "inputs must have 3 dimensions",
        ),
        (lambda: diagrams.kv_cache(sa, 3, 2), TypeError, "mha must be a MultiHeadAttention"),  # type: ignore[arg-type]
        (lambda: diagrams.kv_cache(layer, 0, 2), ValueError, "prompt_tokens must be >= 1, got 0"),
        (lambda: diagrams.kv_cache(layer, 3, 2.0), TypeError, "decode_steps must be an int"),  # type: ignore[arg-type]
        (lambda: diagrams.kv_cache(layer, 3, 9), ValueError, "decode_steps must be at most 8"),
        (
            lambda: diagrams.kv_cache(layer, 3, 2, 4),
            ValueError,
            "max_tokens must hold the 5 tokens.*got 4",
        ),
        (lambda: diagrams.kv_cache(layer, 3, 2, 25), ValueError, "at most 24 to draw, got 25"),
        (lambda: diagrams.kv_cache(mha(causal=False), 3, 2), ValueError, "needs causal=True"),
        (
            lambda: diagrams.kv_cache(mha(), 12, 8),
            ValueError,
            "max_tokens=20 is longer than context_length=16",
        ),
        (
            lambda: diagrams.transformer_block(layer, x),  # type: ignore[arg-type]
            TypeError,
            "block must be a TransformerBlock",
        ),
        (
            lambda: diagrams.transformer_block(block(8, 2), torch.zeros(1, 3, 8, dtype=torch.long)),
            TypeError,
            "x must be a floating-point",
        ),
        (
            lambda: diagrams.transformer_block(block(8, 2), torch.zeros(3, 8)),
            ValueError,
            "x must have 3 dimensions",
        ),
        (
            lambda: diagrams.transformer_block(block(8, 2), torch.zeros(1, 3, 6)),
            ValueError,
            r"x must be \(batch, num_tokens, emb_dim=8\), got \(1, 3, 6\)",
        ),
        (
            lambda: diagrams.transformer_block(block(8, 2), torch.zeros(1, 1025, 8)),
            ValueError,
            "longer than context_length=1024",
        ),
        (lambda: diagrams.rope_rotation(7), ValueError, "head_dim must be even, got 7"),
        (lambda: diagrams.rope_rotation(2), ValueError, "head_dim must be >= 4"),
        (lambda: diagrams.rope_rotation(8, 9), ValueError, "num_positions must be at most 8"),
        (lambda: diagrams.rope_rotation(8, 1), ValueError, "num_positions must be >= 2"),
        (lambda: diagrams.rope_rotation(8, 6, 1.0), ValueError, "rope_base must be a finite"),
        (lambda: diagrams.rope_rotation(8, 6, slow_pair=4), ValueError, "slow_pair must be 1 to 3"),
        (lambda: diagrams.rope_rotation(8, 6, slow_pair=0), ValueError, "slow_pair must be >= 1"),
        (lambda: diagrams.rope_rotation(8.0), TypeError, "head_dim must be an int"),  # type: ignore[arg-type]
        (lambda: diagrams.gqa_groups(17), ValueError, "num_heads must be at most 16"),
        (lambda: diagrams.gqa_groups(8, 3), ValueError, "num_kv_heads must divide num_heads=8"),
        (lambda: diagrams.gqa_groups(8, 0), ValueError, "num_kv_heads must be >= 1"),
        (lambda: diagrams.gqa_groups(8, (8, 4, 2, 1)), ValueError, "one to three sizes"),
        (lambda: diagrams.gqa_groups(8, 2, 0), ValueError, "head_dim must be >= 1"),
        (lambda: diagrams.ring_buffer(1), ValueError, "window must be 2 to 12"),
        (lambda: diagrams.ring_buffer(4, 5), ValueError, "sinks must be at most 4"),
        (lambda: diagrams.ring_buffer(4, -1), ValueError, "sinks must be >= 0"),
        (lambda: diagrams.ring_buffer(4, 2, (3, 100)), ValueError, "each 1 to 99"),
        (lambda: diagrams.ring_buffer(4, 2, ()), ValueError, "tokens must be 1 to 4 counts"),
        (lambda: diagrams.ring_buffer(4, 2, (6, 3)), ValueError, "tokens must be increasing"),
        (lambda: diagrams.ring_buffer(4, 2, (3.0,)), TypeError, "tokens must be an int"),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(("call", "error", "message"), bad_calls())
def test_bad_arguments_are_named(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call()


def test_tile_grids_counts_the_tiles_its_panels_draw() -> None:
    """The panel's count is tile_grid's, and the skipped tiles are drawn in grey."""
    fig = diagrams.tile_grids({"causal": causal(), "window": window(4)}, num_tokens=16, block=4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "10 of 16 tiles computed" in texts and "7 of 16 tiles computed" in texts
    with pytest.raises(ValueError, match="num_tokens must be 4 to 64, a multiple of block=4"):
        diagrams.tile_grids({"causal": causal()}, num_tokens=18, block=4)
    with pytest.raises(ValueError, match="one or two masks"):
        diagrams.tile_grids({})


def test_the_ring_chapters_figures_read_at_9_px_on_a_phone() -> None:
    """Chapter 19's two figures (drawn by attention_site.ring) keep every text at 9 px or more
    in a 390 px column, like the diagrams above (the site check measured 8.3 and 8.8 px)."""
    from attention_site.plot import phone_px
    from attention_site.ring import ring_figure, zigzag_figure

    assert phone_px(ring_figure()) >= 9 and phone_px(zigzag_figure()) >= 9
