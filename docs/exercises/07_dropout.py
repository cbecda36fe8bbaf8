# %% [markdown]
# # Exercise 7: dropout on the attention weights
#
# Chapter 7: [Dropout](../dropout.md). On the site, every output below was computed by the
# site's build (the footer says which); the downloads (links above) start without outputs: run
# them and change them.
#
# In training, each attention weight is kept with probability $1-p$ and rescaled:
#
# $$\begin{aligned}
#   \tilde\alpha_{ij} &= \frac{m_{ij}}{1-p}\,\alpha_{ij}, \\
#   m_{ij} &\sim \operatorname{Bernoulli}(1-p), \\
#   \mathbb{E}[\tilde\alpha_{ij}] &= \alpha_{ij}
# \end{aligned}$$

# %%
import matplotlib.pyplot as plt
import torch
from torch import nn

from attention import (
    CausalAttention,
    SelfAttentionV2,
    causal_mask,
    explicit_attention,
)
from attention.derivation.simple import example_inputs

inputs = example_inputs()  # X: (num_tokens, d_in) = (6, 3)
torch.manual_seed(789)
sa_v2 = SelfAttentionV2(d_in=3, d_out=2)
with torch.no_grad():
    queries = sa_v2.W_query(inputs)  # (6, 2)
    keys = sa_v2.W_key(inputs)  # (6, 2)
    values = sa_v2.W_value(inputs)  # (6, 2)
mask = causal_mask(6)  # (6, 6)
_, attn_weights = explicit_attention(queries, keys, values, mask)  # (6, 6)

# %% [markdown]
# ## Exercise 7.1: dropout by hand, matching nn.Dropout exactly
#
# Write `my_dropout(x, p)` from the formula, drawing the mask with
# `torch.empty_like(x).bernoulli_(1 - p)`. Under the same seed it should give exactly what
# `nn.Dropout(p)` gives in training mode, for several values of `p`.


# %%
# Solution
def my_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Zero each entry with probability p, scale survivors by 1 / (1 - p)."""
    keep = torch.empty_like(x).bernoulli_(1 - p)  # m ~ Bernoulli(1 - p)
    # scale the mask, then multiply: PyTorch's order, so rounding matches
    return x * (keep / (1 - p))


for p in (0.1, 0.5, 0.9):
    torch.manual_seed(123)
    mine = my_dropout(attn_weights, p)  # (6, 6)
    torch.manual_seed(123)
    theirs = nn.Dropout(p)(attn_weights)  # (6, 6)
    assert torch.equal(mine, theirs), p
print(my_dropout(attn_weights, 0.5))

# %% [markdown]
# ## Exercise 7.2: what survives, on average
#
# For $p \in \{0.1, 0.3, 0.5, 0.7, 0.9\}$ apply `nn.Dropout(p)` to 20 000 copies of
# `attn_weights` at once. Measure (a) the fraction of the non-zero weights that survive and
# (b) the mean row sum. Check (a) $\approx 1-p$ and (b) $\approx 1$, and plot both against $p$.

# %%
# Solution
ps = [0.1, 0.3, 0.5, 0.7, 0.9]
num_copies = 20_000
copies = attn_weights.expand(num_copies, 6, 6)  # (num_copies, 6, 6)
nonzero = copies > 0  # (num_copies, 6, 6): the causal triangle
kept_fraction, mean_row_sum = [], []
torch.manual_seed(0)
for p in ps:
    dropped = nn.Dropout(p)(copies)  # (num_copies, 6, 6)
    kept = ((dropped > 0) & nonzero).sum() / nonzero.sum()  # of the non-zeros
    kept_fraction.append(kept.item())
    mean_row_sum.append(dropped.sum(dim=-1).mean().item())  # over copies, rows
for p, kept, row_sum in zip(ps, kept_fraction, mean_row_sum, strict=True):
    assert abs(kept - (1 - p)) < 0.01 and abs(row_sum - 1) < 0.02
    print(f"p={p}: kept {kept:.3f}, mean row sum {row_sum:.3f}")
fig, ax = plt.subplots(figsize=(6, 3.6), layout="constrained")
ax.plot(ps, kept_fraction, marker="o", label="fraction kept")
ax.plot(ps, mean_row_sum, marker="o", label="mean row sum")
ax.set(xlabel="dropout probability p", ylabel="value")
ax.grid(alpha=0.3)
ax.legend()
plt.show()

# %% [markdown]
# ## Exercise 7.3: the first token in training mode
#
# "Your" can only attend to itself, with weight 1. In
# `CausalAttention(3, 2, context_length=6, dropout=0.5)` in training mode, its context vector
# can therefore only be one of two vectors. Which two? Check it over 2 000 forward passes and
# count how often each occurs. Then check that eval mode always returns $v^{(1)}$, the value
# vector of "Your" (token 1 in the book's counting from 1, row 0 in the code's).

# %%
# Solution
torch.manual_seed(123)
ca = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.5)
x = inputs.unsqueeze(0)  # (1, 6, 3)
with torch.no_grad():
    v1 = ca.W_value(inputs[0])  # v^(1): (2,)
    ca.train()
    firsts = torch.stack([ca(x)[0, 0] for _ in range(2_000)])  # (2000, 2)
    is_zero = (firsts == 0).all(dim=-1)  # dropped: 0
    is_double = torch.isclose(firsts, 2 * v1).all(dim=-1)  # kept: v1 / (1 - p)
    assert (is_zero | is_double).all()
    zero, double = is_zero.float().mean(), is_double.float().mean()
    print(f"zero: {zero:.3f} of the passes, 2 v1: {double:.3f}")
    ca.eval()
    torch.testing.assert_close(ca(x)[0, 0], v1)
