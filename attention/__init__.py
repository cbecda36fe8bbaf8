"""Self-attention derived step by step, from dot products to a fused multi-head module.

The package reads bottom-up like the derivation (chapter numbers are the site's):

- [`attention.core`][attention.core]: scores, masks, stable softmax, explicit attention.
- [`attention.simple`][attention.simple]: chapter 3, no trainable weights.
- [`attention.self_attention`][attention.self_attention]: chapter 4, `SelfAttentionV1`, `V2`.
- [`attention.causal`][attention.causal]: chapters 6-7, `CausalAttention`.
- [`attention.multihead`][attention.multihead]: chapters 8-9, the wrapper and the production
  `MultiHeadAttention`: one forward (project, rotate, cache, attend, merge).
- [`attention.masks`][attention.masks]: which keys a query may see, as FlexAttention's
  `mask_mod` functions (causal, window, sinks, documents, padding, yours), with the bounds
  every kernel choice and the cache derive from; [`attention.score_mods`][attention.score_mods]:
  functions that change a score before the softmax.
- [`attention.fused`][attention.fused]: the planner: the least the fused kernel needs.
- [`attention.prefix_lm`][attention.prefix_lm], [`attention.alibi`][attention.alibi],
  [`attention.softcap`][attention.softcap]: variants, each one mask or score modifier.
- [`attention.cache`][attention.cache]: the key/value cache, linear or a ring buffer.
- [`attention.positions`][attention.positions], [`attention.sinks`][attention.sinks]: RoPE
  and attention sinks.
- [`attention.gpt`][attention.gpt]: the book's GPT on this attention.
- [`attention.generation`][attention.generation]: writing text with it: the book's loop, and
  batches of prompts of different lengths, sampling, stops per row, streaming.
- [`attention.weights`][attention.weights]: weights in and out: Hugging Face's GPT-2 (a state
  dict, a file, a directory), the book's chapter-5 layout, one Llama or Mistral attention layer.
- [`attention.text`][attention.text]: chapter 2, the input pipeline: the offline GPT-2
  tokenizer, sliding-window batches, token + position embeddings.
- [`attention.rnn`][attention.rnn] and [`attention.copy_task`][attention.copy_task]: chapter 1,
  why attention: a GRU encoder-decoder with and without Bahdanau attention, and the
  experiment that compares them.
- [`attention.plot`][attention.plot]: every figure of the site.
- [`attention.diagrams`][attention.diagrams]: its box-and-arrow diagrams, drawn from the real
  shapes.
- [`attention.training`][attention.training]: chapter 8's model trained in the open: two heads
  that learn to read the previous and the first token.
- [`attention.seq2seq`][attention.seq2seq]: chapter 14, cross-attention: a transformer
  encoder-decoder on chapter 1's copy task.
- [`attention.heads`][attention.heads]: chapter 16, what trained heads do: every head's
  scores and weights, previous-token and induction scores, a small GPT trained to form them.
- [`attention.runs`][attention.runs]: trained runs done once per process, and started early
  in another process by the site's build.
- [`attention.testing`][attention.testing]: what the tests and the pages share.

This module only re-exports.
"""

from attention.alibi import alibi, alibi_slopes
from attention.causal import CausalAttention
from attention.core import (
    attention_scores,
    causal_mask,
    explicit_attention,
    softmax_stable,
)
from attention.multihead import MultiHeadAttention, MultiHeadAttentionWrapper
from attention.prefix_lm import prefix_lm
from attention.self_attention import SelfAttentionV1, SelfAttentionV2
from attention.simple import (
    EXAMPLE_TOKENS,
    attn_scores_for_query,
    attn_scores_loop,
    attn_scores_matrix,
    context_vector,
    context_vectors,
    example_inputs,
    normalize_by_sum,
    simplified_self_attention,
    softmax_naive,
)
from attention.softcap import softcap
from attention.text import (
    GPT2_VOCAB_SIZE,
    GPTDatasetV1,
    TokenAndPositionEmbedding,
    create_dataloader_v1,
    gpt2_encoding,
    sample_text,
    sliding_windows,
    text_to_token_ids,
    token_ids_to_text,
)

__version__ = "0.1.0"

__all__ = [
    "EXAMPLE_TOKENS",
    "GPT2_VOCAB_SIZE",
    "CausalAttention",
    "GPTDatasetV1",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "TokenAndPositionEmbedding",
    "__version__",
    "alibi",
    "alibi_slopes",
    "attention_scores",
    "attn_scores_for_query",
    "attn_scores_loop",
    "attn_scores_matrix",
    "causal_mask",
    "context_vector",
    "context_vectors",
    "create_dataloader_v1",
    "example_inputs",
    "explicit_attention",
    "gpt2_encoding",
    "normalize_by_sum",
    "prefix_lm",
    "sample_text",
    "simplified_self_attention",
    "sliding_windows",
    "softcap",
    "softmax_naive",
    "softmax_stable",
    "text_to_token_ids",
    "token_ids_to_text",
]
