"""The layer tries a user's mask and score modifiers once, on its first call, so that a broken
one fails there, by name, rather than deep inside a kernel."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Size, Tensor

from attention.layer.masks import Mask, evaluate, indices
from attention.layer.score_mods import ScoreMod

__all__ = ["probe"]


def probe(rule: Mask, score_mods: Sequence[ScoreMod], num_heads: int, x: Tensor) -> None:
    """Call the mask and each score modifier once, on the first call's batch, its first (at
    most 4) positions and its device: a broken one fails here, by name. NaN and a `bias` that
    is not `fn - score` are looked for where the mask sees (and not on `meta`).

    Raises:
        TypeError: a function that raises, or returns the wrong kind of tensor.
        ValueError: a result of the wrong shape, a NaN, or a `bias` that is not `fn - score`.
    """
    batch, n, device = x.shape[0], max(1, min(4, x.shape[1])), x.device
    pos = torch.arange(n, device=device)
    seen = evaluate(rule, pos, pos, num_heads=num_heads, batch=batch)  # raises, naming it
    b, h, q, kv = indices(pos, pos, batch=batch, num_heads=num_heads)
    score = torch.linspace(-3.0, 3.0, n * n, device=device).view(1, 1, n, n)
    score = score.expand(batch, num_heads, n, n)
    for i, mod in enumerate(score_mods):
        name = f"score_mods[{i}] ({mod.name})"
        out = _call(name, mod.fn, (score, b, h, q, kv), score.shape, exact=True)
        bias = (
            None
            if mod.bias is None
            else _call(f"{name}'s bias", mod.bias, (b, h, q, kv), score.shape)
        )
        if device.type == "meta":
            continue
        if bool(out.isnan()[seen.expand_as(out)].any()):
            raise ValueError(f"{name} turned finite scores into NaN where the mask sees")
        if bias is not None and not torch.allclose(
            out.masked_fill(~seen, 0),
            (score + bias.to(score.dtype)).masked_fill(~seen, 0),
            atol=1e-5,
        ):
            raise ValueError(
                f"{name}: its bias is not fn(score) - score, as an additive form must be"
            )


def _call(
    name: str, fn: Callable[..., object], args: tuple[Tensor, ...], shape: Size, exact: bool = False
) -> Tensor:
    """`fn(*args)`, a floating tensor of `shape` (or, unless `exact`, one that broadcasts to
    it), or an error naming `name`."""
    try:
        out = fn(*args)
    except Exception as error:
        shapes = ", ".join(str(tuple(a.shape)) for a in args)
        raise TypeError(
            f"{name} failed on tensors of shapes {shapes}: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(out, Tensor) or not out.is_floating_point():
        kind = out.dtype if isinstance(out, Tensor) else type(out).__name__
        raise TypeError(f"{name} must return floating-point scores, got {kind}")
    try:
        if (out.shape != shape) if exact else torch.broadcast_shapes(out.shape, shape) != shape:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(
            f"{name} must return the scores' shape {tuple(shape)}"
            f"{'' if exact else ' (or one that broadcasts to it)'}, got "
            f"{tuple(out.shape)}"
        ) from None
    return out
