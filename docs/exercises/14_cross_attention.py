# %% [markdown]
# # Exercise 14: cross-attention
#
# Chapter 14: [Cross-attention](../cross-attention.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# Cross-attention takes its queries from the decoder and its keys and values from the
# encoder's output, the memory $X_\text{enc}$: $Q = X_\text{dec} W_q$,
# $K = X_\text{enc} W_k$, $V = X_\text{enc} W_v$, with no causal mask between the two
# sequences.

# %%
import torch
import torch.nn.functional as F

from attention import MultiHeadAttention
from attention.lab.copy_task import VOCAB_SIZE, copy_batch
from attention.lab.rnn import decoder_inputs
from attention.lab.seq2seq import Seq2SeqTransformer

_ = torch.manual_seed(0)

# %% [markdown]
# ## Exercise 14.1: a memory of another width, with padding
#
# The memory need not be as wide as the decoder: `kdim` and `vdim` set the widths keys and
# values are projected from. For
# `cross = MultiHeadAttention(16, 16, context_length=8, dropout=0.0, num_heads=4,
# causal=False, kdim=10, vdim=10)`, a decoder input `x` of shape `(2, 3, 16)`, a memory of
# shape `(2, 6, 10)` and a padding mask whose second row has only 4 real tokens, compute the
# output by hand: project, split into 4 heads of 4, set the scores of padded keys to $-\infty$
# before the softmax, merge the heads and apply `out_proj`. Check it against
# `cross(x, padding, key=memory)`.

# %%
# Solution
cross = MultiHeadAttention(
    16,
    16,
    context_length=8,
    dropout=0.0,
    num_heads=4,
    causal=False,
    kdim=10,
    vdim=10,
)
x = torch.randn(2, 3, 16)  # (batch, m, d_in)
memory = torch.randn(2, 6, 10)  # (batch, n, kdim)
padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # (batch, n)


def heads(t: torch.Tensor) -> torch.Tensor:  # (2, T, 16) -> (2, 4, T, 4)
    return t.view(2, -1, 4, 4).transpose(1, 2)


with torch.no_grad():
    Q, K, V = (
        heads(cross.W_query(x)),
        heads(cross.W_key(memory)),
        heads(cross.W_value(memory)),
    )
    scores = Q @ K.transpose(-2, -1) / 4**0.5  # (2, 4, m, n)
    scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
    Z = torch.softmax(scores, dim=-1) @ V  # (2, 4, m, 4)
    by_hand = cross.out_proj(Z.transpose(1, 2).reshape(2, 3, 16))
    torch.testing.assert_close(
        by_hand, cross(x, padding, key=memory), atol=1e-6, rtol=0
    )
print(
    "by hand == the module, with a 10-wide memory and padding:",
    tuple(by_hand.shape),
)

# %% [markdown]
# ## Exercise 14.2: what the cross-attention cache saves
#
# A decoder of $L$ blocks writes $m$ tokens for an input of $n$ tokens. Without a cache, every
# step projects the whole memory again in every block; with one, each block projects it once.
# Predict how many memory rows `W_key` projects in all, both ways, for
# `Seq2SeqTransformer(20, d_model=16, num_heads=2, num_layers=3)`, $n = 10$ and $m = 6$; then
# count them with forward hooks on every block's `cross_att.W_key` and check.

# %%
# Solution
model = Seq2SeqTransformer(20, d_model=16, num_heads=2, num_layers=3).eval()
src = torch.randint(0, VOCAB_SIZE, (1, 10))
L, n, m = 3, 10, 6
rows = []
hooks = [block.cross_att.W_key.register_forward_hook(
    lambda module, inputs, output: rows.append(inputs[0].shape[1]))
    for block in model.decoder]  # fmt: skip
counts = {}
for use_cache in (True, False):
    rows.clear()
    model.generate(src, out_len=m, use_cache=use_cache)
    counts[use_cache] = sum(rows)
for hook in hooks:
    hook.remove()
assert counts[True] == L * n  # once per block
assert counts[False] == L * m * n  # every block, every step
print(
    f"rows projected by W_key: cached {counts[True]}, uncached {counts[False]}"
)

# %% [markdown]
# ## Exercise 14.3: reverse instead of copy
#
# Train `Seq2SeqTransformer(VOCAB_SIZE, d_model=32, num_heads=2)` to write its input
# backwards: for sequences of 8 tokens from `copy_batch`, the target is `src.flip(1)`. Use
# teacher forcing (`decoder_inputs(tgt, model.bos)`), Adam at `lr=1e-2`, batches of 128, 120
# steps. Check that greedy decoding reverses fresh sequences, and that the cross-attention
# weights now follow the *anti*-diagonal: output step $t$ reads input position $n - 1 - t$
# (both counted from 0).

# %%
# Solution
torch.manual_seed(0)
model = Seq2SeqTransformer(VOCAB_SIZE, d_model=32, num_heads=2)
generator = torch.Generator().manual_seed(0)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(120):
    src, _ = copy_batch(128, 8, VOCAB_SIZE, generator)  # (128, 8)
    tgt = src.flip(1)  # the input backwards
    logits, _ = model(src, decoder_inputs(tgt, model.bos))  # (128, 8, V)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
model.eval()
src, _ = copy_batch(256, 8, VOCAB_SIZE, generator)
accuracy = (model.generate(src) == src.flip(1)).float().mean().item()
with torch.no_grad():
    _, weights = model(
        src[:1], decoder_inputs(src[:1].flip(1), model.bos), need_weights=True
    )
reads = weights[0][0].argmax(-1)  # (heads, m): where each head looks hardest
anti_diagonal = torch.arange(src.shape[1]).flip(0)  # step t reads n - 1 - t
on_it = (reads == anti_diagonal).float().mean().item()
print(f"token accuracy reversing: {accuracy:.2f}")
print(f"steps whose heaviest weight is on the anti-diagonal: {on_it:.0%}")
assert accuracy > 0.9 and on_it > 0.5
