# %% [markdown]
# # Exercise 17: multi-head latent attention
#
# Chapter 17: [Multi-head latent attention](../latent.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# Each token caches a latent $c_s$ of $r$ numbers and one RoPE key $k^R_s$ of $d_R$; head
# $i$'s key is $[W^{(i)}_{UK} c_s; k^R_s]$ and its value $W^{(i)}_{UV} c_s$.

# %%
import math

import torch

from attention import MultiHeadLatentAttention
from attention.model.shapes import LARGE_GQA, LATENT, kv_cache_bytes

# %% [markdown]
# ## Exercise 17.1: DeepSeek-V3's cache by hand
#
# DeepSeek-V3 has 61 layers, $r = 512$ and $d_R = 64$. How many bytes (bfloat16) does it cache
# for a 128k-token conversation (131,072 tokens)? Check with `kv_cache_bytes`, then compare
# with Llama 3 70B (`LARGE_GQA["Llama 3 70B"]`) at the same length.

# %%
# Solution
deepseek, llama = LATENT["DeepSeek-V3"], LARGE_GQA["Llama 3 70B"]
T = 131_072
by_hand = deepseek.num_layers * (512 + 64) * T * 2
assert by_hand == kv_cache_bytes(deepseek, num_tokens=T)
llama_bytes = kv_cache_bytes(llama, num_tokens=T)
print(
    f"DeepSeek-V3: {by_hand / 2**30:.1f} GiB, "
    f"Llama 3 70B: {llama_bytes / 2**30:.1f} GiB"
)

# %% [markdown]
# ## Exercise 17.2: absorbed attention by hand
#
# Take the layer below (seed 0, float64). From `mla.project(x)` (queries without and with
# RoPE, latents, RoPE keys) and `mla.up_projections()` ($W_{UK}$, $W_{UV}$), compute its
# output without ever expanding a latent into a key or a value: fold $W_{UK}$ into the
# queries, score the latents and the RoPE keys, a causal softmax with the scale
# $1/\sqrt{d_N + d_R}$, sum the latents, then apply $W_{UV}$ and `o_proj`. Compare with
# `mla(x)`.

# %%
# Solution
torch.manual_seed(0)
mla = MultiHeadLatentAttention(
    32,
    num_heads=4,
    context_length=16,
    kv_lora_rank=8,
    qk_nope_head_dim=6,
    qk_rope_head_dim=4,
    v_head_dim=5,
).double()
x = torch.randn(1, 10, 32, dtype=torch.float64)
with torch.no_grad():
    q_nope, q_rope, latent, k_rope = mla.project(x)
    w_uk, w_uv = mla.up_projections()  # (h, d_N, r), (h, d_V, r)
    q_lat = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (1, h, T, r)
    scores = q_lat @ latent.mT + q_rope @ k_rope.mT  # (1, h, T, T)
    scores = scores / math.sqrt(6 + 4)
    future = torch.ones(10, 10, dtype=torch.bool).triu(1)
    weights = scores.masked_fill(future, -math.inf).softmax(-1)
    summed = weights @ latent  # (1, h, T, r): the latents, weighted
    heads = torch.einsum("bhtr,hvr->bhtv", summed, w_uv)  # (1, h, T, d_V)
    mine = mla.o_proj(heads.transpose(1, 2).reshape(1, 10, -1))
    torch.testing.assert_close(mine, mla(x), atol=1e-12, rtol=0)
print("absorbed by hand == MultiHeadLatentAttention")

# %% [markdown]
# ## Exercise 17.3: only distances matter
#
# RoPE turns the query and the key by their positions, so a score depends only on how far
# apart they are. Check it on the whole layer: give `mla(x, positions=...)` the positions
# $100, 101, \dots$ instead of $0, 1, \dots$ and compare. Then let a cache take tokens
# $0 \dots 8$ and give the last token position 10 instead of 9: its distances to the cached
# keys change, and so does its output.

# %%
# Solution
with torch.no_grad():
    shifted = mla(x, positions=torch.arange(100, 110)[None])
    torch.testing.assert_close(shifted, mla(x), atol=1e-12, rtol=0)
    cache = mla.init_cache(batch_size=1, max_tokens=16)
    mla(x[:, :9], cache=cache)  # keys at positions 0 .. 8
    gap = mla(x[:, 9:], cache=cache, positions=torch.tensor([[10]]))
    change = (gap - mla(x)[:, 9:]).abs().max()
print("shifted by 100: the same outputs")
print(f"last token at 10 instead of 9: changed by {change:.2f}")
