r"""Chapter 3: simplified self-attention, with no trainable weights.

Each token's embedding $x^{(i)}$ is at once its query, its key and its value. For the query
$x^{(q)}$ the attention scores are dot products $\omega_i = x^{(q)} \cdot x^{(i)}$, the weights
$\alpha$ normalise them to sum to 1, and the context vector is the weighted sum
$z^{(q)} = \sum_i \alpha_i x^{(i)}$. For all queries at once: $\Omega = X X^\top$,
$A = \operatorname{softmax}(\Omega)$ row by row, $Z = A X$.

The running example is the book's six tokens "Your journey starts with one step", embedded in
three dimensions: [`example_inputs`][attention.derivation.simple.example_inputs].
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention.checks import check_tensor
from attention.derivation.core import attention_scores, softmax_stable

__all__ = [
    "EXAMPLE_TOKENS",
    "attn_scores_for_query",
    "attn_scores_loop",
    "attn_scores_matrix",
    "context_vector",
    "context_vectors",
    "example_inputs",
    "normalize_by_sum",
    "simplified_self_attention",
    "softmax_naive",
    "softmax_stable",
]

EXAMPLE_TOKENS: tuple[str, ...] = ("Your", "journey", "starts", "with", "one", "step")
"""The six tokens of the running example, in order."""


def example_inputs() -> Tensor:
    r"""The running example: "Your journey starts with one step" as six 3-d embeddings.

    Returns:
        A fresh `(6, 3)` tensor $X$; row $i$ is $x^{(i+1)}$ (the book counts from 1).

    Examples:
        >>> inputs = example_inputs()
        >>> inputs.shape
        torch.Size([6, 3])
        >>> inputs[1]  # "journey", x^(2)
        tensor([0.5500, 0.8700, 0.6600])
    """
    return torch.tensor(
        [
            [0.43, 0.15, 0.89],  # Your     (x^1)
            [0.55, 0.87, 0.66],  # journey  (x^2)
            [0.57, 0.85, 0.64],  # starts   (x^3)
            [0.22, 0.58, 0.33],  # with     (x^4)
            [0.77, 0.25, 0.10],  # one      (x^5)
            [0.05, 0.80, 0.55],  # step     (x^6)
        ]
    )


def _check_tokens(inputs: Tensor) -> None:
    """Simplified self-attention works on one sequence: `(num_tokens, d_in)` floats."""
    if not isinstance(inputs, Tensor) or inputs.ndim != 2 or not inputs.is_floating_point():
        got = (
            f"a {inputs.ndim}-d {inputs.dtype} tensor of shape {tuple(inputs.shape)}"
            if isinstance(inputs, Tensor)
            else type(inputs).__name__
        )
        raise ValueError(f"expected inputs of shape (num_tokens, d_in), floating point, got {got}")


def attn_scores_for_query(inputs: Tensor, query: Tensor) -> Tensor:
    r"""Scores of one query against every token, one dot product at a time.

    $$\omega_i = x^{(q)} \cdot x^{(i)} = \sum_{d} x^{(q)}_d \, x^{(i)}_d$$

    Args:
        inputs: $X$, shape `(num_tokens, d_in)`.
        query: $x^{(q)}$, shape `(d_in,)`.

    Returns:
        $\omega$, shape `(num_tokens,)`.

    Raises:
        ValueError: `inputs` is not 2-d, or `query` is not one vector of width `d_in`.

    Examples:
        >>> inputs = example_inputs()
        >>> attn_scores_for_query(inputs, inputs[1])  # query "journey"
        tensor([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])
    """
    _check_tokens(inputs)
    check_tensor("query", query, like=inputs)
    if query.shape != inputs.shape[1:]:
        raise ValueError(
            f"expected a query of shape (d_in,) = ({inputs.shape[1]},), got {tuple(query.shape)}"
        )
    attn_scores = inputs.new_empty(inputs.shape[0])  # (num_tokens,), inputs' dtype and device
    for i, x_i in enumerate(inputs):
        attn_scores[i] = torch.dot(x_i, query)
    return attn_scores


def attn_scores_loop(inputs: Tensor) -> Tensor:
    r"""All pairwise scores with two loops: $\omega_{ij} = x^{(i)} \cdot x^{(j)}$.

    Args:
        inputs: $X$, shape `(num_tokens, d_in)`.

    Returns:
        $\Omega$, shape `(num_tokens, num_tokens)`; equal to
        [`attn_scores_matrix`][attention.derivation.simple.attn_scores_matrix].

    Raises:
        ValueError: `inputs` is not 2-d.

    Examples:
        >>> inputs = example_inputs()
        >>> attn_scores_loop(inputs)[1]  # the row of "journey"
        tensor([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])

        The same numbers as the matrix product, summed in another order, so equal up to
        rounding (not always bit for bit):

        >>> torch.allclose(attn_scores_loop(inputs), attn_scores_matrix(inputs))
        True
    """
    _check_tokens(inputs)
    n = inputs.shape[0]
    attn_scores = inputs.new_empty(n, n)  # (num_tokens, num_tokens), inputs' dtype and device
    for i, x_i in enumerate(inputs):
        for j, x_j in enumerate(inputs):
            attn_scores[i, j] = torch.dot(x_i, x_j)
    return attn_scores


def attn_scores_matrix(inputs: Tensor) -> Tensor:
    r"""All pairwise scores in one matrix product: $\Omega = X X^\top$.

    Args:
        inputs: $X$, shape `(num_tokens, d_in)`.

    Returns:
        $\Omega$, shape `(num_tokens, num_tokens)`, symmetric.

    Raises:
        ValueError: `inputs` is not a 2-d floating-point tensor.

    Examples:
        >>> attn_scores_matrix(example_inputs())[1]  # the row of "journey"
        tensor([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865])
    """
    _check_tokens(inputs)
    return attention_scores(inputs, inputs)  # (num_tokens, num_tokens)


def normalize_by_sum(attn_scores: Tensor, dim: int = -1) -> Tensor:
    r"""Normalise by the plain sum, $\alpha_i = \omega_i / \sum_j \omega_j$.

    Sums to 1, but a negative score gives a negative "weight", and a sum near 0 blows up;
    hence softmax.

    Args:
        attn_scores: $\omega$, any shape.
        dim: the dimension that sums to 1.

    Returns:
        Weights with the shape of `attn_scores`.

    Examples:
        >>> inputs = example_inputs()
        >>> normalize_by_sum(attn_scores_for_query(inputs, inputs[1]))
        tensor([0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656])
    """
    return attn_scores / attn_scores.sum(dim=dim, keepdim=True)


def softmax_naive(attn_scores: Tensor, dim: int = -1) -> Tensor:
    r"""Softmax straight from its definition, $\alpha_i = e^{\omega_i} / \sum_j e^{\omega_j}$.

    Overflows for large scores: $e^{89} > 3.4 \times 10^{38}$, the largest float32, so a
    score of 89 gives `inf / inf = nan`. Use
    [`softmax_stable`][attention.derivation.core.softmax_stable] or `torch.softmax`.

    Args:
        attn_scores: $\omega$, any shape.
        dim: the dimension that sums to 1.

    Returns:
        Weights with the shape of `attn_scores`.

    Examples:
        >>> softmax_naive(torch.tensor([1.0, 1.0]))
        tensor([0.5000, 0.5000])
        >>> softmax_naive(torch.tensor([100.0, 100.0]))  # e^100 overflows float32
        tensor([nan, nan])
    """
    return torch.exp(attn_scores) / torch.exp(attn_scores).sum(dim=dim, keepdim=True)


def context_vector(inputs: Tensor, attn_weights: Tensor) -> Tensor:
    r"""One context vector as a loop over tokens: $z = \sum_i \alpha_i x^{(i)}$.

    Args:
        inputs: $X$, shape `(num_tokens, d_in)`.
        attn_weights: $\alpha$ for one query, shape `(num_tokens,)`.

    Returns:
        $z$, shape `(d_in,)`.

    Raises:
        ValueError: `inputs` is not 2-d, or there is not one weight per token.

    Examples:
        >>> inputs = example_inputs()
        >>> weights = torch.softmax(attn_scores_for_query(inputs, inputs[1]), dim=0)
        >>> context_vector(inputs, weights)  # z^(2), for "journey"
        tensor([0.4419, 0.6515, 0.5683])
    """
    _check_tokens(inputs)
    check_tensor("attn_weights", attn_weights, like=inputs)
    if attn_weights.shape != inputs.shape[:1]:
        raise ValueError(
            f"expected one weight per token, shape (num_tokens,) = ({inputs.shape[0]},), "
            f"got {tuple(attn_weights.shape)}"
        )
    z = inputs.new_zeros(inputs.shape[-1])  # (d_in,), inputs' dtype and device
    for i, x_i in enumerate(inputs):
        z += attn_weights[i] * x_i
    return z


def context_vectors(inputs: Tensor, attn_weights: Tensor) -> Tensor:
    r"""All context vectors at once: $Z = A X$.

    Args:
        inputs: $X$, shape `(num_tokens, d_in)`.
        attn_weights: $A$, shape `(num_tokens, num_tokens)`, rows summing to 1.

    Returns:
        $Z$, shape `(num_tokens, d_in)`; row $i$ is $z^{(i)}$.

    Raises:
        ValueError: `inputs` is not 2-d, or `attn_weights` is not `(num_tokens, num_tokens)`.

    Examples:
        >>> inputs = example_inputs()
        >>> weights = torch.softmax(attn_scores_matrix(inputs), dim=-1)
        >>> context_vectors(inputs, weights)[1]
        tensor([0.4419, 0.6515, 0.5683])
    """
    _check_tokens(inputs)
    check_tensor("attn_weights", attn_weights, like=inputs)
    n = inputs.shape[0]
    if attn_weights.shape != (n, n):
        raise ValueError(
            f"expected attn_weights of shape (num_tokens, num_tokens) = ({n}, {n}), "
            f"got {tuple(attn_weights.shape)}"
        )
    return attn_weights @ inputs  # (num_tokens, d_in)


def simplified_self_attention(inputs: Tensor) -> tuple[Tensor, Tensor]:
    r"""The whole of chapter 3 in one call: $Z = \operatorname{softmax}(X X^\top) X$.

    No scaling, no mask, no trainable weights: every token is its own query, key and value.

    Args:
        inputs: $X$, shape `(num_tokens, d_in)`.

    Returns:
        `(context_vecs, attn_weights)` of shapes `(num_tokens, d_in)` and
        `(num_tokens, num_tokens)`.

    Raises:
        ValueError: `inputs` is not a 2-d floating-point tensor.

    Examples:
        >>> context_vecs, attn_weights = simplified_self_attention(example_inputs())
        >>> context_vecs.shape, attn_weights.shape
        (torch.Size([6, 3]), torch.Size([6, 6]))
        >>> attn_weights.sum(dim=-1)
        tensor([1.0000, 1.0000, 1.0000, 1.0000, 1.0000, 1.0000])
    """
    _check_tokens(inputs)
    attn_weights = softmax_stable(attn_scores_matrix(inputs), dim=-1)  # (T, T)
    return context_vectors(inputs, attn_weights), attn_weights
