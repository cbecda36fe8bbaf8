r"""What a `MultiHeadAttention` computes, in one immutable object: its spec.

The layer's mask, score modifiers, scale, RoPE, sink logit and head counts live in one frozen
[`AttentionSpec`][attention.layer.spec.AttentionSpec]. Nothing derived from them can go stale:
the layer reads them from the spec at every call, and a change is a new spec swapped in whole
([`MultiHeadAttention.replace`][attention.layer.multihead.MultiHeadAttention.replace]), checked
like the constructor's arguments, with the new mask and modifiers tried again at the next call.
What shapes the parameters (head counts, head width, the sink logit) cannot change.

Exporters ask the spec what it computes
([`unsupported`][attention.layer.spec.AttentionSpec.unsupported]) and refuse by default what
their format cannot express, by name.

Examples:
    >>> from attention.layer.masks import causal, window
    >>> spec = AttentionSpec(causal() & window(4), num_heads=2, num_kv_heads=1, head_dim=8)
    >>> spec.unsupported()  # what plain causal multi-head attention would not compute
    ['mask=causal() & window(4)', 'num_kv_heads=1 of num_heads=2']
    >>> spec.replace(mask=causal()).unsupported(allow=("num_kv_heads",))
    []
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from attention.checks import check_positive
from attention.layer.masks import Mask, as_mask, causal, everything
from attention.layer.score_mods import ScoreMod, as_score_mods

__all__ = ["AttentionSpec"]

_FIXED = ("num_heads", "num_kv_heads", "head_dim", "sink_logit", "rope_base")
"""What shapes the parameters or the layer's tables: a spec swapped in must keep them."""


@dataclass(frozen=True)
class AttentionSpec:
    """Everything a layer's attention computes besides its weights.

    Args:
        mask: which keys a query sees, a [`Mask`][attention.layer.masks.Mask].
        score_mods: the score modifiers, applied in order.
        scale: what $q \\cdot k$ is multiplied by; None: $1 / \\sqrt{d_h}$.
        rope_base: RoPE's base, or None: no RoPE.
        sink_logit: a learned sink logit per head (gpt-oss).
        num_heads: query heads.
        num_kv_heads: key/value heads.
        head_dim: each head's width.
    """

    mask: Mask
    score_mods: tuple[ScoreMod, ...] = ()
    scale: float | None = None
    rope_base: float | None = None
    sink_logit: bool = False
    num_heads: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "mask", as_mask(self.mask))
        object.__setattr__(self, "score_mods", as_score_mods(self.score_mods))
        if self.scale is not None:
            object.__setattr__(self, "scale", check_positive("scale", self.scale))

    def replace(
        self,
        *,
        mask: Mask | Callable[..., Tensor] | None = None,
        score_mods: Sequence[ScoreMod | Callable[..., Tensor]] | None = None,
        scale: float | None = None,
    ) -> AttentionSpec:
        """This spec with another mask, score modifiers or scale (the others kept).

        Raises:
            TypeError: a mask or modifier that is not one.
            ValueError: a scale that is not a finite number above 0.
        """
        changes: dict[str, object] = {}
        if mask is not None:
            changes["mask"] = mask
        if score_mods is not None:
            changes["score_mods"] = score_mods
        if scale is not None:
            changes["scale"] = scale
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def check_swap(self, new: object) -> AttentionSpec:
        """`new`, if it keeps what shapes the parameters; else a ValueError naming it."""
        if not isinstance(new, AttentionSpec):
            raise TypeError(f"spec must be an AttentionSpec, got {type(new).__name__}")
        for name in _FIXED:
            if getattr(new, name) != getattr(self, name):
                was, got = getattr(self, name), getattr(new, name)
                raise ValueError(f"{name} shapes the layer's parameters: it stays {was!r}, "
                                 f"got {got!r}")  # fmt: skip
        return new

    @property
    def explicit_only(self) -> bool:
        """A score modifier without an additive form: no fused kernel takes it."""
        return any(mod.bias is None for mod in self.score_mods)

    @property
    def cross(self) -> bool:
        """Every key visible and nothing else: a cache then holds another sequence."""
        return self.mask.bounds.everything

    def unsupported(self, allow: Sequence[str] = ()) -> list[str]:
        """What this spec computes beyond plain multi-head attention (a causal or full mask,
        $1/\\sqrt{d_h}$, no RoPE, sink or modifier, as many key/value heads as query heads):
        each item names the setting. Exporters list what their format cannot express, less
        what they `allow` (setting names: "mask", "score_mods", "scale", "rope",
        "sink_logit", "num_kv_heads").
        """
        found: list[tuple[str, str]] = []
        if self.mask not in (causal(), everything()):
            found.append(("mask", f"mask={self.mask!r}"))
        if self.score_mods:
            found.append(("score_mods", f"score_mods={list(self.score_mods)}"))
        if self.scale is not None:
            found.append(("scale", f"scale={self.scale:g}"))
        if self.rope_base is not None:
            found.append(("rope", f"rope (base {self.rope_base:g})"))
        if self.sink_logit:
            found.append(("sink_logit", "sink_logit"))
        if self.num_kv_heads != self.num_heads:
            heads = f"num_kv_heads={self.num_kv_heads} of num_heads={self.num_heads}"
            found.append(("num_kv_heads", heads))
        return [text for name, text in found if name not in allow]
