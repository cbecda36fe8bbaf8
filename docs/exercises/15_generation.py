# %% [markdown]
# # Exercise 15: generating with a cache
#
# Chapter 15: [Generating text](../generation.md). On the site, every output below was computed
# by the site's build (the footer says which); the downloads (links above) start without
# outputs: run them and change them.
#
# A causal layer's keys and values of earlier tokens never change, so a generating model keeps
# them (the key/value cache) and runs only the newest token at each step.

# %%
import time

import torch

from attention import MultiHeadAttention
from attention.model.generation import generate
from attention.model.gpt import GPTModel

_ = torch.manual_seed(0)

# %% [markdown]
# ## Exercise 15.1: a cache by hand
#
# For `mha = MultiHeadAttention(16, 16, context_length=32, dropout=0.0, num_heads=4).eval()`,
# write the decode step yourself: keep `keys` and `values` lists of shape `(1, 4, t, 4)`
# tensors, and for each new token compute its query, key and value, append, and attend with
# `torch.softmax(q @ K.transpose(-2, -1) / 2, dim=-1) @ V` (no mask: the new token may see
# every cached one). Check each step's output against `mha(x[:, : t + 1])[:, -1]`.

# %%
# Solution
mha = MultiHeadAttention(
    16, 16, context_length=32, dropout=0.0, num_heads=4
).eval()
x = torch.randn(1, 10, 16)


def heads(t: torch.Tensor) -> torch.Tensor:  # (1, 1, 16) -> (1, 4, 1, 4)
    return t.view(1, 1, 4, 4).transpose(1, 2)


K = torch.empty(1, 4, 0, 4)
V = torch.empty(1, 4, 0, 4)
with torch.no_grad():
    for t in range(10):
        token = x[:, t : t + 1]  # (1, 1, 16)
        q = heads(mha.W_query(token))
        K = torch.cat((K, heads(mha.W_key(token))), dim=2)  # (1, 4, t + 1, 4)
        V = torch.cat((V, heads(mha.W_value(token))), dim=2)
        alpha = torch.softmax(q @ K.transpose(-2, -1) / 4**0.5, dim=-1)
        z = alpha @ V  # (1, 4, 1, 4)
        out = mha.out_proj(z.transpose(1, 2).reshape(1, 1, 16))
        torch.testing.assert_close(
            out[:, 0], mha(x[:, : t + 1])[:, -1], atol=1e-5, rtol=0
        )
print("10 decode steps by hand == the module on the whole prefix")

# %% [markdown]
# ## Exercise 15.2: how much faster?
#
# Build a small GPT (`vocab_size=1000, context_length=256, emb_dim=128, n_heads=4,
# n_layers=4, drop_rate=0.0, qkv_bias=False`) and time `generate` with and without the cache
# for a prompt of 128 random tokens and 64 new ones. Check that the tokens are the same.

# %%
# Solution
cfg = {
    "vocab_size": 1000,
    "context_length": 256,
    "emb_dim": 128,
    "n_heads": 4,
    "n_layers": 4,
    "drop_rate": 0.0,
    "qkv_bias": False,
}
model = GPTModel(cfg).eval()
prompt = torch.randint(0, 1000, (1, 128))
seconds = {}
for use_cache in (True, False):
    start = time.perf_counter()
    tokens = generate(model, prompt, max_new_tokens=64, use_cache=use_cache)
    seconds[use_cache] = time.perf_counter() - start
    if use_cache:
        cached_tokens = tokens
assert torch.equal(cached_tokens, tokens)
print(
    f"cached {seconds[True]:.2f} s, uncached {seconds[False]:.2f} s: "
    f"{seconds[False] / seconds[True]:.1f}x"
)

# %% [markdown]
# ## Exercise 15.3: top-k by hand
#
# Given scores `logits = torch.tensor([4.51, 0.89, -1.90, 6.75, 1.63, -1.62, -1.89, 6.28, 1.79])`,
# keep the top 3 (set the others to `-inf`) and compute the softmax. Which tokens can still be
# drawn, and with what probability?

# %%
# Solution
logits = torch.tensor(
    [4.51, 0.89, -1.90, 6.75, 1.63, -1.62, -1.89, 6.28, 1.79]
)
top = torch.topk(logits, 3)
kept = torch.full_like(logits, float("-inf")).scatter(
    0, top.indices, top.values
)
probs = torch.softmax(kept, dim=0)
assert (probs > 0).sum() == 3 and torch.isclose(probs.sum(), torch.tensor(1.0))
print({int(i): round(float(probs[i]), 3) for i in top.indices})
