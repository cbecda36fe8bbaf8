# %% [markdown]
# # Exercise 3: simplified self-attention by hand
#
# Chapter 3: [Simplified self-attention](../simplified.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# The running example, *"Your journey starts with one step"*, is six tokens embedded in three
# dimensions. Simplified self-attention uses each embedding $x^{(i)}$ as query, key and value:
#
# $$\begin{aligned}
#   \omega_{qi} &= x^{(q)} \cdot x^{(i)}, \\
#   \alpha_{qi} &= \frac{\exp \omega_{qi}}{\sum_j \exp \omega_{qj}}, \\
#   z^{(q)} &= \sum_i \alpha_{qi}\, x^{(i)}
# \end{aligned}$$
#
# The superscripts count tokens from 1, as the book prints them ($x^{(1)}$ is "Your"); the code
# counts rows from 0, so $x^{(i)}$ is `inputs[i - 1]`.

# %%
import matplotlib.pyplot as plt
import torch

from attention.derivation.simple import (
    EXAMPLE_TOKENS,
    example_inputs,
    simplified_self_attention,
)

inputs = example_inputs()  # (num_tokens, d_in) = (6, 3)
assert inputs.shape == (6, 3)
inputs

# %% [markdown]
# ## Exercise 3.1: one query, with loops
#
# For the query "starts" ($q = 3$ in the book's counting, row 2 here), compute the six
# scores $\omega_{3i}$ with a Python loop over the tokens, normalise them with a softmax, and
# form the context vector $z^{(3)}$ as a weighted sum, again with a loop.

# %%
# Solution
query = inputs[2]  # x^(3), "starts"; (d_in,)
attn_scores = torch.empty(inputs.shape[0])  # (num_tokens,)
for i, x_i in enumerate(inputs):
    attn_scores[i] = torch.dot(x_i, query)
attn_weights = torch.softmax(attn_scores, dim=0)  # (num_tokens,)
context_vec = torch.zeros(inputs.shape[1])  # (d_in,)
for i, x_i in enumerate(inputs):
    context_vec += attn_weights[i] * x_i
assert attn_weights.shape == (6,) and context_vec.shape == (3,)
attn_scores, attn_weights, context_vec

# %% [markdown]
# ## Exercise 3.2: all queries at once, as matrices
#
# Write the same computation for every query at once, $\Omega = X X^\top$,
# $A = \operatorname{softmax}(\Omega)$ row by row, $Z = A X$, and check that row 2 of your
# result is the context vector of exercise 3.1, and that both agree with
# `attention.derivation.simple.simplified_self_attention`.

# %%
# Solution
all_scores = inputs @ inputs.T  # (num_tokens, num_tokens)
all_weights = torch.softmax(all_scores, dim=-1)  # (num_tokens, num_tokens)
all_context_vecs = all_weights @ inputs  # (num_tokens, d_in)
assert all_weights.shape == (6, 6) and all_context_vecs.shape == (6, 3)

torch.testing.assert_close(all_context_vecs[2], context_vec)
library_context_vecs, library_weights = simplified_self_attention(inputs)
torch.testing.assert_close(all_weights, library_weights)
torch.testing.assert_close(all_context_vecs, library_context_vecs)
all_weights.sum(dim=-1)  # every row of weights sums to 1

# %% [markdown]
# ## Exercise 3.3: look at the weights
#
# Draw $A$ as a heatmap with the tokens on both axes. Which key does each query attend to
# most, and why do "journey" and "starts" attend to each other so strongly? (Hint: compare
# their rows of `inputs`, printed above.)


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
for token, row in zip(EXAMPLE_TOKENS, all_weights, strict=True):
    print(f"{token:>8} attends most to {EXAMPLE_TOKENS[int(row.argmax())]!r}")
fig, ax = plt.subplots(figsize=(5.5, 4.5), layout="constrained")
heatmap(ax, all_weights, EXAMPLE_TOKENS, "simplified attention weights A")
plt.show()
# Why: "journey" and "starts" have almost the same embedding, and both are
# long, so their dot product is about as large as each one's with itself.
journey, starts = inputs[1], inputs[2]
print(
    f"journey.starts {journey @ starts:.4f}, journey.journey "
    f"{journey @ journey:.4f}, starts.starts {starts @ starts:.4f}"
)
