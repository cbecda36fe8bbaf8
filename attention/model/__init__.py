"""Floor 3, the model: the book's GPT on the production layer, generation, checkpoints.

- [`attention.model.gpt`][attention.model.gpt]: `GPTModel`, its blocks, norms and
  feed-forward.
- [`attention.model.llama_block`][attention.model.llama_block]: the Llama block (RMSNorm,
  SwiGLU or a mixture of experts, no biases; softmax or Gated DeltaNet attention) and
  `LlamaModel`, a `GPTModel` of them.
- [`attention.model.experts`][attention.model.experts]: `MixtureOfExperts`, the top-k
  feed-forward of Mixtral, Qwen3-MoE and Qwen3-Next.
- [`attention.model.hybrid`][attention.model.hybrid]: `HybridGPTModel`, a `GPTModel` whose
  layers mix softmax and linear attention by its config (Qwen3-Next's `layer_types`).
- [`attention.model.generation`][attention.model.generation]: writing text with it: the
  book's loop, and batches of prompts of different lengths, sampling, stops per row,
  streaming.
- [`attention.model.decode`][attention.model.decode]: decode steps with static shapes, which
  one CUDA graph holds (`generate`'s default on CUDA).
- [`attention.model.files`][attention.model.files]: checkpoint files: safetensors, pickled
  state dicts, sharded `save_pretrained` directories.
- [`attention.model.hf_gpt2`][attention.model.hf_gpt2]: Hugging Face's GPT-2 in and out (a
  state dict, a file, a directory).
- [`attention.model.book_weights`][attention.model.book_weights]: the book's chapter-5 layout
  of GPT-2's weights.
- [`attention.model.llama_config`][attention.model.llama_config]: what one attention layer of a
  Llama-family config computes, every setting read or refused.
- [`attention.model.llama`][attention.model.llama]: one Llama, Mistral, Qwen2, Gemma 2,
  Granite, SmolLM3, Helium, Ernie 4.5, Cohere or Llama 4 attention layer in and out.
- [`attention.model.from_hf`][attention.model.from_hf]: whole Llama-family models from
  transformers (`attention.from_hf`; Qwen3-Next's hybrid and the mixtures of experts too),
  every setting read or refused.
- [`attention.model.checkpoints`][attention.model.checkpoints]: all of the above by one import.
- [`attention.model.shapes`][attention.model.shapes]: published models' shapes, for the cache
  and parameter arithmetic.
- [`attention.model.hybrid_shapes`][attention.model.hybrid_shapes]: published hybrids'
  shapes (Qwen3-Next: Gated DeltaNet and softmax layers), and what their caches hold.
"""
