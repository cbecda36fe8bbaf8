"""The Hugging Face contender: `transformers`' GPT-2 holding the book's GPT weights.

[`to_hf_gpt2`][attention_bench.hf.to_hf_gpt2] copies a plain GPT-2 `GPTModel` (learned
positions, every head its own keys and values, no window) into a `GPT2LMHeadModel` that
computes the same logits, so the generation benchmark times both libraries on the same
weights. The names and layouts are those of
[`attention.model.hf_gpt2`][attention.model.hf_gpt2] (one mapping, read both ways); this
module builds the Hugging Face model around them. `transformers` is the `bench` extra (`pip
install -e '.[bench]'`); this module imports it only when called.

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

from attention.layer.multihead import MultiHeadAttention
from attention.model.gpt import GPTModel
from attention.model.hf_gpt2 import gpt2_to_hf
from attention.model.hf_gpt2 import gpt2_unsupported as unsupported

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel

__all__ = [
    "ATTN_IMPLEMENTATION",
    "MINIMUM",
    "available",
    "decode_step",
    "embedding_bytes",
    "hf_generate",
    "missing",
    "prefill",
    "to_hf_gpt2",
    "unsupported",
    "version",
]

ATTN_IMPLEMENTATION = "sdpa"
"""Hugging Face's attention backend in the benchmark: PyTorch's fused kernel, as ours."""


MINIMUM = "5.24"
"""The oldest `transformers` this module runs on (the `bench` extra pins 5.24.0): older ones
name a model's cache `past_key_values`, where 5.24 reads `cache=` and returns `out.cache`."""


def missing() -> str | None:
    """Why Hugging Face's model cannot be timed here, or None: not installed, or too old."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (the bench extra)"
    found = version()
    if _release(found) < _release(MINIMUM):
        return (
            f"transformers {found} is older than {MINIMUM}, which this bench needs "
            "(pip install -e '.[bench]' pins 5.24.0)"
        )
    return None


def available() -> bool:
    """Whether a `transformers` this module runs on is installed (the `bench` extra)."""
    return missing() is None


def _release(text: str) -> tuple[int, ...]:
    """`"5.17.0"` -> `(5, 17, 0)`; a suffix such as `.dev0` is dropped."""
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def version() -> str:
    """The installed `transformers` version."""
    import transformers

    return str(transformers.__version__)


def to_hf_gpt2(model: GPTModel) -> GPT2LMHeadModel:
    """A `transformers.GPT2LMHeadModel` with `model`'s weights: the same logits, its own code.

    The weights are [`gpt2_to_hf`][attention.model.hf_gpt2.gpt2_to_hf]'s: token and position
    embeddings to `wte` and `wpe`; per block `norm1`/`norm2` to `ln_1`/`ln_2`, `W_query`,
    `W_key`, `W_value` concatenated into `c_attn` (zero bias without `qkv_bias`), `out_proj`
    to `attn.c_proj`, the feed-forward's two layers to `mlp.c_fc` and `mlp.c_proj`;
    `final_norm` to `ln_f`, and `out_head` to an untied `lm_head` (the book's model does not
    tie it to the embedding), every `Conv1D` weight transposed. LayerNorm epsilon 1e-5,
    GELU in its tanh approximation (`gelu_new`), every dropout 0, attention through SDPA; no
    beginning or end-of-text token, so generation never stops early. The result is in eval
    mode, on `model`'s device and in its dtype.

    Args:
        model: a plain GPT-2 `GPTModel`.

    Returns:
        The Hugging Face model.

    Raises:
        TypeError: `model` is not a `GPTModel`.
        ValueError: `model` uses rotary positions, grouped-query attention, a window or sinks.
        ModuleNotFoundError: `transformers` is not installed (`pip install -e '.[bench]'`).
    """
    state = gpt2_to_hf(model)  # refuses what GPT-2 cannot hold, before importing transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    blocks: list[Any] = list(model.trf_blocks)
    first: MultiHeadAttention = blocks[0].att
    weight = model.tok_emb.weight
    config = GPT2Config(
        vocab_size=model.vocab_size,
        n_positions=model.context_length,
        n_embd=weight.shape[1],
        n_layer=len(blocks),
        n_head=first.num_heads,
        activation_function="gelu_new",
        layer_norm_epsilon=model.final_norm.eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = ATTN_IMPLEMENTATION
    hf = GPT2LMHeadModel(config)
    nn.Module.to(hf, weight.device, weight.dtype)  # HF's own `to` is typed for its classes only
    nn.Module.eval(hf)
    hf.load_state_dict(state)  # strict: every tensor, by attention.model.hf_gpt2's one mapping
    return hf


def hf_generate(hf: GPT2LMHeadModel, idx: Tensor, max_new_tokens: int) -> Tensor:
    """Hugging Face's greedy `generate`: exactly `max_new_tokens` more tokens after `idx`."""
    out: Tensor = hf.generate(
        idx,
        attention_mask=torch.ones_like(idx),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
    )
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
