# %% [markdown]
# # Exercise 19: attention across devices
#
# Chapter 19: [Attention across devices](../ring.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# A block $B$ of keys gives each query an output $o^B_i$ and a log-sum-exp $L^B_i$; two
# blocks merge by $L = \log(e^{L^A} + e^{L^B})$,
# $o = e^{L^A - L} o^A + e^{L^B - L} o^B$.

# %%
import torch

from attention.layer.masks import causal, window
from attention.layer.tiled import hidden
from attention.parallel import (
    block_attention,
    causal_pairs,
    zigzag_shard,
    zigzag_unshard,
)

# %% [markdown]
# ## Exercise 19.1: the merge by hand
#
# For `q, k, v` of shape `(1, 1, 8, 4)` (seed 0, float64), compute attention over all 8 keys
# under the causal mask with `block_attention`. Then split the keys into 4 blocks of 2,
# compute each block's `(out, lse)` and merge them yourself with the formula above (no
# `merge`), in the order 3, 1, 0, 2. Compare.

# %%
# Solution
torch.manual_seed(0)
q, k, v = torch.randn(3, 1, 1, 8, 4, dtype=torch.float64)
pos = torch.arange(8)[None]
whole, _ = block_attention(q, k, v, pos, pos, causal())
out, lse = torch.zeros_like(whole), torch.full((1, 1, 8), -torch.inf)
for b in (3, 1, 0, 2):
    part = slice(2 * b, 2 * b + 2)
    o_b, l_b = block_attention(
        q, k[:, :, part], v[:, :, part], pos, pos[:, part], causal()
    )
    both = torch.logaddexp(lse, l_b)
    safe = torch.where(torch.isinf(both), 0.0, both)  # no key seen yet
    out = (
        torch.exp(lse - safe)[..., None] * out
        + torch.exp(l_b - safe)[..., None] * o_b
    )
    lse = both
print(f"any order, merged against whole: {(out - whole).abs().max():.1e}")
assert torch.allclose(out, whole, rtol=0, atol=1e-12)

# %% [markdown]
# ## Exercise 19.2: zigzag balance
#
# For a sequence of 8,192 tokens on 8 processes under a causal mask, how many (query, key)
# pairs does each process compute with contiguous shards, and with zigzag shards? Count
# them from `zigzag_shard`'s positions (query $i$ sees $i + 1$ keys), then check against
# `causal_pairs`.

# %%
# Solution
T, P = 8192, 8
line = torch.arange(T)[None]
zigzag = [int((zigzag_shard(line, None, r, P)[1] + 1).sum()) for r in range(P)]
contiguous = [int((part + 1).sum()) for part in line.tensor_split(P, dim=1)]
assert zigzag == causal_pairs(T, P, "zigzag")
assert contiguous == causal_pairs(T, P, "contiguous")
print(f"contiguous: {min(contiguous):,} to {max(contiguous):,} pairs")
print(f"zigzag: {min(zigzag):,} to {max(zigzag):,} pairs")
pieces = [zigzag_shard(line, None, r, P)[0] for r in range(P)]
assert (zigzag_unshard(pieces) == line).all()  # integers: exact

# %% [markdown]
# ## Exercise 19.3: which blocks a window skips
#
# 4,096 tokens on 8 processes, contiguous shards, a sliding window of 256 (`window(256)`):
# for process 5, which processes' key/value blocks does `hidden` let it skip? How many of the
# 8 ring steps compute anything?

# %%
# Solution
T, P = 4096, 8
size = T // P
ranges = [(r * size, (r + 1) * size - 1) for r in range(P)]  # (low, high)
skipped = [
    s for s in range(P) if hidden(window(256).bounds, ranges[5], ranges[s])
]
computed = P - len(skipped)
print(f"process 5 skips the blocks of {skipped}: computes {computed} of {P}")
