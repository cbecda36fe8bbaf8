"""Floor 2, the layer: the production `MultiHeadAttention` and what it is made of.

- [`attention.layer.multihead`][attention.layer.multihead]: the module: one forward (check,
  project, rotate, cache, plan, attend, merge) for self- and cross-attention.
- [`attention.layer.masks`][attention.layer.masks]: which keys a query may see, as
  FlexAttention's `mask_mod` functions (causal, window, sinks, documents, padding, yours),
  with the bounds every kernel choice and the cache derive from.
- [`attention.layer.score_mods`][attention.layer.score_mods]: functions that change a score
  before the softmax.
- [`attention.layer.fused`][attention.layer.fused]: the planner: the least the fused kernel
  needs.
- [`attention.layer.prefix_lm`][attention.layer.prefix_lm],
  [`attention.layer.alibi`][attention.layer.alibi],
  [`attention.layer.softcap`][attention.layer.softcap]: variants, each one mask or score
  modifier.
- [`attention.layer.positions`][attention.layer.positions]: RoPE (and the sinusoidal table).
- [`attention.layer.rope_scaling`][attention.layer.rope_scaling]: RoPE for longer contexts:
  linear, dynamic NTK, YaRN and Llama 3.1's scaled frequencies; part of each head rotated.
- [`attention.layer.qk_norm`][attention.layer.qk_norm]: RMSNorm, and QK-norm of queries and
  keys (per head, or over the projection).
- [`attention.layer.sinks`][attention.layer.sinks]: a learned sink logit.
- [`attention.layer.tiled`][attention.layer.tiled]: FlashAttention's forward and backward in
  tiles, in plain PyTorch (no $T \\times S$ matrix, hidden tiles skipped).
- [`attention.layer.split_kv`][attention.layer.split_kv]: attention over sets of keys computed
  apart, each with its log-sum-exp, and their merge: split-KV decoding (ring attention's
  blocks too).
- [`attention.layer.latent`][attention.layer.latent]: multi-head latent attention (DeepSeek-V2
  and V3, Kimi K2): keys and values made from one cached latent per token, naive or absorbed.
- [`attention.layer.linear`][attention.layer.linear]: linear attention, $\\exp(q \\cdot k)$
  replaced by $\\phi(q) \\cdot \\phi(k)$: parallel, recurrent and chunked, one state of
  fixed size.
- [`attention.layer.delta`][attention.layer.delta]: the delta rule (DeltaNet) and its decay
  gate (Gated DeltaNet): recurrent, chunked (the WY/UT form) and parallel.
- [`attention.layer.gated_delta`][attention.layer.gated_delta]: Qwen3-Next's Gated DeltaNet
  layer, transformers' weights as they are, and its decode state.
- [`attention.layer.sparse_index`][attention.layer.sparse_index]: DeepSeek sparse attention
  (DeepSeek-V3.2): a lightning indexer chooses each query's top-$k$ keys, a mask that reads
  them per row, and latent attention over them.
- [`attention.layer.cache`][attention.layer.cache]: the key/value cache, linear or a ring
  buffer.
- [`attention.layer.testing`][attention.layer.testing]: how the layer is checked, for its
  tests and yours: the float64 oracle written from the definitions, the kernel-call spy,
  padding masks, the conversion to `nn.MultiheadAttention`.
"""
