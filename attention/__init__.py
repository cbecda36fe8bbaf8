"""Self-attention derived step by step, from dot products to a fused multi-head module.

The package reads bottom-up like the derivation:

- [`attention.core`][attention.core]: scores, masks, stable softmax, explicit attention.
- [`attention.simple`][attention.simple]: stage 1, no trainable weights.
- [`attention.self_attention`][attention.self_attention]: stages 2-3, `SelfAttentionV1`, `V2`.
- [`attention.causal`][attention.causal]: stage 4, `CausalAttention`.
- [`attention.multihead`][attention.multihead]: stages 5-6, the wrapper and the production
  `MultiHeadAttention`.

This module only re-exports.
"""

from attention.causal import CausalAttention
from attention.core import (
    attention_scores,
    causal_mask,
    explicit_attention,
    softmax_stable,
)
from attention.multihead import MultiHeadAttention, MultiHeadAttentionWrapper
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

__version__ = "0.1.0"

__all__ = [
    "EXAMPLE_TOKENS",
    "CausalAttention",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "__version__",
    "attention_scores",
    "attn_scores_for_query",
    "attn_scores_loop",
    "attn_scores_matrix",
    "causal_mask",
    "context_vector",
    "context_vectors",
    "example_inputs",
    "explicit_attention",
    "normalize_by_sum",
    "simplified_self_attention",
    "softmax_naive",
    "softmax_stable",
]
