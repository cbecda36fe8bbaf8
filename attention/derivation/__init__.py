"""Floor 1, the derivation: the book's stages, each an importable class or function.

- [`attention.derivation.text`][attention.derivation.text]: chapter 2, the input pipeline:
  the offline GPT-2 tokenizer, sliding-window batches, token + position embeddings.
- [`attention.derivation.core`][attention.derivation.core]: scores, masks, stable softmax,
  explicit attention: the formula every later stage computes.
- [`attention.derivation.simple`][attention.derivation.simple]: chapter 3, no trainable weights.
- [`attention.derivation.self_attention`][attention.derivation.self_attention]: chapter 4,
  `SelfAttention_v1`, `SelfAttention_v2`.
- [`attention.derivation.causal`][attention.derivation.causal]: chapters 6-7, `CausalAttention`.
- [`attention.derivation.wrapper`][attention.derivation.wrapper]: chapter 8, the multi-head
  wrapper: one `CausalAttention` per head.
"""
