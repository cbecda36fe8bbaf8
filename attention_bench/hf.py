"""The Hugging Face contender: `transformers`' GPT-2 holding the book's GPT weights.

[`to_hf_gpt2`][attention_bench.hf.to_hf_gpt2] copies a plain GPT-2 `GPTModel` (learned
positions, every head its own keys and values, no window) into a `GPT2LMHeadModel` that
computes the same logits, so the generation benchmark times both libraries on the same
weights. `transformers` is the `bench` extra (`pip install -e '.[bench]'`); this module
imports it only when called.

Two differences of layout, not of arithmetic: Hugging Face's GPT-2 keeps its projections in
`Conv1D` modules, whose weight is stored `(in, out)` (an `nn.Linear`'s is `(out, in)`), and
it fuses the query, key and value projections into one, `c_attn`. Its attention runs through
`torch.nn.functional.scaled_dot_product_attention` (`attn_implementation="sdpa"`), the kernel
the production module calls.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from attention.gpt import GPTModel, LayerNorm
from attention.multihead import MultiHeadAttention

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel

__all__ = [
    "ATTN_IMPLEMENTATION",
    "available",
    "decode_step",
    "embedding_bytes",
    "hf_generate",
    "prefill",
    "to_hf_gpt2",
    "unsupported",
    "version",
]

ATTN_IMPLEMENTATION = "sdpa"
"""Hugging Face's attention backend in the benchmark: PyTorch's fused kernel, as ours."""


def available() -> bool:
    """Whether `transformers` is installed (the `bench` extra)."""
    return importlib.util.find_spec("transformers") is not None


def version() -> str:
    """The installed `transformers` version."""
    import transformers

    return str(transformers.__version__)


def unsupported(model: GPTModel) -> list[str]:
    """What of `model` Hugging Face's GPT-2 cannot hold: empty for the plain GPT-2.

    Examples:
        >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
        >>> unsupported(GPTModel(cfg))
        []
        >>> unsupported(GPTModel({**cfg, "n_kv_heads": 2, "rope_base": 10000.0}))
        ['rotary positions (rope_base)', 'grouped-query attention (n_kv_heads)']
    """
    reasons = []
    if model.pos_emb is None:
        reasons.append("rotary positions (rope_base)")
    atts: list[MultiHeadAttention] = [block.att for block in model.trf_blocks]  # type: ignore[misc]
    if any(att.num_kv_heads != att.num_heads for att in atts):
        reasons.append("grouped-query attention (n_kv_heads)")
    if any(att.window is not None for att in atts):
        reasons.append("a sliding window (window)")
    return reasons


def _copy_norm(norm: LayerNorm, hf_norm: nn.LayerNorm) -> None:
    hf_norm.weight.copy_(norm.scale)
    hf_norm.bias.copy_(norm.shift)


def _copy_linear(conv: Any, *linears: nn.Linear) -> None:
    """`nn.Linear`s (weights `(out, in)`), stacked along `out`, into one `Conv1D` (`(in, out)`)."""
    conv.weight.copy_(torch.cat([linear.weight for linear in linears]).t())
    biases = [linear.bias for linear in linears]
    if any(bias is None for bias in biases):
        conv.bias.zero_()
    else:
        conv.bias.copy_(torch.cat(biases))  # type: ignore[arg-type]  # none is None here


def to_hf_gpt2(model: GPTModel) -> GPT2LMHeadModel:
    """A `transformers.GPT2LMHeadModel` with `model`'s weights: the same logits, its own code.

    Token and position embeddings to `wte` and `wpe`; per block `norm1`/`norm2` to
    `ln_1`/`ln_2` (`scale` to `weight`, `shift` to `bias`), `W_query`, `W_key`, `W_value`
    concatenated into `c_attn` (zero bias without `qkv_bias`), `out_proj` to `attn.c_proj`,
    the feed-forward's two layers to `mlp.c_fc` and `mlp.c_proj`; `final_norm` to `ln_f`, and
    `out_head` to an untied `lm_head` (the book's model does not tie it to the embedding).
    Every `Conv1D` weight is the transpose of the `nn.Linear` one. LayerNorm epsilon 1e-5,
    GELU in its tanh approximation (`gelu_new`), every dropout 0, attention through SDPA; no
    beginning or end-of-text token, so generation never stops early. The result is in eval
    mode, on `model`'s device and in its dtype.

    Args:
        model: a plain GPT-2 `GPTModel`.

    Returns:
        The Hugging Face model.

    Raises:
        ValueError: `model` uses rotary positions, grouped-query attention or a window.
        ModuleNotFoundError: `transformers` is not installed (`pip install -e '.[bench]'`).
    """
    reasons = unsupported(model)
    if reasons:
        raise ValueError(
            "Hugging Face's GPT-2 holds the plain GPT-2 configuration only; this model uses "
            + ", ".join(reasons)
        )
    from transformers import GPT2Config, GPT2LMHeadModel

    blocks: list[Any] = list(model.trf_blocks)
    first: MultiHeadAttention = blocks[0].att
    weight = model.tok_emb.weight
    config = GPT2Config(
        vocab_size=model.vocab_size, n_positions=model.context_length, n_embd=weight.shape[1],
        n_layer=len(blocks), n_head=first.num_heads, activation_function="gelu_new",
        layer_norm_epsilon=model.final_norm.eps, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None,
    )  # fmt: skip
    config._attn_implementation = ATTN_IMPLEMENTATION
    hf = GPT2LMHeadModel(config)
    nn.Module.to(hf, weight.device, weight.dtype)  # HF's own `to` is typed for its classes only
    nn.Module.eval(hf)
    tr: Any = hf.transformer
    with torch.no_grad():
        tr.wte.weight.copy_(model.tok_emb.weight)
        assert model.pos_emb is not None  # unsupported() said so
        tr.wpe.weight.copy_(model.pos_emb.weight)
        for block, hf_block in zip(blocks, tr.h, strict=True):
            att = block.att
            _copy_norm(block.norm1, hf_block.ln_1)
            _copy_linear(hf_block.attn.c_attn, att.W_query, att.W_key, att.W_value)
            _copy_linear(hf_block.attn.c_proj, att.out_proj)
            _copy_norm(block.norm2, hf_block.ln_2)
            _copy_linear(hf_block.mlp.c_fc, block.ff.layers[0])
            _copy_linear(hf_block.mlp.c_proj, block.ff.layers[2])
        _copy_norm(model.final_norm, tr.ln_f)
        hf.lm_head.weight.copy_(model.out_head.weight)
    return hf


def hf_generate(hf: GPT2LMHeadModel, idx: Tensor, max_new_tokens: int) -> Tensor:
    """Hugging Face's greedy `generate`: exactly `max_new_tokens` more tokens after `idx`."""
    out: Tensor = hf.generate(
        idx, attention_mask=torch.ones_like(idx), do_sample=False,
        max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
    )  # fmt: skip
    return out


def prefill(hf: GPT2LMHeadModel, prompt: Tensor) -> tuple[Tensor, Any]:
    """One forward over the prompt that fills a fresh cache: `(logits (b, T, vocab), cache)`.

    The cache is Hugging Face's default, a `DynamicCache`, which grows by concatenation.
    """
    out = hf(prompt, use_cache=True)
    return out.logits, out.cache


def decode_step(hf: GPT2LMHeadModel, token: Tensor, cache: Any) -> tuple[Tensor, Any]:
    """One decode step: the newest token `(b, 1)` after the cached ones; `(logits, cache)`."""
    out = hf(token, cache=cache, use_cache=True)
    return out.logits, out.cache


def embedding_bytes(hf: GPT2LMHeadModel) -> tuple[int, int]:
    """Bytes of every parameter, and of the embedding tables (only indexed when decoding)."""
    tr: Any = hf.transformer
    weights = sum(p.numel() * p.element_size() for p in hf.parameters())
    indexed = sum(t.weight.numel() * t.weight.element_size() for t in (tr.wte, tr.wpe))
    return weights, indexed
