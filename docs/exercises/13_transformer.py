# %% [markdown]
# # Exercise 13: the transformer block
#
# Chapter 13: [The transformer block](../transformer.md). On the site, every output below was
# computed by the site's build (the footer says which); the downloads (links above) start
# without outputs: run them and change them.
#
# A block is $x \leftarrow x + \operatorname{Attention}(\operatorname{LN}_1(x))$, then
# $x \leftarrow x + \operatorname{FF}(\operatorname{LN}_2(x))$: a norm before each branch, and a
# shortcut around it.

# %%
import torch
from torch import nn

from attention.model.gpt import GPT_CONFIG_124M, LayerNorm, TransformerBlock
from attention.model.llama_block import LlamaBlock

_ = torch.manual_seed(0)

# %% [markdown]
# ## Exercise 13.1: layer normalisation by hand
#
# For `x = 3 * torch.randn(4, 7, 16) + 5` and a `LayerNorm(16)` whose `scale` and `shift` you
# set to random values, compute
# $\gamma \odot (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$ yourself over the last
# dimension and check it against the module. Which variance does the module use: the one
# that divides by $d$, or by $d - 1$ (`unbiased=True`, torch's default)? How far apart are the
# two results?

# %%
# Solution
x = 3 * torch.randn(4, 7, 16) + 5  # (4, 7, 16)
ln = LayerNorm(16)
with torch.no_grad():
    ln.scale.uniform_(0.5, 2.0)  # gamma
    ln.shift.uniform_(-1.0, 1.0)  # beta
mean = x.mean(dim=-1, keepdim=True)  # (4, 7, 1): one mean per token
for unbiased in (False, True):
    var = x.var(dim=-1, keepdim=True, unbiased=unbiased)  # (4, 7, 1)
    by_hand = ln.scale * (x - mean) / torch.sqrt(var + ln.eps) + ln.shift
    gap = (by_hand - ln(x)).abs().max().item()
    print(f"unbiased={unbiased}: largest difference from the module {gap:.2e}")
    if not unbiased:
        torch.testing.assert_close(by_hand, ln(x))  # the 1/d variance: GPT-2's

# %% [markdown]
# ## Exercise 13.2: where the parameters are
#
# With `qkv_bias=False`, count by hand the parameters of one block of width $d$: the
# attention's four $d \times d$ projections (only `out_proj` has a bias), the feed-forward
# network's $d \to 4d \to d$ (with biases), and two norms. Check your formula against
# `TransformerBlock`, then use it for the whole model (token and position embeddings,
# $L$ blocks, the final norm, the output layer) and check it against the book's 163,009,536
# for GPT-2 small. What do GPT-2 medium ($d = 1024$, $L = 24$), large ($1280$, $36$) and XL
# ($1600$, $48$) come to, with the output layer tied to the token embedding? These are the
# book's configuration, `qkv_bias=False`; OpenAI's GPT-2 has biases on the query, key and
# value projections (`qkv_bias=True`, as `gpt2_config` sets): count those too.


# %%
# Solution
def block_params(d: int, qkv_bias: bool = False) -> int:
    attention = 4 * d * d + d  # W_query, W_key, W_value, out_proj (+ its bias)
    if qkv_bias:  # the biases of W_query, W_key, W_value
        attention += 3 * d
    feed_forward = (d * 4 * d + 4 * d) + (4 * d * d + d)  # d -> 4d -> d
    norms = 2 * 2 * d  # scale and shift, twice
    return attention + feed_forward + norms  # 12 d^2 + 10 d


def model_params(cfg: dict, tied: bool = False) -> int:
    d, vocab = cfg["emb_dim"], cfg["vocab_size"]
    embeddings = vocab * d + cfg["context_length"] * d
    head = 0 if tied else vocab * d
    blocks = cfg["n_layers"] * block_params(d, cfg["qkv_bias"])
    return embeddings + blocks + 2 * d + head


