# %% [markdown]
# # Exercise 1: attention between an encoder and a decoder
#
# Chapter 1: [Why attention?](../why-attention.md). On the site, every output below was computed
# by the site's build (the footer says which); the downloads (links above) start without
# outputs: run them and change them.
#
# At decoder step $t$, Bahdanau's attention scores every encoder state $h_i$ against the
# decoder's previous state $s_{t-1}$ and reads their weighted sum (the paper writes the scores
# $e_{t,i}$; this site writes every unnormalised score $\omega$, as in the
# [notation](../notation.md)):
#
# $$\begin{aligned}
#   \omega_{t,i} &= v^\top \tanh(W s_{t-1} + U h_i), \\
#   \alpha_{t,i} &= \frac{\exp \omega_{t,i}}{\sum_j \exp \omega_{t,j}}, \\
#   c_t &= \sum_i \alpha_{t,i} h_i
# \end{aligned}$$

# %%
import torch

from attention.lab.copy_task import VOCAB_SIZE, copy_batch
from attention.lab.rnn import AdditiveAttention, Seq2Seq

_ = torch.manual_seed(0)

# %% [markdown]
# ## Exercise 1.1: additive attention by hand
#
# For `attn = AdditiveAttention(hidden_size=4)`, a batch of 2 decoder states `s_prev` of shape
# `(2, 4)` and encoder states `enc_states` of shape `(2, 5, 4)`, compute $\omega$, $\alpha$ and
# $c$ yourself from the weights of `attn.W`, `attn.U` and `attn.v` (each an `nn.Linear` without
# bias: `layer(x)` is `x @ layer.weight.T`). Compare with `attn(s_prev, enc_states)`.

# %%
# Solution
attn = AdditiveAttention(hidden_size=4)
s_prev, enc_states = torch.randn(2, 4), torch.randn(2, 5, 4)
W, U, v = attn.W.weight, attn.U.weight, attn.v.weight  # (4, 4), (4, 4), (1, 4)
with torch.no_grad():
    # every decoder state against every encoder state: (2, 5, 4)
    hidden = torch.tanh((s_prev @ W.T)[:, None] + enc_states @ U.T)
    omega = (hidden @ v.T).squeeze(-1)  # (2, 5): one score per encoder state
    alpha = torch.softmax(omega, dim=-1)  # (2, 5)
    c = (alpha[:, :, None] * enc_states).sum(dim=1)  # (2, 4)
    c_module, alpha_module = attn(s_prev, enc_states)
torch.testing.assert_close(alpha, alpha_module)
torch.testing.assert_close(c, c_module)
print("weights of sequence 0:", alpha[0])

# %% [markdown]
# ## Exercise 1.2: a soft lookup
#
# Attention reads *one* encoder state when its score stands far above the others. Use the
# dot product as the score instead (as the chapters after this one do): for 6 random encoder
# states $h_i$ of width 8 and the query $q = \beta h_3$ (counted from 0: `h[3]`), compute
# $\alpha = \operatorname{softmax}(h_i \cdot q)$ for $\beta$ = 0, 0.5, 2 and 8. What does
# $\beta = 0$ give, and where does the weight go as $\beta$ grows?

# %%
# Solution
h = torch.randn(6, 8)  # six encoder states
for beta in (0.0, 0.5, 2.0, 8.0):
    alpha = torch.softmax(h @ (beta * h[3]), dim=0)  # (6,)
    print(f"beta {beta:>3}: " + " ".join(f"{a:.2f}" for a in alpha.tolist()))
# beta 0: every score is 0, so the weights are uniform, 1/6 each. As beta
# grows, the state with the largest dot product with q takes nearly all: here
# h_3 itself, since its score, its squared length, is the largest of the six.
assert int(alpha.argmax()) == 3 and alpha[3] > 0.99

# %% [markdown]
# ## Exercise 1.3: the bottleneck in numbers
#
# `Seq2Seq.encode(src)` returns every encoder state and the final one. The plain decoder reads
# only the final state; the attention decoder may read all of them. For inputs of the copy
# task (`copy_batch`) of 4, 16 and 64 tokens, print how many numbers each decoder can read
# about the input, and check the shapes with a model of the default size.

# %%
# Solution
model = Seq2Seq(vocab_size=VOCAB_SIZE, attention=True)
generator = torch.Generator().manual_seed(0)
for n in (4, 16, 64):
    src, _ = copy_batch(
        batch_size=1, seq_len=n, vocab_size=VOCAB_SIZE, generator=generator
    )
    with torch.no_grad():
        enc_states, h_n = model.encode(src)  # (1, n, H), (1, H)
    assert enc_states.shape[1] == n and torch.equal(h_n, enc_states[:, -1])
    print(
        f"{n:>2} tokens: plain reads {h_n.numel()} numbers, "
        f"attention up to {enc_states.numel()}"
    )
# The plain decoder gets H numbers however long the input is; the attention
# decoder's share grows with n, one state per input token.
