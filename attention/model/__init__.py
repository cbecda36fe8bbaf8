"""Floor 3, the model: the book's GPT on the production layer, generation, checkpoints.

- [`attention.model.gpt`][attention.model.gpt]: `GPTModel`, its blocks, norms and
  feed-forward.
- [`attention.model.generation`][attention.model.generation]: writing text with it: the
  book's loop, and batches of prompts of different lengths, sampling, stops per row,
  streaming.
- [`attention.model.decode`][attention.model.decode]: decode steps with static shapes, which
  one CUDA graph holds (`generate`'s default on CUDA).
- [`attention.model.checkpoints`][attention.model.checkpoints]: weights in and out: Hugging
  Face's GPT-2 (a state dict, a file, a directory), the book's chapter-5 layout, one Llama,
  Mistral, Qwen2, Gemma 2 or Granite attention layer.
- [`attention.model.shapes`][attention.model.shapes]: published models' shapes, for the cache
  and parameter arithmetic.
"""
