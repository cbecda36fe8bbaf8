r"""Chapters 6 and 7: causal attention, batched, with dropout on the attention weights.

A language model predicts token $t+1$ from tokens $1..t$, so token $i$ may not look at any
$j > i$. Setting those scores to $-\infty$ before the softmax gives them weight
$e^{-\infty} = 0$ and renormalises the rest in the same step:

$$
\begin{gathered}
M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}, \\
Z = \operatorname{dropout}\!\left(\operatorname{softmax}\!\left(
\frac{Q K^\top}{\sqrt{d_k}} + M\right)\right) V.
\end{gathered}
$$
"""

from __future__ import annotations

import torch  # noqa: F401  (the examples below use it)
from torch import Tensor, nn

from attention.checks import check_dropout, check_flag, check_input, check_size
from attention.derivation.core import causal_mask, explicit_attention

__all__ = ["CausalAttention"]


class CausalAttention(nn.Module):
    r"""Single-head causal self-attention over a batch, as in the book.

    Args:
        d_in: width of each input embedding.
        d_out: width of queries, keys and values.
        context_length: the longest sequence supported; sizes the mask buffer.
        dropout: probability of zeroing an attention weight during training.
        qkv_bias: whether the projections have a bias.

    Raises:
        TypeError: a size is not an int, or `dropout` not a number.
        ValueError: a size below 1, or `dropout` outside $[0, 1)$.

    Attributes:
        W_query: `nn.Linear(d_in, d_out)`; created first.
        W_key: `nn.Linear(d_in, d_out)`; created second.
        W_value: `nn.Linear(d_in, d_out)`; created third.
        dropout: `nn.Dropout(dropout)`, applied to the attention weights.
        mask: bool buffer `(context_length, context_length)`, True above the diagonal. As a
            buffer it moves with `.to(device)` and is saved in the `state_dict`.

    A NaN or infinity in any token's input reaches every output, the earlier ones included: a
    masked weight is exactly 0, but $0 \cdot \text{NaN}$ is NaN, as in PyTorch's kernels.

    Examples:
        >>> from attention.derivation.simple import example_inputs
        >>> inputs = example_inputs()
        >>> batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
        >>> _ = torch.manual_seed(123)
        >>> ca = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)
        >>> context_vecs = ca(batch)
        >>> context_vecs.shape
        torch.Size([2, 6, 2])
        >>> context_vecs[0, 0]
        tensor([-0.4519,  0.2216], grad_fn=<SelectBackward0>)
    """

    mask: Tensor

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (("d_in", d_in), ("d_out", d_out), ("context_length", context_length)):
            check_size(name, value)
        check_dropout(dropout)
        check_flag("qkv_bias", qkv_bias)
        self.d_in = d_in
        self.d_out = d_out
        self.context_length = context_length
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        # the book's buffer, in the book's convention: True (1) above the diagonal, hidden
        self.register_buffer("mask", ~causal_mask(context_length))

    def forward(self, x: Tensor) -> Tensor:
        """`(batch, num_tokens, d_in)` -> context vectors `(batch, num_tokens, d_out)`."""
        check_input(x, self.d_in, self.context_length, batched=True, like=self.W_query.weight)
        num_tokens = x.shape[1]
        keys = self.W_key(x)  # (b, num_tokens, d_out)
        queries = self.W_query(x)  # (b, num_tokens, d_out)
        values = self.W_value(x)  # (b, num_tokens, d_out)
        # The buffer is sized for context_length; this sequence needs its top-left corner.
        hidden = self.mask[:num_tokens, :num_tokens]  # (num_tokens, num_tokens), the book's
        context_vec, _ = explicit_attention(queries, keys, values, ~hidden, dropout=self.dropout)
        return context_vec  # (b, num_tokens, d_out)