for d, heads in ((768, 12), (1024, 16)):
    for bias in (False, True):
        cfg = {**GPT_CONFIG_124M, "emb_dim": d, "n_heads": heads}
        block = TransformerBlock({**cfg, "qkv_bias": bias})
        counted = sum(p.numel() for p in block.parameters())
        assert counted == block_params(d, bias)
assert model_params(GPT_CONFIG_124M) == 163_009_536
assert model_params(GPT_CONFIG_124M, tied=True) == 124_412_160
sizes = {
    "small": (768, 12),
    "medium": (1024, 24),
    "large": (1280, 36),
    "XL": (1600, 48),
}
print("tied output layer: the book's configuration | GPT-2's (QKV bias)")
for name, (d, n_layers) in sizes.items():
    cfg = {**GPT_CONFIG_124M, "emb_dim": d, "n_layers": n_layers}
    book = model_params(cfg, tied=True)
    gpt2 = model_params({**cfg, "qkv_bias": True}, tied=True)
    in_blocks = n_layers * block_params(d) / book
    print(
        f"GPT-2 {name:<6}: {book:>13,} | {gpt2:>13,} parameters, "
        f"{in_blocks:.0%} of them in the blocks"
    )

# %% [markdown]
# ## Exercise 13.3: twelve blocks without their shortcuts
#
# Stack 12 `TransformerBlock`s of a small configuration (`emb_dim=64`, `n_heads=4`,
# `context_length=16`, `drop_rate=0.0`, `qkv_bias=False`). Run an input `x` of shape
# `(1, 8, 64)` (with `requires_grad=True`) through them twice: once with the blocks as they
# are, once without the shortcuts, `x = ff(norm2(att(norm1(x))))` with each block's own parts.
# Backpropagate `h.square().mean()` each time and compare the norm of the gradient that
# reaches `x`, and of the first block's `att.W_query.weight`. What do the shortcuts change?

# %%
# Solution
cfg = {"vocab_size": 100, "context_length": 16, "emb_dim": 64, "n_heads": 4,
       "n_layers": 12, "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
torch.manual_seed(0)
blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(12))


def without_shortcut(block: TransformerBlock, h: torch.Tensor) -> torch.Tensor:
    h = block.att(block.norm1(h))  # no "+ h"
    return block.ff(block.norm2(h))  # no "+ h"


gradients = {}
for shortcuts in (True, False):
    blocks.zero_grad()
    x = torch.randn(
        1,
        8,
        64,
        generator=torch.Generator().manual_seed(1),
        requires_grad=True,
    )
    h = x
    for block in blocks:
        h = block(h) if shortcuts else without_shortcut(block, h)  # (1, 8, 64)
    h.square().mean().backward()
    first = blocks[0].att.W_query.weight.grad
    assert x.grad is not None and first is not None
    gradients[shortcuts] = (float(x.grad.norm()), float(first.norm()))
    print(
        f"shortcuts={shortcuts!s:<5}: "
        f"|grad x| = {gradients[shortcuts][0]:.2e}, "
        f"|grad W_query of block 0| = {gradients[shortcuts][1]:.2e}"
    )
assert gradients[True][0] > 10 * gradients[False][0]
assert gradients[True][1] > 10 * gradients[False][1]
# With the shortcuts, the gradient reaches the input and the first block
# through every block's identity path. Without them it must pass through
# each block's attention and feed-forward maps, and it shrinks on the way:
# the vanishing gradient that residual connections prevent.

# %% [markdown]
# ## Exercise 13.4: a Llama block by hand
#
# Build one Llama block of the package (`attention.model.llama_block.LlamaBlock`, the block
# `attention.from_hf` gives a Llama checkpoint), then write its computation out of its parts:
# $h = x + \operatorname{Attention}(\operatorname{RMSNorm}_1(x))$, then
# $h + W_d\,(\operatorname{SiLU}(W_g\, n) \odot W_u\, n)$ with
# $n = \operatorname{RMSNorm}_2(h)$, the norm $x / \sqrt{\operatorname{mean}(x^2) +
# \epsilon} \cdot g$ written out too. Compare with the block's forward.

