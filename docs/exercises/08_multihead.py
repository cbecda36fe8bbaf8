# %% [markdown]
# # Exercise 8: multi-head attention
#
# Chapter 8: [Multi-head attention](../multihead.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# $h$ heads of width $d_h$, each attending on its own, concatenated and projected:
#
# $$\begin{aligned}
#   \operatorname{head}_i &= \operatorname{softmax}\!\left(
#   \frac{Q_i K_i^\top}{\sqrt{d_h}} + M\right) V_i, \\
#   Q_i &= X W_q^{(i)}, \quad K_i = X W_k^{(i)}, \\
#   V_i &= X W_v^{(i)},
# \end{aligned}$$
#
# $$\begin{aligned}
#   & \operatorname{MultiHead}(X) \\
#   & \quad = [\operatorname{head}_0; \dots; \operatorname{head}_{h-1}]\, W_o
# \end{aligned}$$

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from attention import MultiHeadAttention, MultiHeadAttentionWrapper
from attention.derivation.simple import EXAMPLE_TOKENS, example_inputs
from attention.lab.copy_task import token_letters
from attention.lab.threads import torch_threads
from attention.lab.training import (
    TinyAttentionModel,
    first_token_weight,
    head_weights,
    previous_and_first,
    previous_token_weight,
)

inputs = example_inputs()  # (num_tokens, d_in) = (6, 3)
batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)

# %% [markdown]
# ## Exercise 8.1: from three heads to one fused module, by hand
#
# Build `MultiHeadAttentionWrapper(d_in=3, d_out=2, context_length=6, dropout=0.0,
# num_heads=3)` (seed 123). How wide is its output? Build the `MultiHeadAttention` that computes
# the same thing **without** `from_wrapper`: choose its `d_out`, copy the heads' weight
# matrices into its `W_query`, `W_key`, `W_value` and make `out_proj` the identity. Check your module against
# the wrapper and against `MultiHeadAttention.from_wrapper`.

# %%
# Solution
torch.manual_seed(123)
wrapper = MultiHeadAttentionWrapper(
    d_in=3,
    d_out=2,
    context_length=6,
    dropout=0.0,
    num_heads=3,
)
width = wrapper(batch).shape[-1]  # d_out per head x num_heads
assert width == 2 * 3

mine = MultiHeadAttention(
    d_in=3,
    d_out=width,
    context_length=6,
    dropout=0.0,
    num_heads=3,
)
with torch.no_grad():
    for name in ("W_query", "W_key", "W_value"):
        per_head = [getattr(head, name).weight for head in wrapper.heads]
        stacked = torch.cat(per_head)  # 3 x (2, 3) -> (6, 3)
        getattr(mine, name).weight.copy_(stacked)
    mine.out_proj.weight.copy_(torch.eye(width))  # (6, 6)
    mine.out_proj.bias.zero_()  # (6,)

    torch.testing.assert_close(mine(batch), wrapper(batch))
    fused = MultiHeadAttention.from_wrapper(wrapper)
    torch.testing.assert_close(mine(batch), fused(batch))
print(
    f"wrapper width {width} == MultiHeadAttention(d_out={width}, num_heads=3)"
)

# %% [markdown]
# ## Exercise 8.2: split and merge heads
#
# Write `split_heads(t, num_heads)` taking `(b, T, d_out)` to `(b, h, T, d_h)` and
# `merge_heads(t)` doing the reverse. Check that `merge_heads(split_heads(t))` gives `t` back,
# that head `i` holds columns `i * d_h` to `(i + 1) * d_h` of `t`, and that the one-step
# `t.view(b, h, T, d_h)` does not.


