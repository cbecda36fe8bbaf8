# %% [markdown]
# # Exercise 12: sliding windows
#
# Chapter 12: [Sliding windows](../sliding-window.md). Every output below was computed while
# the site was built; download the notebook (link above) to run and change it yourself.
#
# With a window of $w$, query $i$ sees the keys $i - w < j \le i$.

# %%
import torch

from attention import MultiHeadAttention, causal_mask

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
# The module computes windowed attention in blocks of $w$ queries against $2w$ keys. Check that
# its fused output (`mha(x)`) equals its explicit path (`mha(x, need_weights=True)[0]`) for
# $T = 50$ and windows 1, 7, 16 and 64, with 4 query heads and 2 key/value heads.

# %%
# Solution
x = torch.randn(2, 50, 16)
for window in (1, 7, 16, 64):
    torch.manual_seed(0)
    mha = MultiHeadAttention(
        16, 16, 64, 0.0, num_heads=4, num_kv_heads=2, window=window
    )
    with torch.no_grad():
        torch.testing.assert_close(
            mha(x), mha(x, need_weights=True)[0], atol=1e-5, rtol=0
        )
    print(f"window {window:>2}: fused == explicit")

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