# %%
# Solution
cfg = {"emb_dim": 64, "hidden_dim": 96, "context_length": 64, "norm_eps": 1e-6}
block = LlamaBlock(
    cfg, {"num_heads": 4, "num_kv_heads": 2, "rope": True, "qkv_bias": False}
)
with torch.no_grad():  # random gains, so that the norm's gain is checked too
    for norm in (block.norm1, block.norm2):
        assert norm is not None
        norm.weight.uniform_(0.5, 1.5)


def rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg["norm_eps"])
    return x / rms * gain


x = torch.randn(1, 5, 64)
with torch.no_grad():
    assert block.norm1 is not None and block.norm2 is not None
    h = x + block.att(rms_norm(x, block.norm1.weight))  # (1, 5, 64)
    n = rms_norm(h, block.norm2.weight)
    ff = block.ff
    gated = nn.functional.silu(n @ ff.gate_proj.weight.T) * (
        n @ ff.up_proj.weight.T
    )  # (1, 5, 96)
    by_hand = h + gated @ ff.down_proj.weight.T
    torch.testing.assert_close(by_hand, block(x), atol=1e-5, rtol=0)
print("x + Attention(RMSNorm(x)), then + SwiGLU(RMSNorm(.)): the block")

# %% [markdown]
# ## Exercise 13.5: a mixture of experts, held and read
#
# Build `attention.model.experts.MixtureOfExperts(64, 96, num_experts=8, top_k=2)` (the
# chapter's section on experts). For one token $x$, write its output by hand: the router's
# $p = \operatorname{softmax}(W_r x)$, the two largest $p_e$, their weights divided by their
# sum, and $\sum_e w_e\, W_{d,e}(\operatorname{SiLU}(W_{g,e} x) \odot W_{u,e} x)$ (each
# expert's $W_g$ and $W_u$ are the two halves of its `experts.gate_up_proj[e]`). Then count
# the experts' weights the layer holds and those one token reads, and do the same sum for
# Mixtral 8x7B: 32 layers of 8 experts, 2 per token, width 4096, experts 14,336 wide.

# %%
# Solution
from attention.model.experts import MixtureOfExperts  # noqa: E402

moe = MixtureOfExperts(64, 96, num_experts=8, top_k=2)
x = torch.randn(1, 1, 64)
token = x[0, 0]  # (64,)
with torch.no_grad():
    p = torch.softmax(moe.gate.weight @ token, dim=0)  # (8,)
    top = p.topk(2)
    w = top.values / top.values.sum()  # normalize=True, the default
    by_hand = torch.zeros(64)
    for weight, e in zip(w, top.indices.tolist(), strict=True):
        g, u = (moe.experts.gate_up_proj[e] @ token).chunk(2)  # (96,) each
        by_hand += weight * (
            moe.experts.down_proj[e] @ (nn.functional.silu(g) * u)
        )
    torch.testing.assert_close(by_hand, moe(x)[0, 0], atol=1e-5, rtol=0)
held = sum(
    p.numel() for p in moe.experts.parameters()
)  # 8 experts x 3 x 64 x 96
chosen = sorted(top.indices.tolist())
read = held * moe.top_k // moe.num_experts  # 2 of 8
print(f"experts chosen: {chosen}; held {held:,}, read {read:,}")
mixtral = (
    32 * 8 * 3 * 4096 * 14336
)  # layers x experts x (W_g, W_u, W_d) x D x H
print(
    f"Mixtral 8x7B's experts: {mixtral / 1e9:.1f} B held, "
    f"{mixtral * 2 / 8 / 1e9:.1f} B read per token"
)
