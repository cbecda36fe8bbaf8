# %% [markdown]
# # Exercise 6: causal attention
#
# Chapter 6: [Causal attention](../causal.md). On the site, every output below was computed by
# the site's build (the footer says which); the downloads (links above) start without outputs:
# run them and change them.
#
# Query $i$ may only attend to keys $j \le i$. With the mask $M$ written over the scaled scores,
#
# $$\begin{aligned}
#   M_{ij} &= \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}, \\
#   \alpha &= \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right), \\
#   Z &= \alpha V
# \end{aligned}$$

# %%
import matplotlib.pyplot as plt
import torch

from attention import (
    CausalAttention,
    SelfAttentionV2,
    causal_mask,
    explicit_attention,
)
from attention.derivation.simple import EXAMPLE_TOKENS, example_inputs

inputs = example_inputs()  # X: (num_tokens, d_in) = (6, 3)
batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)

# %% [markdown]
# ## Exercise 6.1: two ways to mask, one result
#
# After `torch.manual_seed(789)`, build `SelfAttentionV2(d_in=3, d_out=2)` and compute its
# queries, keys and values. Compute the causal attention weights twice: (a) softmax first,
# then multiply by `torch.tril(torch.ones(6, 6))` and renormalise each row; (b) fill the scaled scores above
# the diagonal with `-inf` (use `torch.triu(..., diagonal=1)` to build the mask yourself), then
# softmax. Check that (a), (b) and the weights returned by
# `explicit_attention(queries, keys, values, causal_mask(6))` all agree, and draw them.


# %%
# A heatmap in plain matplotlib: queries down, keys across, each weight written
# in its cell.
def heatmap(ax, weights, labels, title, vmin=None, vmax=None):
    """Draw `weights` (num_queries, num_keys) on `ax`, labelled by token."""
    values = weights.tolist()
    image = ax.imshow(values, vmin=vmin, vmax=vmax)  # viridis: dark is low
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="keys", ylabel="queries", title=title)
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            ink = "white" if image.norm(value) < 0.5 else "black"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", c=ink)
    ax.figure.colorbar(image, ax=ax, shrink=0.8)


# %%
# Solution
torch.manual_seed(789)
sa_v2 = SelfAttentionV2(d_in=3, d_out=2)
with torch.no_grad():
    queries = sa_v2.W_query(inputs)  # (6, 2)
    keys = sa_v2.W_key(inputs)  # (6, 2)
    values = sa_v2.W_value(inputs)  # (6, 2)
scaled = queries @ keys.T / keys.shape[-1] ** 0.5  # (6, 6)

# (a) softmax, zero the future, renormalise
below = torch.tril(torch.ones(6, 6))  # 1 where j <= i
weights_a = torch.softmax(scaled, dim=-1) * below  # (6, 6)
weights_a = weights_a / weights_a.sum(dim=-1, keepdim=True)  # (6, 6)

# (b) -inf above the diagonal, then softmax
future = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)  # (6, 6)
masked = scaled.masked_fill(future, float("-inf"))  # (6, 6)
weights_b = torch.softmax(masked, dim=-1)  # (6, 6)

mask = causal_mask(6)  # (6, 6)
_, weights_core = explicit_attention(queries, keys, values, mask)  # (6, 6)
torch.testing.assert_close(weights_a, weights_b)
torch.testing.assert_close(weights_b, weights_core)
assert torch.equal(future, ~mask)  # causal_mask: True where j <= i
fig, ax = plt.subplots(figsize=(5.5, 4.5), layout="constrained")
heatmap(ax, weights_b, EXAMPLE_TOKENS, "causal weights")
plt.show()

# %% [markdown]
# ## Exercise 6.2: nothing flows backwards
#
# Take `ca = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)` (seed 123). For
# every position `i`, replace all tokens **after** `i` with random vectors and check that the
# context vectors of tokens `0..i` are bit-for-bit unchanged (`torch.equal`). Then do the same
# with the unmasked `SelfAttentionV2` above and count how many positions see their output
# change.

# %%
# Solution
torch.manual_seed(123)
ca = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)
gen = torch.Generator().manual_seed(0)  # for the random tokens alone

leaks_causal, leaks_open = 0, 0
with torch.no_grad():
    z_causal = ca(batch)  # (2, 6, 2)
    z_open = sa_v2(inputs)  # (6, 2)
    for i in range(5):  # the last position has no future to change
        changed = inputs.clone()  # (6, 3)
        changed[i + 1 :] = torch.randn(5 - i, 3, generator=gen)
        z_causal_changed = ca(torch.stack((changed, changed)))  # (2, 6, 2)
        z_open_changed = sa_v2(changed)  # (6, 2)
        past = slice(0, i + 1)  # tokens 0..i
        same = torch.equal(z_causal_changed[:, past], z_causal[:, past])
        leaks_causal += not same
        leaks_open += not torch.equal(z_open_changed[past], z_open[past])
assert leaks_causal == 0
assert leaks_open == 5
print(
    f"past changed: causal {leaks_causal} times, unmasked {leaks_open} times"
)

# %% [markdown]
# ## Exercise 6.3: one buffer, every length
#
# `ca.mask` is built once for `context_length=6`. Run `ca` on the first `n` tokens for every
# `n` from 1 to 6 and check (a) that the slice `ca.mask[:n, :n]` (the book's buffer, True =
# hidden) equals `~causal_mask(n)` and (b) that the output equals the first `n` rows of the
# full run. What happens with 7 tokens?

# %%
# Solution
with torch.no_grad():
    full = ca(batch)  # (2, 6, 2)
    for n in range(1, 7):
        assert torch.equal(ca.mask[:n, :n], ~causal_mask(n))
        torch.testing.assert_close(ca(batch[:, :n]), full[:, :n])  # (2, n, 2)

seven = torch.cat((inputs, inputs[:1])).unsqueeze(0)  # (1, 7, 3)
try:
    ca(seven)
except ValueError as error:
    print("ValueError:", error)
else:
    raise AssertionError("a 7-token sequence should not fit a 6-token mask")
