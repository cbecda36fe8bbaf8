# %% [markdown]
# # Exercise 9: the production module
#
# Chapter 9: [The production module](../production.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# The module's default call projects, splits heads, runs PyTorch's fused kernel and projects
# again:
#
# $$\begin{aligned}
#   & \operatorname{MultiHead}(X) \\
#   & \quad = [\operatorname{head}_0; \dots; \operatorname{head}_{h-1}]\, W_o
# \end{aligned}$$
#
# $$\operatorname{head}_i = \operatorname{softmax}\!\left(
#   \frac{Q_i K_i^\top}{\sqrt{d_h}} + M\right) V_i$$

# %%
import torch
import torch.nn.functional as F

from attention import MultiHeadAttention, causal_mask

torch.manual_seed(0)
x = torch.randn(2, 6, 8)  # (batch, num_tokens, d_in)

# %% [markdown]
# ## Exercise 9.1: the core path by hand
#
# For `mha = MultiHeadAttention(8, 8, context_length=6, dropout=0.0, num_heads=2,
# qkv_bias=True)`, compute `mha(x)` yourself: the three projections, a split into
# `(batch, heads, tokens, head_dim)`, `F.scaled_dot_product_attention(..., is_causal=True)`,
# the merge and `out_proj`.

# %%
# Solution
mha = MultiHeadAttention(
    8, 8, context_length=6, dropout=0.0, num_heads=2, qkv_bias=True
)


def split(t: torch.Tensor) -> torch.Tensor:  # (b, T, 8) -> (b, 2, T, 4)
    return t.view(2, 6, 2, 4).transpose(1, 2)


with torch.no_grad():
    q, k, v = split(mha.W_query(x)), split(mha.W_key(x)), split(mha.W_value(x))
    # (batch, heads, T, d_h) = (2, 2, 6, 4)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mine = mha.out_proj(heads.transpose(1, 2).reshape(2, 6, 8))  # (2, 6, 8)
    torch.testing.assert_close(mine, mha(x))
print("by hand == mha(x)")

# %% [markdown]
# ## Exercise 9.2: left padding changes nothing
#
# Put the first sequence's first 4 tokens behind 2 filler tokens, filled with NaN, as the
# batch's second row, and run
# the batch with a `key_padding_mask` (True = padding). Check that the 4 real tokens get what
# they get alone, and that the filler's outputs are `out_proj`'s bias.

# %%
# Solution
short = x[0, :4]  # (4, 8)
filler = torch.full((2, 8), float("nan"))
padded = torch.stack((x[1], torch.cat((filler, short))))  # (2, 6, 8)
padding = torch.tensor([[False] * 6, [True] * 2 + [False] * 4])  # (2, 6)
with torch.no_grad():
    out = mha(padded, key_padding_mask=padding)  # (2, 6, 8)
    alone = mha(short[None])  # (1, 4, 8)
torch.testing.assert_close(out[1, 2:], alone[0])
torch.testing.assert_close(out[1, :2], mha.out_proj.bias.expand(2, -1))
assert not out.isnan().any()
print("left-padded, NaN filler: the real tokens as alone, the filler gets b_o")

# %% [markdown]
# ## Exercise 9.3: the same module in PyTorch's layout
#
# `torch.nn.MultiheadAttention(8, 2, batch_first=True)` keeps the three input projections
# stacked in one `in_proj_weight` of shape `(3 * 8, 8)` (queries, keys, values) and one
# `in_proj_bias`. Copy `mha`'s weights into it yourself (not with `to_torch_mha`) and check
# that, with `attn_mask=~causal_mask(6)` (its bool mask is True where hidden), both give the
# same outputs and per-head weights.

# %%
# Solution
theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True)
with torch.no_grad():
    projections = (mha.W_query, mha.W_key, mha.W_value)
    # the three stacked: (24, 8) and (24,)
    theirs.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
    theirs.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
    theirs.out_proj.load_state_dict(mha.out_proj.state_dict())
    out_theirs, w_theirs = theirs(
        x, x, x, attn_mask=~causal_mask(6), average_attn_weights=False
    )
    out_ours, w_ours = mha(x, need_weights=True)
torch.testing.assert_close(out_ours, out_theirs)
torch.testing.assert_close(w_ours, w_theirs)
print("nn.MultiheadAttention with our weights: the same outputs and weights")
