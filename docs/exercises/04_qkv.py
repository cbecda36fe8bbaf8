# %% [markdown]
# # Exercise 4: queries, keys and values
#
# Chapter 4: [Queries, keys and values](../qkv.md). On the site, every output below was computed
# by the site's build (the footer says which); the downloads (links above) start without
# outputs: run them and change them.
#
# Self-attention with trainable weight matrices projects each embedding three ways and
# attends with the scaled dot product:
#
# $$\begin{aligned}
#   Q &= X W_q, \quad K = X W_k, \quad V = X W_v, \\
#   Z &= \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V
# \end{aligned}$$

# %%
import torch
from torch import nn

from attention.derivation.core import explicit_attention
from attention.derivation.self_attention import (
    SelfAttentionV1,
    SelfAttentionV2,
)
from attention.derivation.simple import example_inputs

inputs = example_inputs()  # X: (num_tokens, d_in) = (6, 3)
d_in, d_out = 3, 2

# %% [markdown]
# ## Exercise 4.1: SelfAttentionV2 by hand
#
# Build `sa_v2 = SelfAttentionV2(d_in, d_out)` after `torch.manual_seed(789)`. Using only its
# three `.weight` tensors, `@` and `torch.softmax`, compute $Z$ yourself and check that it
# equals `sa_v2(inputs)`. Mind the orientation: `nn.Linear` stores $W^\top$, of shape
# `(d_out, d_in)`.

# %%
# Solution
torch.manual_seed(789)
sa_v2 = SelfAttentionV2(d_in, d_out)

# Q = X W_q: (6, 3) @ (3, 2) -> (6, 2)
queries = inputs @ sa_v2.W_query.weight.T  # (6, 2)
keys = inputs @ sa_v2.W_key.weight.T  # K: (6, 2)
values = inputs @ sa_v2.W_value.weight.T  # V: (6, 2)
d_k = keys.shape[-1]
attn_scores = queries @ keys.T  # (6, 6)
attn_weights = torch.softmax(attn_scores / d_k**0.5, dim=-1)
context_vecs = attn_weights @ values  # Z: (6, 6) @ (6, 2) -> (6, 2)

assert context_vecs.shape == (6, 2)
torch.testing.assert_close(context_vecs, sa_v2(inputs))
context_vecs.detach()  # without grad_fn: the numbers, as the book's

# %% [markdown]
# ## Exercise 4.2: the transplant, the other way round
#
# The chapter copies V2's weight matrices into V1. Do the opposite: build `sa_v1` after
# `torch.manual_seed(123)` and a fresh `sa_v2`, then copy V1's three matrices into V2's
# linear layers so that both modules return the same context vectors.

# %%
# Solution
torch.manual_seed(123)
sa_v1 = SelfAttentionV1(d_in, d_out)
sa_v2 = SelfAttentionV2(d_in, d_out)

with torch.no_grad():
    sa_v2.W_query.weight.copy_(sa_v1.W_query.T)  # (2, 3)
    sa_v2.W_key.weight.copy_(sa_v1.W_key.T)  # (2, 3)
    sa_v2.W_value.weight.copy_(sa_v1.W_value.T)  # (2, 3)

torch.testing.assert_close(sa_v1(inputs), sa_v2(inputs))
sa_v2(inputs).detach()

# %% [markdown]
# ## Exercise 4.3: a value width of your own
#
# With three `nn.Linear` layers (no bias), project the inputs to queries and keys of width
# $d_k = 2$ and to values of width $d_v = 4$, and attend with
# `attention.derivation.core.explicit_attention`. Check the shapes, then show that the
# *attention weights* do not depend on the value projection at all: re-initialise `W_value` and
# compare.

# %%
# Solution
torch.manual_seed(123)
d_k, d_v = 2, 4
W_query = nn.Linear(d_in, d_k, bias=False)
W_key = nn.Linear(d_in, d_k, bias=False)
W_value = nn.Linear(d_in, d_v, bias=False)

with torch.no_grad():
    queries, keys = W_query(inputs), W_key(inputs)  # (6, 2) each
    values = W_value(inputs)  # (6, 4)
    # Z: (6, 4), alpha: (6, 6)
    z, weights = explicit_attention(queries, keys, values)
    W_value.reset_parameters()  # new values, same queries and keys
    new_values = W_value(inputs)  # (6, 4)
    z_new, weights_new = explicit_attention(queries, keys, new_values)

assert z.shape == (6, d_v) and weights.shape == (6, 6)
# who attends to whom: unchanged; what they receive: changed
assert torch.equal(weights, weights_new)
assert not torch.allclose(z, z_new)
z.shape
