# %% [markdown]
# # Exercise 18: attention in tiles
#
# Chapter 18: [Attention without the T×T matrix](../tiles.md). On the site, every output below
# was computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# A tiled pass keeps, for each query, the log-sum-exp $L = \log \sum_j e^{S_j}$ of its
# scores; two sets of keys with outputs $O_1, O_2$ and log-sum-exps $L_1, L_2$ merge into
# $L = \log(e^{L_1} + e^{L_2})$ and $O = e^{L_1 - L} O_1 + e^{L_2 - L} O_2$.

# %%
import torch

from attention.layer.masks import causal, window
from attention.layer.split_kv import merge
from attention.layer.tiled import (
    SKIPPED,
    flash_attention,
    tile_grid,
)

_ = torch.manual_seed(0)

# %% [markdown]
# ## Exercise 18.1: two halves make the whole
#
# Take one query's scores `s = torch.randn(10)` and values `v = torch.randn(10, 3)`. Compute
# the softmax-weighted average of the values over keys 0-3 and over keys 4-9 separately,
# each with its log-sum-exp, merge them by the formula above, and compare with the average
# over all ten keys. Then check your merge against `merge`.

# %%
# Solution
s = torch.randn(10, dtype=torch.float64)  # one query's scores
v = torch.randn(10, 3, dtype=torch.float64)  # (num_keys, d_v)
whole = torch.softmax(s, 0) @ v
o1, l1 = torch.softmax(s[:4], 0) @ v[:4], torch.logsumexp(s[:4], 0)
o2, l2 = torch.softmax(s[4:], 0) @ v[4:], torch.logsumexp(s[4:], 0)
lse = torch.logaddexp(l1, l2)  # log(e^L1 + e^L2)
mine = torch.exp(l1 - lse) * o1 + torch.exp(l2 - lse) * o2
torch.testing.assert_close(mine, whole)
theirs, _ = merge([o1[None], o2[None]], [l1[None], l2[None]])
torch.testing.assert_close(theirs[0], whole)
print("merged halves == softmax over all ten keys")

# %% [markdown]
# ## Exercise 18.2: how many tiles does a window compute?
#
# With $T$ tokens in tiles of $B$ and a window of $w = B$ (each query sees its last $B$
# tokens), query tile $n$ meets key tiles $n - 1$ and $n$ only. How many tiles does a pass
# compute out of $(T/B)^2$? Check your count with `tile_grid` for $T = 256$, $B = 32$, then
# for a causal mask.

# %%
# Solution
T, B = 256, 32
n = T // B
pos = torch.arange(T)
grid = tile_grid(window(B), pos, pos, block_q=B, block_k=B)
computed = int((grid != SKIPPED).sum())
assert computed == n + (n - 1)  # the diagonal, and the one below it
grid = tile_grid(causal(), pos, pos, block_q=B, block_k=B)
assert int((grid != SKIPPED).sum()) == n * (n + 1) // 2  # the lower triangle
print(f"window: {2 * n - 1} of {n * n} tiles, causal: {n * (n + 1) // 2}")

# %% [markdown]
# ## Exercise 18.3: the backward's row sum
#
# The backward replaces $\sum_k P_{ik}\, dP_{ik}$ (a sum over every key) by
# $D_i = dO_i \cdot O_i$. Check it numerically: for random `q`, `k`, `v` of shape
# `(1, 1, 50, 8)` in float64 and a random `dO`, compute $P$ by the formula (causal),
# $dP = dO\, V^\top$ and both sides. Then check that `flash_attention`'s gradient of `v`
# is $P^\top dO$.

# %%
# Solution
q, k, v = torch.randn(3, 1, 1, 50, 8, dtype=torch.float64).unbind(0)
d_out = torch.randn(1, 1, 50, 8, dtype=torch.float64)
scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(
    ~causal().grid(torch.arange(50), torch.arange(50)), float("-inf")
)
P = torch.softmax(scores, dim=-1)  # (1, 1, 50, 50)
O = P @ v
dP = d_out @ v.transpose(-2, -1)
torch.testing.assert_close((P * dP).sum(-1), (d_out * O).sum(-1))
v.requires_grad_()
(dv,) = torch.autograd.grad(flash_attention(q, k, v, mask=causal()), v, d_out)
torch.testing.assert_close(dv, P.transpose(-2, -1) @ d_out)
print("rowsum(P * dP) == rowsum(dO * O), and dV == P^T dO")
