# %% [markdown]
# # Exercise 10: rotary positions
#
# Chapter 10: [Positions](../positions.md). On the site, every output below was computed by the
# site's build (the footer says which); the downloads (links above) start without outputs: run
# them and change them.
#
# RoPE turns pair $i$ of a query or key at position $m$ by the angle $m\theta_i$,
# $\theta_i = \text{base}^{-2i/d_h}$, so that a query at $m$ and a key at $n$ meet in
#
# $$\langle R_{m\theta} q, R_{n\theta} k \rangle = \langle q, R_{(n-m)\theta} k \rangle .$$

# %%
import math

import torch

from attention import MultiHeadAttention
from attention.layer.positions import apply_rope, rope_angles
from attention.layer.rope_scaling import RopeScaling
from attention.layer.testing import padding_mask

_ = torch.manual_seed(0)

# %% [markdown]
# ## Exercise 10.1: one pair, by hand
#
# Write `rotate_pair(x, angle)` that turns the 2-vector `x` by `angle` radians with the 2 x 2
# rotation matrix. Check that the dot product of `q` turned by $m\theta$ and `k` turned by
# $n\theta$ equals that of `q` and `k` turned by $(n - m)\theta$, for a few $m, n$.


# %%
# Solution
def rotate_pair(x: torch.Tensor, angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]], dtype=x.dtype) @ x  # R(angle) x


q, k = torch.randn(2, 2, dtype=torch.float64)
theta = 0.3
for m, n in [(0, 5), (7, 12), (100, 105), (3, 1)]:
    left = rotate_pair(q, m * theta) @ rotate_pair(k, n * theta)
    right = q @ rotate_pair(k, (n - m) * theta)
    assert abs(left - right) < 1e-12
    print(f"m={m:>3}, n={n:>3}: {left:+.6f} (offset {n - m:+d})")

# %% [markdown]
# ## Exercise 10.2: the package's rotation is your rotation
#
# For `head_dim = 8`, the package pairs dimension $i$ with $i + 4$ (rotate-half). Rotate a
# random `(6, 8)` tensor with `apply_rope` and with your `rotate_pair`, pair by pair, position
# by position, using $\theta_i = 10000^{-2i/8}$, and check that they agree.

# %%
# Solution
x = torch.randn(6, 8, dtype=torch.float64)
cos, sin = rope_angles(6, head_dim=8, dtype=torch.float64)
by_package = apply_rope(x, cos, sin)  # (6, 8)
by_hand = torch.empty_like(x)
for m in range(6):
    for i in range(4):
        theta_i = 10000 ** (-2 * i / 8)
        # the pair (i, i + 4)
        turned = rotate_pair(x[m, [i, i + 4]], m * theta_i)
        by_hand[m, i], by_hand[m, i + 4] = turned
torch.testing.assert_close(by_package, by_hand)
print("apply_rope == pair-by-pair rotation")

# %% [markdown]
# ## Exercise 10.3: where a sequence sits does not matter
#
# Build `MultiHeadAttention(8, 8, context_length=32, dropout=0.0, num_heads=2, rope=True)`.
# A token's position counts only the real tokens before it, so padding in front moves a
# sequence to later slots of its row, not to later positions. Show it: run 5 tokens alone, and
# again in slots 10..14 behind 10 other tokens that a left-padding mask hides (their positions
# are still 0..4), and compare the real tokens' weights. (Placed at positions 10..14 with
# `positions=`, as in [the chapter](../positions.md#rope-in-the-production-module), they get
# the same weights too: RoPE's weights depend only on offsets.)

# %%
# Solution
torch.manual_seed(1)
mha = MultiHeadAttention(
    8, 8, context_length=32, dropout=0.0, num_heads=2, rope=True
)
x = torch.randn(1, 5, 8)
# the same 5 tokens in slots 10..14, still positions 0..4: (1, 15, 8)
x_late = torch.cat((torch.randn(1, 10, 8), x), dim=1)
with torch.no_grad():
    _, w_alone = mha(x, need_weights=True)  # (1, 2, 5, 5)
    _, w_late = mha(
        x_late, padding_mask([5], 15, side="left"), need_weights=True
    )
    # and at positions 10..14: RoPE's weights read only the offsets
    _, w_moved = mha(
        x, positions=torch.arange(10, 15)[None], need_weights=True
    )
torch.testing.assert_close(w_late[..., 10:, 10:], w_alone, atol=1e-5, rtol=0)
torch.testing.assert_close(w_moved, w_alone, atol=1e-5, rtol=0)
print("alone, behind padding (slots 10..14) and at positions 10..14: the")
print("same weights; head 0:")
print(w_alone[0, 0])

# %% [markdown]
# ## Exercise 10.4: Llama 3.1's scaling, by hand
#
# Llama 3.1 stretches a context of $L = 8192$ positions 8 times: with
# $\lambda_i = 2\pi/\theta_i$, a pair with $\lambda_i < L/4$ keeps $\theta_i$, one with
# $\lambda_i > L$ takes $\theta_i/8$, and between the two
# $\theta_i' = (1 - \sigma)\,\theta_i/8 + \sigma\,\theta_i$ with
# $\sigma = (L/\lambda_i - 1)/(4 - 1)$. Compute $\theta'$ for a head of width 128 at base
# 500,000, compare it with
# `RopeScaling.from_parameters({...}).frequencies(128, 500_000.0)`, and count the pairs
# of each kind.

# %%
# Solution
L, s = 8192, 8.0
exponents = torch.arange(0, 128, 2, dtype=torch.float64) / 128
theta = 500_000.0**-exponents  # (64,)
wavelength = 2 * math.pi / theta
sigma = (L / wavelength - 1.0) / (4.0 - 1.0)
blended = (1 - sigma) * theta / s + sigma * theta
slow, fast = wavelength > L, wavelength < L / 4
by_hand = torch.where(slow, theta / s, torch.where(fast, theta, blended))
llama31 = {"rope_type": "llama3", "factor": s,
           "original_max_position_embeddings": L,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0}  # fmt: skip
theirs, factor = RopeScaling.from_parameters(llama31).frequencies(
    128, 500_000.0
)
torch.testing.assert_close(by_hand, theirs, rtol=1e-12, atol=0)
print(
    f"kept {int(fast.sum())}, divided by 8: {int(slow.sum())}, "
    f"blended: {int((~fast & ~slow).sum())} of 64 pairs"
)
