# %% [markdown]
# # Exercise 20: linear attention and the delta rule
#
# Chapter 20: [Beyond softmax](../beyond-softmax.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# Linear attention keeps $S = \sum_s \phi(k_s) v_s^\top$ and $z = \sum_s \phi(k_s)$; the
# gated delta rule keeps $S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1}
# + \beta_t k_t v_t^\top$.

# %%
import torch
from torch.nn.functional import normalize

from attention.layer.delta import delta_recurrent
from attention.layer.linear import elu_plus_one, linear_recurrent
from attention.model.hybrid_shapes import HYBRID, cache_bytes

# %% [markdown]
# ## Exercise 20.1: the last output from the state
#
# For the queries, keys and values below, build $S$ and $z$ from $\phi(K)$ and $V$ with two
# matrix products (no loop), then the last token's output
# $S^\top \phi(q_T) / (z \cdot \phi(q_T))$. Compare with `linear_recurrent`'s last output
# and its state.

# %%
# Solution
torch.manual_seed(0)
q, k = torch.randn(1, 1, 12, 4).double(), torch.randn(1, 1, 12, 4).double()
v = torch.randn(1, 1, 12, 3).double()
fk, fq = elu_plus_one(k[0, 0]), elu_plus_one(q[0, 0, -1])  # (12, 4), (4,)
S, z = fk.T @ v[0, 0], fk.sum(0)  # (4, 3), (4,)
last = S.T @ fq / (z @ fq)
out, state = linear_recurrent(q, k, v)
torch.testing.assert_close(last, out[0, 0, -1], atol=1e-12, rtol=0)
torch.testing.assert_close(S, state.S[0, 0], atol=1e-12, rtol=0)
print("last output from S and z == linear_recurrent")

# %% [markdown]
# ## Exercise 20.2: more associations than rows
#
# Store 4, then 8, then 16 associations $k_i \mapsto v_i$ under random unit keys in a state
# with $d_k = 8$ rows, once by adding (`linear_recurrent`, $\phi$ the identity, no
# normaliser) and once by the delta rule with $\beta = 1$. Then read every key back (run
# the keys once more as queries after the writes, with $\beta = 0$ and values 0) and print
# the mean distance between what is read and the value stored.


# %%
# Solution
def read_back(n: int, d_k: int = 8) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(n)
    keys = normalize(torch.randn(1, 1, n, d_k, generator=gen).double(), dim=-1)
    values = torch.randn(1, 1, n, 4, generator=gen).double()
    k2 = torch.cat([keys, keys], dim=2)  # write all, then read all
    v2 = torch.cat([values, torch.zeros_like(values)], dim=2)
    beta = torch.cat([torch.ones(1, 1, n), torch.zeros(1, 1, n)], dim=2)
    add, _ = linear_recurrent(
        k2, k2, v2, feature_map=lambda x: x, normalize=False
    )
    edit, _ = delta_recurrent(k2, k2, v2, beta.double())
    error = [
        (o[:, :, n:] - values).norm(dim=-1).mean().item() for o in (add, edit)
    ]
    return error[0], error[1]


for n in (4, 8, 16):
    add, edit = read_back(n)
    print(f"{n:>2} associations: adding {add:.2f}, delta rule {edit:.2f}")

# %% [markdown]
# ## Exercise 20.3: where the hybrid keeps half
#
# Qwen3-Next-80B-A3B keeps a fixed state $F$ in its 36 Gated DeltaNet layers and $p$ bytes
# per token in each of its 12 softmax layers. Solve $F + 12 T p = \frac{1}{2} \cdot 48 T p$
# for $T$, then check with `cache_bytes`.

# %%
# Solution
qwen = HYBRID["Qwen3-Next-80B-A3B"]
fixed = cache_bytes(qwen, 0)
p = cache_bytes(qwen, 1, all_softmax=True) // qwen.num_layers
half, softmax = qwen.num_layers / 2, qwen.full_layers  # 24 and 12
T = fixed / ((half - softmax) * p)  # F + 12 T p = 24 T p
hybrid = cache_bytes(qwen, round(T))
full = cache_bytes(qwen, round(T), all_softmax=True)
print(f"T = {T:,.0f} tokens: hybrid / all softmax = {hybrid / full:.3f}")
