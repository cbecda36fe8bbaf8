"""Self-attention derived step by step, from dot products to a fused multi-head module.

The package has four floors, read bottom-up like the site; each imports only the floors below
it (and [`attention.checks`][attention.checks], the argument checks every floor shares):

1. [`attention.derivation`][attention.derivation]: the book's stages: the input pipeline,
   attention without weights, self-attention with $W_q, W_k, W_v$, causal attention, the
   multi-head wrapper, and the functional core they share.
2. [`attention.layer`][attention.layer]: the production `MultiHeadAttention`: masks and score
   modifiers as functions, the planner that picks the kernel call, RoPE, sinks and the cache;
   and `MultiHeadLatentAttention`, DeepSeek's latent attention, on the same machinery.
   Beside it, on the same floor, [`attention.parallel`][attention.parallel]: attention across
   processes (ring attention on `torch.distributed`, zigzag shards, training with DDP, FSDP2
   or the ring), from the layer's masks.
3. [`attention.model`][attention.model]: the book's GPT on that layer, generation, and
   checkpoints in and out (Hugging Face's GPT-2, Llama-family attention layers).
4. [`attention.lab`][attention.lab]: the chapters' experiments: the RNN copy task, the
   seq2seq transformer, the heads trained in the open, induction heads.

The site's own tooling (figures, diagrams, listings, the explorer, cached runs) is a separate
package, `attention_site`, not installed with this one.

This module only re-exports: the book's classes and functions under the book's names
(`SelfAttention_v1`, `CausalAttention`, `MultiHeadAttention`, `GPTModel`,
`generate_text_simple`, ...), and the library's main entry points.
"""

from attention.derivation.causal import CausalAttention
from attention.derivation.core import (
    attention_scores,
    causal_mask,
    explicit_attention,
    softmax_stable,
)
from attention.derivation.self_attention import (
    SelfAttention_v1,
    SelfAttention_v2,
    SelfAttentionV1,
    SelfAttentionV2,
)
from attention.derivation.simple import (
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
from attention.derivation.text import (
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
from attention.derivation.wrapper import MultiHeadAttentionWrapper
from attention.layer.alibi import alibi, alibi_slopes
from attention.layer.cache import KVCache
from attention.layer.latent import MultiHeadLatentAttention
from attention.layer.masks import Mask
from attention.layer.multihead import MultiHeadAttention
from attention.layer.prefix_lm import prefix_lm
from attention.layer.score_mods import ScoreMod
from attention.layer.softcap import softcap
from attention.model.from_hf import from_hf
from attention.model.generation import generate, generate_text_simple
from attention.model.gpt import (
    GELU,
    GPT_CONFIG_124M,
    FeedForward,
    GPTModel,
    LayerNorm,
    TransformerBlock,
)

__version__ = "0.1.0"

__all__ = [
    "EXAMPLE_TOKENS",
    "GELU",
    "GPT2_VOCAB_SIZE",
    "GPT_CONFIG_124M",
    "CausalAttention",
    "FeedForward",
    "GPTDatasetV1",
    "GPTModel",
    "KVCache",
    "LayerNorm",
    "Mask",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadLatentAttention",
    "ScoreMod",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "SelfAttention_v1",
    "SelfAttention_v2",
    "TokenAndPositionEmbedding",
    "TransformerBlock",
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
    "from_hf",
    "generate",
    "generate_text_simple",
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
