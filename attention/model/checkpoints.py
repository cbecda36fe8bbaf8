"""Weights in and out, by one import: every loader and writer of the modules that hold them.

Four modules do the work, one job each; this one gathers their public names, so that
`from attention.model.checkpoints import gpt2_from_hf` keeps working:

- [`attention.model.files`][attention.model.files]: safetensors, pickled state dicts,
  sharded `save_pretrained` directories.
- [`attention.model.hf_gpt2`][attention.model.hf_gpt2]: Hugging Face's GPT-2 and the book's
  `GPTModel`, one table of tensors read both ways (`gpt2_from_hf`, `gpt2_to_hf`,
  `gpt2_from_pretrained`, `gpt2_unsupported`, `GPT2_HEADS`).
- [`attention.model.book_weights`][attention.model.book_weights]: the book's chapter-5 layout
  (`load_weights_into_gpt`, `gpt2_to_params`, `gpt2_config`).
- [`attention.model.llama_config`][attention.model.llama_config] and
  [`attention.model.llama`][attention.model.llama]: one Llama-family attention layer, its
  config's settings read or refused, its weights in and out (`attention_from_llama`,
  `attention_to_llama`, `llama_attention_config`).

Examples:
    >>> from attention.model.checkpoints import gpt2_from_hf
    >>> from attention.model.hf_gpt2 import gpt2_from_hf as where_it_lives
    >>> gpt2_from_hf is where_it_lives
    True
"""

from __future__ import annotations

from attention.model.book_weights import gpt2_config, gpt2_to_params, load_weights_into_gpt
from attention.model.hf_gpt2 import (
    GPT2_HEADS,
    gpt2_from_hf,
    gpt2_from_pretrained,
    gpt2_to_hf,
    gpt2_unsupported,
)
from attention.model.llama import attention_from_llama, attention_to_llama, llama_attention_config

__all__ = [
    "GPT2_HEADS",
    "attention_from_llama",
    "attention_to_llama",
    "gpt2_config",
    "gpt2_from_hf",
    "gpt2_from_pretrained",
    "gpt2_to_hf",
    "gpt2_to_params",
    "gpt2_unsupported",
    "llama_attention_config",
    "load_weights_into_gpt",
]
