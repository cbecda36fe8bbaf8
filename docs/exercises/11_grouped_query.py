# %% [markdown]
# # Exercise 11: grouped-query attention
#
# Chapter 11: [Grouped-query attention](../grouped-query.md). On the site, every output below
# was computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# With $h$ query heads and $h_{kv}$ key/value heads, query head $i$ reads key/value head
# $g(i) = \lfloor i / (h / h_{kv}) \rfloor$.

# %%
import torch

from attention import MultiHeadAttention, causal_mask, explicit_attention
from attention.model.shapes import PUBLISHED, kv_cache_bytes

# %% [markdown]
# ## Exercise 11.1: the cache of a long conversation
#
# How many GiB of keys and values does Llama 3 8B keep (bfloat16) for a batch of 4
# conversations of 32,768 tokens each? How many would it keep with one key/value head per query
# head? Compute it from the formula $2 \cdot n_\text{layers} \cdot h_{kv} \cdot d_h \cdot
# T \cdot b \cdot 2$ bytes, then check it against `kv_cache_bytes`.

# %%
# Solution
llama = PUBLISHED["Llama 3 8B"]
T, b = 32_768, 4
by_hand = (
    2 * llama.num_layers * llama.num_kv_heads * llama.head_dim * T * b * 2
)
assert by_hand == kv_cache_bytes(llama, num_tokens=T, batch=b)
as_mha = by_hand * llama.num_heads // llama.num_kv_heads
print(f"GQA: {by_hand / 2**30:.0f} GiB, as MHA: {as_mha / 2**30:.0f} GiB")

# %% [markdown]
# ## Exercise 11.2: grouped attention by hand
#
# Take `gqa = MultiHeadAttention(12, 12, 8, 0.0, num_heads=6, num_kv_heads=2)` (seed 0). Compute
# its output for a random `(1, 8, 12)` input yourself: project, split queries into 6 heads and
# keys and values into 2, let query head $i$ use key/value head $i // 3$ through
# `explicit_attention` with the causal mask, concatenate, project. Compare with `gqa(x)`.

# %%
# Solution
torch.manual_seed(0)
gqa = MultiHeadAttention(12, 12, 8, 0.0, num_heads=6, num_kv_heads=2)
x = torch.randn(1, 8, 12)
with torch.no_grad():
    q = gqa.W_query(x).view(1, 8, 6, 2).transpose(1, 2)  # (1, 6, 8, 2)
    k = gqa.W_key(x).view(1, 8, 2, 2).transpose(1, 2)  # (1, 2, 8, 2)
    v = gqa.W_value(x).view(1, 8, 2, 2).transpose(1, 2)  # (1, 2, 8, 2)
    heads = [
        explicit_attention(
            q[:, i], k[:, i // 3], v[:, i // 3], causal_mask(8)
        )[0]
        for i in range(6)
    ]  # 6 x (1, 8, 2)
    mine = gqa.out_proj(torch.cat(heads, dim=-1))  # (1, 8, 12)
    torch.testing.assert_close(mine, gqa(x))
print("by hand == MultiHeadAttention(num_kv_heads=2)")

# %% [markdown]
# ## Exercise 11.3: parameters saved
#
# For `d_in = d_out = 4096` and 32 query heads, how many parameters do `W_key` and `W_value`
# hold together with 32, 8 and 1 key/value heads (no bias)? Check with the module.

# %%
# Solution
for kv_heads in (32, 8, 1):
    module = MultiHeadAttention(
        4096, 4096, 16, 0.0, num_heads=32, num_kv_heads=kv_heads
    )
    n = module.W_key.weight.numel() + module.W_value.weight.numel()
    assert n == 2 * 4096 * kv_heads * (4096 // 32)
    heads = "head " if kv_heads == 1 else "heads"
    print(f"{kv_heads:>2} key/value {heads}: {n / 1e6:5.1f} M parameters")
