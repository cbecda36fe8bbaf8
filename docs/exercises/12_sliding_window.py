# %% [markdown]
# # Exercise 12: sliding windows
#
# Chapter 12: [Sliding windows](../sliding-window.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# With a window of $w$, query $i$ sees the keys $i - w < j \le i$.

# %%
import torch

from attention import MultiHeadAttention, causal_mask
from attention.layer.testing import sdpa_calls

# %% [markdown]
# ## Exercise 12.1: the band
#
# Build the windowed causal mask for $T = 7$, $w = 3$ yourself with `torch.arange` (True where
# the query may attend) and compare it with `causal_mask(7, window=3)`. How many keys does each
# query see?

# %%
# Solution
i = torch.arange(7)[:, None]
j = torch.arange(7)[None, :]
mine = (j <= i) & (j > i - 3)  # not the future, not too far back
assert torch.equal(mine, causal_mask(7, window=3))
print("keys seen per query:", mine.sum(dim=-1).tolist())

# %% [markdown]
# ## Exercise 12.2: blocks give the same answer
#
# The module computes windowed attention in blocks of $\max(w, 64)$ queries (`MIN_BLOCK`), each
# against at most $\max(w, 64) + w - 1$ keys. Check that its fused output (`mha(x)`) equals its
# explicit path (`mha(x, need_weights=True)[0]`) for $T = 200$ (four blocks) and windows 1, 7,
# 16 and 64, with 4 query heads and 2 key/value heads, and count the kernel's calls with
# `attention.layer.testing.sdpa_calls`.

# %%
# Solution
x = torch.randn(2, 200, 16)
for window in (1, 7, 16, 64):
    torch.manual_seed(0)
    mha = MultiHeadAttention(
        16, 16, 256, 0.0, num_heads=4, num_kv_heads=2, window=window
    )
    with torch.no_grad(), sdpa_calls() as calls:
        fused = mha(x)
    with torch.no_grad():
        explicit = mha(x, need_weights=True)[0]
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    keys = [call.num_keys for call in calls]
    print(
        f"window {window:>2}: fused == explicit, {len(calls)} calls over "
        f"{keys} keys"
    )

# %% [markdown]
# ## Exercise 12.3: the work saved
#
# Count the (query, key) pairs that causal attention and windowed attention score for
# $T = 8{,}192$ and $w = 512$, from the masks' formulas (not by building them), and the ratio.

# %%
# Solution
T, w = 8192, 512
causal_pairs = T * (T + 1) // 2  # query i sees i + 1 keys
window_pairs = sum(min(i + 1, w) for i in range(T))  # at most w each
ratio = causal_pairs / window_pairs
print(
    f"causal: {causal_pairs:,}, windowed: {window_pairs:,}, ratio {ratio:.1f}"
)
