# %% [markdown]
# # Exercise 5: scaling the scores
#
# Chapter 5: [Scaling](../scaling.md). On the site, every output below was computed by the
# site's build (the footer says which); the downloads (links above) start without outputs: run
# them and change them.
#
# For a query and a key with independent, unit-variance components,
#
# $$\begin{aligned}
#   \operatorname{Var}[q \cdot k] &= d_k, \\
#   \frac{\partial \operatorname{softmax}(\omega)_i}{\partial \omega_j}
#   &= \alpha_i (\delta_{ij} - \alpha_j)
# \end{aligned}$$

# %%
import math

import torch

from attention.derivation.core import softmax_stable

_ = torch.manual_seed(123)

# %% [markdown]
# ## Exercise 5.1: the variance of a dot product
#
# Check $\operatorname{Var}[q \cdot k] = d_k$ with many random pairs (a fresh key for every
# query) for $d_k = 16$ and $d_k = 256$, to within 5 %.

# %%
# Solution
num_pairs = 20_000
for d_k in (16, 256):
    q = torch.randn(num_pairs, d_k)  # (num_pairs, d_k)
    k = torch.randn(num_pairs, d_k)  # (num_pairs, d_k)
    attn_scores = (q * k).sum(dim=-1)  # one per pair: (num_pairs,)
    variance = attn_scores.var().item()
    print(f"d_k = {d_k:>3}: Var[q . k] = {variance:.1f}")
    assert abs(variance / d_k - 1) < 0.05

# %% [markdown]
# ## Exercise 5.2: why the Jacobian's rows sum to zero
#
# Compute the Jacobian of the softmax with `torch.autograd.functional.jacobian` for some
# scores, compare it with $\operatorname{diag}(\alpha) - \alpha\alpha^\top$, and check that
# each row sums to 0. Which property of the softmax, also behind `softmax_stable`, does
# that express?


# %%
# Solution
def softmax_last(z):
    return torch.softmax(z, dim=-1)


omega = torch.randn(6)  # (6,)
jacobian = torch.autograd.functional.jacobian
J = jacobian(softmax_last, omega)  # (6, 6)
alpha = softmax_last(omega)  # (6,)
J_formula = torch.diag(alpha) - torch.outer(alpha, alpha)  # (6, 6)
torch.testing.assert_close(J, J_formula)
# Row i says how alpha_i moves when the scores move. Moving every score by the
# same amount is a shift, and a shift leaves the softmax unchanged: the rows
# sum to 0.
torch.testing.assert_close(J.sum(dim=-1), torch.zeros(6))
shifted = omega + 100.0  # the same shift for every score
assert torch.allclose(softmax_stable(shifted), softmax_stable(omega))
print("largest row sum of J:", f"{J.sum(dim=-1).abs().max():.1e}")

# %% [markdown]
# ## Exercise 5.3: too much scaling
#
# Why $\sqrt{d_k}$ and not $d_k$? Divide random scores by $d_k$ instead, and compare the
# largest attention weight (mean over queries, 16 keys) with the $\sqrt{d_k}$ version as
# $d_k$ grows. Show that dividing by $d_k$ drifts to uniform attention, $1/16$ per key: the
# opposite failure, attention that starts out singling nothing out.


# %%
# Solution
def mean_largest(attn_weights):  # (num_queries, num_keys) -> float
    return attn_weights.max(dim=-1).values.mean().item()


num_queries, num_keys = 256, 16
for d_k in (4, 64, 1024):
    q = torch.randn(num_queries, d_k)  # (256, d_k)
    k = torch.randn(num_keys, d_k)  # (16, d_k)
    attn_scores = q @ k.T  # (256, 16)
    by_d_k = mean_largest(torch.softmax(attn_scores / d_k, dim=-1))
    scaled = attn_scores / math.sqrt(d_k)  # (256, 16)
    by_sqrt = mean_largest(torch.softmax(scaled, dim=-1))
    print(f"d_k {d_k:>4}:  / d_k {by_d_k:.3f},  / sqrt {by_sqrt:.3f}")
assert by_d_k < 1.2 / num_keys  # at d_k = 1024: practically uniform
assert by_sqrt > 2 / num_keys  # sqrt still singles keys out
