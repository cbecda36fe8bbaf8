# %% [markdown]
# # Exercise 16: scoring what a head does
#
# Chapter 16: [What trained heads do](../heads.md). On the site, every output below was computed
# by the site's build (the footer says which); the downloads (links above) start without
# outputs: run them and change them.
#
# A head's **previous-token score** is the mean weight each query puts on the token just
# before it; its **induction score** is the mean weight a query puts on the tokens that
# followed an earlier occurrence of its own token ($s \le t$ with $x_{s-1} = x_t$):
#
# $$\begin{aligned}
#   \text{prev} &= \frac{1}{T-1}\sum_{t=1}^{T-1} \alpha_{t,\,t-1}, \\
#   \text{ind} &= \operatorname*{mean}_{t \text{ seen before}}
#   \sum_{s \le t,\; x_{s-1} = x_t} \alpha_{t,s}
# \end{aligned}$$

# %%
import torch

from attention.lab.heads import (
    induction_score,
    model_weights,
    previous_token_score,
    repeated_tokens,
)
from attention.model.gpt import GPTModel

torch.manual_seed(0)
n = 8  # random tokens, then the same 8 again: T = 16
idx = repeated_tokens(batch_size=1, n=n, vocab_size=1000)  # (1, 16)
T = 2 * n

# %% [markdown]
# ## Exercise 16.1: the previous-token score by hand
#
# Build an untrained `GPTModel` (`vocab_size=1000, context_length=16, emb_dim=32, n_heads=4,
# n_layers=2, drop_rate=0.0, qkv_bias=False`), take its weights with `model_weights(model,
# idx)` (shape `(layers, batch, heads, T, T)`) and compute every head's previous-token score
# yourself. Compare with `previous_token_score`.

# %%
# Solution
cfg = {
    "vocab_size": 1000,
    "context_length": 16,
    "emb_dim": 32,
    "n_heads": 4,
    "n_layers": 2,
    "drop_rate": 0.0,
    "qkv_bias": False,
}
model = GPTModel(cfg).eval()
with torch.no_grad():
    weights = model_weights(model, idx)  # (2, 1, 4, 16, 16)
t = torch.arange(1, T)
# the mean over the batch and the queries: (layers, heads) = (2, 4)
mine = weights[..., t, t - 1].mean(dim=(-3, -1))
torch.testing.assert_close(mine, previous_token_score(weights))
print("previous-token scores, layer by head:\n", mine)

# %% [markdown]
# ## Exercise 16.2: two ideal heads
#
# Write the weights of two ideal heads for `idx`, as `(1, 1, T, T)` tensors: a
# *previous-token head* (query $t \ge 1$ reads $t - 1$, query 0 reads itself) and an
# *induction head* (a query in the second half, at $t \ge n$, reads $t - n + 1$, the token
# after its earlier occurrence; the others read token 0). Score both with both functions.
# Why does each score near 0 on the other's measure?

# %%
# Solution
previous = torch.zeros(T, T)
previous[0, 0] = 1.0
previous[t, t - 1] = 1.0
induction = torch.zeros(T, T)
induction[:n, 0] = 1.0  # the first half has nothing to look up
second = torch.arange(n, T)
induction[second, second - n + 1] = 1.0
for name, head in (("previous-token", previous), ("induction", induction)):
    w = head[None, None]  # (batch 1, head 1, T, T)
    print(
        f"{name:>14} head: previous-token score "
        f"{float(previous_token_score(w)):.2f}, "
        f"induction score {float(induction_score(w, idx)):.2f}"
    )
# The induction head reads t - n + 1, not t - 1 (its small previous-token score
# is query 1, which reads token 0 for lack of anything else); the
# previous-token head reads t - 1, which followed x_{t-2}, a different random
# token from x_t.

# %% [markdown]
# ## Exercise 16.3: the baseline of a head that looks nowhere in particular
#
# A head that spreads its weight evenly gives query $t$ the weight $1/(t+1)$ on each key it
# may see. Build those weights, compute both scores by hand from the formulas, and check them
# against the functions. A trained head is interesting only well above these numbers.

# %%
# Solution
# each query spreads its weight evenly over the keys it sees: (T, T)
uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
w = uniform[None, None]
prev_by_hand = (1 / (t + 1)).mean()  # alpha[t, t-1] = 1/(t+1), t = 1..T-1
# a repeated token at t >= n has one induction key (t - n + 1): weight 1/(t+1)
ind_by_hand = (1 / (second + 1)).mean()
torch.testing.assert_close(previous_token_score(w)[0], prev_by_hand)
torch.testing.assert_close(induction_score(w, idx)[0], ind_by_hand)
print(
    f"uniform head: previous-token {prev_by_hand:.3f}, "
    f"induction {ind_by_hand:.3f}"
)
