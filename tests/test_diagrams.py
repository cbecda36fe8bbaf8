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

from attention import MultiHeadAttention, SelfAttentionV1, SelfAttentionV2, diagrams
from attention.core import causal_mask
from attention.plot import svg
from attention.rnn import Seq2Seq
from attention.visibility import chunk_mask

SVG_NS = "{http://www.w3.org/2000/svg}"
PHONE_COLUMN_PX = 358  # a 390 px wide phone, less the page's side padding


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.axes[0].texts]


def mha(
    d_in: int = 3, d_out: int = 12, num_heads: int = 3, length: int = 16, **kw: object
) -> MultiHeadAttention:
    return MultiHeadAttention(d_in, d_out, length, dropout=0.0, num_heads=num_heads, **kw)  # type: ignore[arg-type]


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
        "causal_mask": lambda: diagrams.causal_mask(causal_mask(6), EXAMPLE_TOKENS),
        "split_heads": lambda: diagrams.split_heads(mha(), torch.stack((inputs, inputs))),
        "encoder_decoder": lambda: diagrams.encoder_decoder(
            nn.GRU(4, 8, batch_first=True), torch.randn(1, 6, 4)
        ),
        "kv_cache": lambda: diagrams.kv_cache(gpt_layer.eval(), 4, 5, 10),
        "kv_cache, 24 slots": lambda: diagrams.kv_cache(mha(8, 8, 2, 32, window=4), 16, 8),
        "causal_mask, 16 keys": lambda: diagrams.causal_mask(causal_mask(16)),
        "encoder_decoder, 12 tokens": lambda: diagrams.encoder_decoder(
            nn.GRU(2, 32, batch_first=True), torch.randn(3, 12, 2)
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
    labels = texts(diagrams.causal_mask(causal_mask(n), [f"t{i}" for i in range(n)]))
    assert labels.count("−∞") == n * (n - 1) // 2  # the future, above the diagonal
    assert labels.count("0") == n * (n + 1) // 2
    for i in range(1, n + 1):
        assert str(i) in labels  # query i - 1 sees i keys
    assert labels.count("t0") == 2  # once as a query, once as a key
    assert labels[-1].startswith(f"mask ({n}, {n})")


def test_causal_mask_of_a_chunk_labels_the_newest_tokens_as_queries() -> None:
    mask = chunk_mask(3, 2)  # queries at positions 3 and 4 over keys 0..4: (2, 5)
    assert mask is not None
    labels = texts(diagrams.causal_mask(mask, list("abcde")))
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
    schematic = num_tokens > 6 or num_heads > 4 or d_h > 4
    assert labels[-1].endswith(" · grid schematic") == schematic
    assert f"h = {num_heads} heads · d_h = {d_h}" in labels[-1]


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
    assert "the cache: keys and values, each (b, h_kv, max_tokens, d_h) = (1, 2, 7, 4)" in labels
    assert "prefill  x (1, 3, 8)" in labels and "weights (1, 4, 3, 3)" in labels
    assert "decode 1  x (1, 1, 8)" in labels and "weights (1, 4, 1, 4)" in labels
    assert "decode 2  x (1, 1, 8)" in labels and "weights (1, 4, 1, 5)" in labels
    assert "decode 3  x (1, 1, 8)" not in labels
    assert [str(j) for j in range(7)] == [t for t in labels if t.isdigit()]  # one per slot
    assert labels[-1].startswith("h = 4 heads · h_kv = 2 · d_h = 4")


def test_diagrams_that_run_a_module_leave_the_random_state_alone() -> None:
    layer = MultiHeadAttention(8, 8, context_length=16, dropout=0.5, num_heads=2).train()
    before = torch.random.get_rng_state()
    diagrams.kv_cache(layer, 2, 1)
    diagrams.split_heads(layer, torch.randn(1, 4, 8))
    after_randn = torch.random.get_rng_state()
    torch.random.set_rng_state(before)
    torch.randn(1, 4, 8)  # the one draw the test itself made
    assert torch.equal(torch.random.get_rng_state(), after_randn)


# --- the figures as the page gets them ----------------------------------------------------------


@pytest.mark.parametrize(("name", "make"), list(every_diagram().items()), ids=list(every_diagram()))
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
    assert min(sizes) * scale >= 7.0, f"smallest text {min(sizes) * scale:.1f} px on a phone"
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
            lambda: diagrams.causal_mask(causal_mask(4).float()),
            TypeError,
            r"mask must be a bool tensor.*float32",
        ),
        (
            lambda: diagrams.causal_mask(causal_mask(17)),
            ValueError,
            r"num_keys <= 16, got \(17, 17\)",
        ),
        (
            lambda: diagrams.causal_mask(torch.zeros(3, 2, dtype=torch.bool)),
            ValueError,
            r"1 <= num_queries <= num_keys",
        ),
        (
            lambda: diagrams.causal_mask(causal_mask(3), ["a", "b"]),
            ValueError,
            r"tokens must be 3 labels.*\['a', 'b'\]",
        ),
        (
            lambda: diagrams.causal_mask(causal_mask(3), "abc"),
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
    ]


@pytest.mark.parametrize(("call", "error", "message"), bad_calls())
def test_bad_arguments_are_named(
    call: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call()
