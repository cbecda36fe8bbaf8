r"""Score modifiers: functions that change a score before the softmax, FlexAttention's way.

A score modifier is FlexAttention's `score_mod(score, b, h, q_idx, kv_idx) -> score`. It
receives the **scaled** score $s_{ij} = q_i \cdot k_j / \sqrt{d_h}$ of query $i$ and key $j$
(positions, as in [`attention.layer.masks`][attention.layer.masks]) in row $b$ and head $h$, and
returns the score the softmax takes. A layer applies its modifiers in list order, then its mask:

$$
\alpha_{ij} = \operatorname{softmax}_j\big(f_n(\dots f_1(s_{ij}) \dots) + M_{ij}\big).
$$

A modifier of the form $f(s) = s + \beta(b, h, i, j)$ has an **additive form** (`bias`):
the fused kernel takes it as a float mask. One without (a soft cap) runs the explicit path.

Examples:
    >>> import torch
    >>> halve = ScoreMod(lambda score, b, h, q_idx, kv_idx: score / 2)
    >>> halve(torch.tensor([1.0, 4.0]), *torch.zeros(4, dtype=torch.long))
    tensor([0.5000, 2.0000])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

__all__ = ["ScoreMod", "as_score_mods"]

ScoreModFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""FlexAttention's `score_mod(score, b, h, q_idx, kv_idx) -> score`, on broadcast tensors."""
BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class ScoreMod:
    """A score modifier: `fn(score, b, h, q_idx, kv_idx) -> score`, and its additive form.

    Args:
        fn: FlexAttention's `score_mod`, called with the scaled scores `(B, H, T, S)` and
            the broadcast indices of [`Mask`][attention.layer.masks.Mask]; it must return a
            floating tensor of the scores' shape.
        name: how it prints; default the function's name.
        bias: `bias(b, h, q_idx, kv_idx)` with `fn(s, ...) == s + bias(...)`, if it has
            that form; the fused kernel then gets it as a float mask.

    Raises:
        TypeError: `fn` or `bias` not callable.

    Examples:
        >>> import torch
        >>> double = ScoreMod(lambda score, b, h, q_idx, kv_idx: 2 * score)
        >>> double(torch.ones(2), *torch.zeros(4, dtype=torch.long))
        tensor([2., 2.])
    """

    def __init__(self, fn: ScoreModFn, name: str | None = None, bias: BiasFn | None = None) -> None:
        for arg, value in (("score_mod", fn), ("bias", bias)):
            if value is not None and not callable(value):
                raise TypeError(
                    f"{arg} must be a function fn(score, b, h, q_idx, kv_idx) -> score "
                    f"(FlexAttention's score_mod), got {type(value).__name__}"
                )
        self.fn, self.bias = fn, bias
        self.name: str = name or str(getattr(fn, "__name__", "score_mod"))

    def __call__(
        self, score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor
    ) -> Tensor:
        return self.fn(score, b, h, q_idx, kv_idx)

    def __repr__(self) -> str:
        return self.name


def as_score_mods(value: object) -> tuple[ScoreMod, ...]:
    """A layer's `score_mods` argument as a tuple of
    [`ScoreMod`][attention.layer.score_mods.ScoreMod].

    Raises:
        TypeError: not a sequence of `ScoreMod`s or `score_mod` functions.
    """
    if isinstance(value, ScoreMod) or callable(value):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise TypeError(
            f"score_mods must be a list of ScoreMod or score_mod functions, got "
            f"{type(value).__name__}"
        )
    mods = []
    for i, mod in enumerate(value):
        if not isinstance(mod, ScoreMod):
            if not callable(mod):
                raise TypeError(
                    f"score_mods[{i}] must be a ScoreMod or a function fn(score, b, h, q_idx, "
                    f"kv_idx) -> score, got {type(mod).__name__}"
                )
            mod = ScoreMod(mod)
        mods.append(mod)
    return tuple(mods)
