r"""Chapter 8: multiple heads, first stacked: one `CausalAttention` per head, concatenated.

With $h$ heads, each head $i$ has its own projections and attends on its own:

$$
\operatorname{head}_i = \operatorname{Attention}(X W_q^{(i)}, X W_k^{(i)}, X W_v^{(i)}),
$$

$$
\operatorname{MultiHead}(X) = [\operatorname{head}_1; \dots; \operatorname{head}_h]\, W_o .
$$

[`MultiHeadAttentionWrapper`][attention.derivation.wrapper.MultiHeadAttentionWrapper]
computes this literally (without $W_o$, as the book's wrapper). The production
[`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention] stacks the $h$ per-head
matrices into one `Linear(d_in, d_out)` each for queries, keys and values, splits the result
into heads with a `view` and a `transpose`, and runs all heads in one batched kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention.checks import check_size
from attention.derivation.causal import CausalAttention

__all__ = ["MultiHeadAttentionWrapper"]


class MultiHeadAttentionWrapper(nn.Module):
    r"""`num_heads` independent `CausalAttention` heads whose outputs are concatenated.

    As in the book, each head is `d_out` wide, so the output is `d_out * num_heads` wide (the
    fused class's `d_out` is instead the total width). There is no output projection.

    Args:
        d_in: width of each input embedding.
        d_out: width of **each head**.
        context_length: the longest sequence supported.
        dropout: dropout probability on each head's attention weights.
        num_heads: number of heads $h$.
        qkv_bias: whether the projections have a bias.

    Attributes:
        heads: `nn.ModuleList` of `num_heads` `CausalAttention(d_in, d_out, ...)`, created in order.

    Raises:
        TypeError: a size is not an int, or `dropout` not a number.
        ValueError: a size below 1, or `dropout` outside $[0, 1)$.

    Examples:
        >>> from attention.derivation.simple import example_inputs
        >>> inputs = example_inputs()
        >>> batch = torch.stack((inputs, inputs), dim=0)  # (2, 6, 3)
        >>> _ = torch.manual_seed(123)
        >>> mha = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0.0, num_heads=2)
        >>> context_vecs = mha(batch)
        >>> context_vecs.shape  # (batch, num_tokens, d_out * num_heads)
        torch.Size([2, 6, 4])
        >>> context_vecs[0, 0]
        tensor([-0.4519,  0.2216,  0.4772,  0.1063], grad_fn=<SelectBackward0>)
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        check_size("num_heads", num_heads)  # the heads check their other arguments
        self.heads = nn.ModuleList(
            [
                CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
                for _ in range(num_heads)
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        """`(batch, num_tokens, d_in)` -> `(batch, num_tokens, d_out * num_heads)`."""
        return torch.cat([head(x) for head in self.heads], dim=-1)
