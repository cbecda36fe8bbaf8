r"""Chapter 8, trained: a task two heads split between them, a tiny model, and its weights.

The task, [`previous_and_first`][attention.lab.training.previous_and_first]: a sequence of random
tokens $x_0 \dots x_{T-1}$, and at every position $t \ge 1$ two tokens to output, the
previous one $x_{t-1}$ and the first one $x_0$. One softmax row cannot put all its weight on
two keys at once (from $t = 2$ on they differ), but two heads can, one key each.
[`TinyAttentionModel`][attention.lab.training.TinyAttentionModel] is the smallest model that can
learn it: token and position embeddings, one
[`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention], a linear readout.
[`head_weights`][attention.lab.training.head_weights] returns each head's attention weights, and
[`previous_token_weight`][attention.lab.training.previous_token_weight] and
[`first_token_weight`][attention.lab.training.first_token_weight] say, in one number per head,
which of the two keys a head reads; [`torch_threads`][attention.lab.threads.torch_threads] runs
the loop on one CPU thread. The training loop itself is written out on the
[multi-head page](../multihead.md).

Examples:
    >>> generator = torch.Generator().manual_seed(0)
    >>> idx, targets = previous_and_first(2, 5, vocab_size=8, generator=generator)
    >>> idx.shape, targets.shape  # (batch, T) and (batch, T - 1, 2): queries 1 .. T - 1
    (torch.Size([2, 5]), torch.Size([2, 4, 2]))
    >>> _ = torch.manual_seed(0)
    >>> model = TinyAttentionModel(vocab_size=8, context_length=5)
    >>> model(idx).shape  # (batch, T, 2 outputs, vocab_size)
    torch.Size([2, 5, 2, 8])
    >>> head_weights(model, idx).shape  # (batch, num_heads, T, T)
    torch.Size([2, 2, 5, 5])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention.checks import check_ids, check_size, check_tensor
from attention.derivation.text import TokenAndPositionEmbedding
from attention.layer.multihead import MultiHeadAttention

__all__ = [
    "TinyAttentionModel",
    "first_token_weight",
    "head_weights",
    "previous_and_first",
    "previous_token_weight",
]


def previous_and_first(
    batch_size: int,
    num_tokens: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    r"""A batch of the task: random tokens, and for each query the previous and the first token.

    Args:
        batch_size: number of sequences.
        num_tokens: tokens per sequence, $T \ge 2$.
        vocab_size: tokens are drawn uniformly from `0 .. vocab_size - 1`.
        generator: the seeded source of randomness (the same seed gives the same batch).

    Returns:
        `(idx, targets)`: `idx` int64 `(batch_size, num_tokens)`; `targets` int64
        `(batch_size, num_tokens - 1, 2)`, row `t - 1` for query `t = 1 .. T - 1`:
        `targets[:, t - 1, 0]` is `idx[:, t - 1]` (the previous token) and
        `targets[:, t - 1, 1]` is `idx[:, 0]` (the first token). Query 0 has no previous
        token and is not scored.

    Raises:
        TypeError: a size is not an int, or `generator` not a `torch.Generator`.
        ValueError: `batch_size < 1`, `num_tokens < 2` or `vocab_size < 2`.

    Examples:
        >>> idx, targets = previous_and_first(1, 4, 8, torch.Generator().manual_seed(1))
        >>> idx
        tensor([[5, 3, 4, 0]])
        >>> targets[0]  # (previous, first) for query 1, 2 and 3
        tensor([[5, 5],
                [3, 5],
                [4, 5]])
    """
    check_size("batch_size", batch_size)
    check_size("num_tokens", num_tokens, minimum=2)
    check_size("vocab_size", vocab_size, minimum=2)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    idx = torch.randint(vocab_size, (batch_size, num_tokens), generator=generator)  # (b, T)
    previous = idx[:, :-1]  # x_{t-1} for t = 1 .. T-1: (b, T-1)
    first = idx[:, :1].expand(-1, num_tokens - 1)  # x_0 for every t: (b, T-1)
    return idx, torch.stack([previous, first], dim=-1)  # (b, T-1, 2)


class TinyAttentionModel(nn.Module):
    r"""Embeddings, one `MultiHeadAttention`, and a linear readout of two tokens per position.

    $$
    \begin{aligned}
    h &= \operatorname{MultiHead}(E_\text{tok}[x] + E_\text{pos}), \\
    \text{logits} &= h\, W_r + b_r,
    \end{aligned}
    $$

    reshaped to two predictions per token. Nothing else: no residual connection, no
    feed-forward layer, no normalisation, so whatever a position outputs comes through its
    heads. Causal, no dropout.

    Args:
        vocab_size: $V$, the number of token ids.
        context_length: the longest sequence, $T$.
        d_model: width of the embeddings and of the attention, split across the heads.
        num_heads: heads of the attention.
        num_outputs: predictions per position.

    Attributes:
        embedding: a
            [`TokenAndPositionEmbedding`][attention.derivation.text.TokenAndPositionEmbedding]
            `(vocab_size, context_length, d_model)`, created first.
        attention: `MultiHeadAttention(d_model, d_model, context_length, 0.0, num_heads)`.
        readout: `nn.Linear(d_model, num_outputs * vocab_size)`, created last.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size below 1, or `d_model` not divisible by `num_heads`.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> model = TinyAttentionModel(vocab_size=8, context_length=6, d_model=16)
        >>> model.attention.num_heads, model.attention.head_dim
        (2, 8)
        >>> model(torch.tensor([[1, 2, 3]])).shape  # (batch, T, num_outputs, V)
        torch.Size([1, 3, 2, 8])
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int = 16,
        num_heads: int = 2,
        num_outputs: int = 2,
    ) -> None:
        super().__init__()
        self.num_outputs = check_size("num_outputs", num_outputs)
        self.embedding = TokenAndPositionEmbedding(vocab_size, context_length, d_model)
        self.attention = MultiHeadAttention(d_model, d_model, context_length, 0.0, num_heads)
        self.readout = nn.Linear(d_model, num_outputs * vocab_size)

    def forward(self, idx: Tensor) -> Tensor:
        """Token ids `(batch, T)` -> logits `(batch, T, num_outputs, vocab_size)`."""
        x = self.embedding(idx)  # (b, T, d_model)
        logits: Tensor = self.readout(self.attention(x))  # (b, T, num_outputs * V)
        return logits.view(*idx.shape, self.num_outputs, self.embedding.vocab_size)


