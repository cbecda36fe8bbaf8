r"""Chapter 4: self-attention with trainable query, key and value projections.

Each token now plays three roles through three learned matrices:

$$
\begin{aligned}
Q &= X W_q, \quad K = X W_k, \quad V = X W_v, \\
Z &= \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V.
\end{aligned}
$$

Queries and keys meet in a dot product, so they must share a width $d_k$; values are only
averaged, so $d_v$ is free. Here $d_k = d_v =$ `d_out`, as in the book.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention.checks import check_flag, check_input, check_size
from attention.derivation.core import attention_scores, explicit_attention

__all__ = ["SelfAttentionV1", "SelfAttentionV2", "SelfAttention_v1", "SelfAttention_v2"]


class SelfAttentionV1(nn.Module):
    r"""Self-attention with weight matrices as raw `nn.Parameter`s, initialised uniform in [0, 1).

    $$
    \begin{gathered}
    Z = \operatorname{softmax}\!\left(\frac{(X W_q)(X W_k)^\top}{\sqrt{d_k}}\right) X W_v, \\
    W_q, W_k, W_v \in \mathbb{R}^{d_\text{in} \times d_\text{out}}.
    \end{gathered}
    $$

    Args:
        d_in: width of each input embedding.
        d_out: width of queries, keys and values ($d_k = d_v = d_\text{out}$).

    Attributes:
        W_query: $W_q$, shape `(d_in, d_out)`; created first.
        W_key: $W_k$, shape `(d_in, d_out)`; created second.
        W_value: $W_v$, shape `(d_in, d_out)`; created third.

    Examples:
        >>> from attention.derivation.simple import example_inputs
        >>> inputs = example_inputs()  # (6, 3)
        >>> _ = torch.manual_seed(123)
        >>> sa_v1 = SelfAttentionV1(d_in=3, d_out=2)
        >>> context_vecs = sa_v1(inputs)
        >>> context_vecs.shape
        torch.Size([6, 2])
        >>> context_vecs[1]  # "journey"
        tensor([0.3061, 0.8210], grad_fn=<SelectBackward0>)
    """

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        check_size("d_in", d_in)
        check_size("d_out", d_out)
        self.d_in = d_in
        self.d_out = d_out
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:
        """Context vectors for `x` of shape `(num_tokens, d_in)` (or batched); `(..., d_out)`."""
        check_input(x, self.d_in, batched=False, like=self.W_query)
        keys = x @ self.W_key  # K = X W_k      (num_tokens, d_out)
        queries = x @ self.W_query  # Q = X W_q  (num_tokens, d_out)
        values = x @ self.W_value  # V = X W_v   (num_tokens, d_out)
        attn_scores = attention_scores(queries, keys)  # omega = Q K^T  (num_tokens, num_tokens)
        d_k = keys.shape[-1]
        attn_weights = torch.softmax(attn_scores / d_k**0.5, dim=-1)  # softmax(omega / sqrt(d_k))
        context_vec = attn_weights @ values  # Z = alpha V  (num_tokens, d_out)
        return context_vec


class SelfAttentionV2(nn.Module):
    r"""The same computation with `nn.Linear` projections.

    `nn.Linear(d_in, d_out, bias=False)` stores $W^\top$ and computes $x W$; it brings a
    better initialisation (uniform in $\pm 1/\sqrt{d_\text{in}}$ instead of $[0, 1)$, whose
    all-positive weights make every score large and the softmax peaky) and an optional bias.

    Args:
        d_in: width of each input embedding.
        d_out: width of queries, keys and values.
        qkv_bias: whether the three projections have a bias.

    Attributes:
        W_query: `nn.Linear(d_in, d_out)`; created first.
        W_key: `nn.Linear(d_in, d_out)`; created second.
        W_value: `nn.Linear(d_in, d_out)`; created third.

    Examples:
        >>> from attention.derivation.simple import example_inputs
        >>> _ = torch.manual_seed(789)
        >>> sa_v2 = SelfAttentionV2(d_in=3, d_out=2)
        >>> sa_v2(example_inputs())[0]
        tensor([-0.0739,  0.0713], grad_fn=<SelectBackward0>)
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        super().__init__()
        check_size("d_in", d_in)
        check_size("d_out", d_out)
        check_flag("qkv_bias", qkv_bias)
        self.d_in = d_in
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: Tensor) -> Tensor:
        """Context vectors for `x` of shape `(num_tokens, d_in)` (or batched); `(..., d_out)`."""
        check_input(x, self.d_in, batched=False, like=self.W_query.weight)
        keys = self.W_key(x)  # (num_tokens, d_out)
        queries = self.W_query(x)  # (num_tokens, d_out)
        values = self.W_value(x)  # (num_tokens, d_out)
        context_vec, _ = explicit_attention(queries, keys, values)  # (num_tokens, d_out)
        return context_vec


# The book's own spellings, so that its listings run unchanged.
SelfAttention_v1 = SelfAttentionV1
SelfAttention_v2 = SelfAttentionV2