# %%
# Solution
def split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(b, T, d_out) -> (b, h, T, d_h)."""
    b, num_tokens, d_out = t.shape
    t = t.view(b, num_tokens, num_heads, d_out // num_heads)  # (b, T, h, d_h)
    return t.transpose(1, 2)  # (b, h, T, d_h)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """(b, h, T, d_h) -> (b, T, h * d_h)."""
    b, h, num_tokens, d_h = t.shape
    t = t.transpose(1, 2)  # (b, T, h, d_h)
    # reshape, not view: after the transpose t is not contiguous
    return t.reshape(b, num_tokens, h * d_h)  # (b, T, d_out)


t = torch.randn(2, 6, 12)  # (b, T, d_out)
heads = split_heads(t, num_heads=3)  # (2, 3, 6, 4)
assert heads.shape == (2, 3, 6, 4)
assert torch.equal(merge_heads(heads), t)
for i in range(3):
    assert torch.equal(heads[:, i], t[:, :, 4 * i : 4 * (i + 1)])
wrong = t.view(2, 3, 6, 4)  # same shape, wrong numbers
assert not torch.equal(wrong[:, 0], t[:, :, 0:4])
print(
    "split/merge round trip OK; view straight to (b, h, T, d_h) mixes tokens"
)

# %% [markdown]
# ## Exercise 8.3: look at every head
#
# Build `MultiHeadAttention(d_in=3, d_out=8, context_length=6, dropout=0.0, num_heads=4)`
# (seed 123) and get its attention weights with `need_weights=True`. Check their shape, that every row
# sums to 1 and that nothing above the diagonal is non-zero, then draw one heatmap per head
# for the first sequence.


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
torch.manual_seed(123)
mha = MultiHeadAttention(
    d_in=3,
    d_out=8,
    context_length=6,
    dropout=0.0,
    num_heads=4,
)
with torch.no_grad():
    _, attn_weights = mha(batch, need_weights=True)  # (2, 4, 6, 6)
assert attn_weights.shape == (2, 4, 6, 6)
torch.testing.assert_close(attn_weights.sum(dim=-1), torch.ones(2, 4, 6))
assert (attn_weights.triu(diagonal=1) == 0).all()
for i in range(mha.num_heads):  # one figure each: readable on a phone too
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    heatmap(ax, attn_weights[0, i], EXAMPLE_TOKENS, f"head {i}")
    plt.show()

# %% [markdown]
# ## Exercise 8.4: one head for two jobs
#
# The chapter trains a `TinyAttentionModel` with two heads on `previous_and_first`: every
# position outputs the previous token and the first token, and each head learns to read one of
# them. Give the model a single head of the same total width (`d_model=16, num_heads=1`) and
# train it with the chapter's loop (seed 0, data seed 0, Adam with `lr=0.01`, 201 batches of
# 64 sequences of 8 letters from 8). Compare its cross-entropy on 256 fresh sequences (data
# seed 1) with the two-head model's, and measure where its one head puts its weight. Why can
# one softmax row not do what two did?

# %%
# Solution
V, T = 8, 8
fresh, fresh_targets = previous_and_first(
    256, T, V, generator=torch.Generator().manual_seed(1)
)


def train(num_heads: int) -> TinyAttentionModel:
    """The chapter's loop: seed 0, 201 steps of Adam on batches of 64."""
    torch.manual_seed(0)
    model = TinyAttentionModel(
        vocab_size=V, context_length=T, d_model=16, num_heads=num_heads
    )
    data = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    with torch_threads(1):
        for _ in range(201):
            idx, targets = previous_and_first(64, T, V, generator=data)
            loss = F.cross_entropy(
                model(idx)[:, 1:].reshape(-1, V), targets.reshape(-1)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


def fresh_loss(model: TinyAttentionModel) -> float:
    with torch.no_grad():
        logits = model(fresh)[:, 1:]  # (256, T - 1, 2, V)
    return F.cross_entropy(
        logits.reshape(-1, V), fresh_targets.reshape(-1)
    ).item()


one, two = train(num_heads=1), train(num_heads=2)
weights = head_weights(one, fresh)  # (256, 1, T, T)
prev, first = previous_token_weight(weights)[0], first_token_weight(weights)[0]
print(
    f"loss on fresh sequences: one head {fresh_loss(one):.3f}, "
    f"two heads {fresh_loss(two):.3f}"
)
print(
    f"the one head: {prev:.2f} on the previous token, {first:.2f} on the first"
)
assert fresh_loss(one) > 10 * fresh_loss(two)
assert prev > 0.3 and first > 0.3  # it splits its weight between the two keys
letters = token_letters(fresh[0])
fig, ax = plt.subplots(figsize=(5.5, 4.5), layout="constrained")
heatmap(ax, weights[0, 0], letters, "one head", vmin=0, vmax=1)
plt.show()

# %% [markdown]
# One head's softmax row sums to 1, so it splits its weight between the two keys it needs and
# returns a blend of the two tokens' values: the readout must then tell from one blended vector
# which token was the previous and which the first, which it can do only in part, from how
# unevenly the blend is weighted. Two heads each return one unblended token, side by side.