def head_weights(model: TinyAttentionModel, idx: Tensor) -> Tensor:
    """Each head's attention weights on `idx`, without gradients.

    Args:
        model: a [`TinyAttentionModel`][attention.lab.training.TinyAttentionModel].
        idx: token ids `(batch, T)`.

    Returns:
        `(batch, num_heads, T, T)`: entry `[b, h, i, j]` is the weight query `i` of head `h`
        puts on key `j`; each row sums to 1 and is 0 above the diagonal.

    Raises:
        TypeError: `model` is not a `TinyAttentionModel`, or `idx` not integer ids.
        ValueError: `idx` is not `(batch, T)` ids of the model's vocabulary and context.

    Examples:
        >>> _ = torch.manual_seed(0)
        >>> model = TinyAttentionModel(vocab_size=8, context_length=4)
        >>> weights = head_weights(model, torch.tensor([[1, 2, 3, 4]]))
        >>> weights[0, 0, 0].tolist()  # query 0 sees only key 0
        [1.0, 0.0, 0.0, 0.0]
    """
    if not isinstance(model, TinyAttentionModel):
        raise TypeError(f"model must be a TinyAttentionModel, got {type(model).__name__}")
    check_ids(idx, "idx")
    with torch.no_grad():
        weights: Tensor = model.attention(model.embedding(idx), need_weights=True)[1]
    return weights  # (b, h, T, T)


def _check_weights(weights: Tensor) -> None:
    check_tensor("weights", weights, ndim=4, floating=True)
    if weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 3:
        raise ValueError(
            "weights must be (batch, heads, T, T) with T >= 3 (from query 2 on, the previous "
            f"and the first token differ), got shape {tuple(weights.shape)}"
        )


def previous_token_weight(weights: Tensor) -> Tensor:
    r"""Each head's mean weight on the previous token, over queries $t = 2 \dots T-1$.

    Queries 0 and 1 are left out: query 0 has no previous token, and for query 1 the previous
    token is the first one. A head that always reads one back scores 1, one that spreads its
    weight evenly about $\operatorname{mean}_t \frac{1}{t+1}$.

    Args:
        weights: `(batch, heads, T, T)` attention weights, `T >= 3`.

    Returns:
        `(heads,)`, averaged over the batch and the queries.

    Examples:
        >>> back = torch.eye(4).roll(-1, dims=1)  # query t reads key t - 1
        >>> previous_token_weight(back[None, None])  # (batch 1, head 1, 4, 4) -> (1,)
        tensor([1.])
    """
    _check_weights(weights)
    one_back = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # alpha[t, t-1]: (b, h, T-1)
    return one_back[..., 1:].mean(dim=(0, 2))  # queries t = 2 .. T-1: (h,)


def first_token_weight(weights: Tensor) -> Tensor:
    r"""Each head's mean weight on the first token, over queries $t = 2 \dots T-1$.

    Args:
        weights: `(batch, heads, T, T)` attention weights, `T >= 3`.

    Returns:
        `(heads,)`, averaged over the batch and the queries.

    Examples:
        >>> to_first = torch.zeros(4, 4)
        >>> to_first[:, 0] = 1.0  # every query reads key 0
        >>> first_token_weight(to_first[None, None])
        tensor([1.])
    """
    _check_weights(weights)
    return weights[..., 2:, 0].mean(dim=(0, 2))  # alpha[t, 0], t = 2 .. T-1: (h,)
