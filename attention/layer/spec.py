r"""What a `MultiHeadAttention` computes, in one immutable object: its spec.

The layer's mask, score modifiers, scale, RoPE, sink logit and head counts live in one frozen
[`AttentionSpec`][attention.layer.spec.AttentionSpec]. Nothing derived from them can go stale:
the layer reads them from the spec at every call, and a change is a new spec swapped in whole
([`MultiHeadAttention.replace`][attention.layer.spec.Specified.replace]), checked
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
from typing import TYPE_CHECKING, Self

import torch
from torch import Tensor, nn

from attention.checks import check_flag, check_positive, check_size
from attention.layer.arguments import check_cache, check_cross_options, layer_mask
from attention.layer.cache import KVCache
from attention.layer.masks import Mask, as_mask, causal, chunk_mask, everything
from attention.layer.positions import rope_frequencies
from attention.layer.qk_norm import check_qk_norm
from attention.layer.rope_scaling import as_rope_scaling
from attention.layer.score_mods import ScoreMod, as_score_mods

if TYPE_CHECKING:
    from attention.layer.fused import Options, Plan
    from attention.layer.rope_scaling import RopeScaling

__all__ = ["AttentionSpec", "Specified", "layer_spec"]

_FIXED = (
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "sink_logit",
    "rope_base",
    "rope_scaling",
    "qk_norm",
)
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
        rope_scaling: RoPE's scaling and rotated width
            ([`RopeScaling`][attention.layer.rope_scaling.RopeScaling]), or None: plain RoPE.
        qk_norm: RMSNorm of queries and keys, per `"head"` or over the `"projection"`
            ([`attention.layer.qk_norm`][attention.layer.qk_norm]), or None.
    """

    mask: Mask
    score_mods: tuple[ScoreMod, ...] = ()
    scale: float | None = None
    rope_base: float | None = None
    sink_logit: bool = False
    num_heads: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1
    rope_scaling: RopeScaling | None = None
    qk_norm: str | None = None

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
                raise ValueError(
                    f"{name} shapes the layer's parameters: it stays {was!r}, got {got!r}"
                )
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
        "sink_logit", "num_kv_heads", "rope_scaling", "qk_norm").
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
        if self.rope_scaling is not None:
            found.append(("rope_scaling", f"rope_scaling={self.rope_scaling}"))
        if self.qk_norm is not None:
            found.append(("qk_norm", f"qk_norm={self.qk_norm!r}"))
        if self.sink_logit:
            found.append(("sink_logit", "sink_logit"))
        if self.num_kv_heads != self.num_heads:
            heads = f"num_kv_heads={self.num_kv_heads} of num_heads={self.num_heads}"
            found.append(("num_kv_heads", heads))
        return [text for name, text in found if name not in allow]


def layer_spec(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    context_length: int,
    widths: tuple[int, int, int],
    *,
    causal: bool | None,
    window: int | None,
    sinks: int,
    mask: object,
    score_mods: object,
    scale: float | None,
    rope: object,
    rope_base: float,
    sink_logit: object,
    rope_scaling: object,
    qk_norm: object,
) -> AttentionSpec:
    """`MultiHeadAttention`'s spec from its arguments, each checked by name; `widths`:
    `(kdim, vdim, d_in)`, other than `d_in` for cross-attention only."""
    rule = layer_mask(causal, window, sinks, mask)
    rope = check_flag("rope", rope)
    rope_frequencies(2, rope_base)  # checks rope_base, used or not
    if rope and head_dim % 2:
        raise ValueError(
            "rope rotates pairs of dimensions: head_dim = d_out // num_heads "
            f"must be even, got head_dim={head_dim}"
        )
    mods = as_score_mods(score_mods)
    kdim, vdim, d_in = widths
    if (kdim, vdim) != (d_in, d_in):
        check_cross_options(
            kdim,
            vdim,
            d_in,
            causal=rule.bounds.causal,
            rope=rope,
            sink_logit=sink_logit,
            qk_norm=qk_norm,
            mask=mask,
            score_mods=mods,
        )
    scaling = as_rope_scaling(rope_scaling, rope, head_dim, context_length)
    return AttentionSpec(
        rule,
        mods,
        scale,
        float(rope_base) if rope else None,
        check_flag("sink_logit", sink_logit),
        num_heads,
        num_kv_heads,
        head_dim,
        scaling,
        check_qk_norm(qk_norm),
    )


class Specified:
    """What a layer derives from its spec (its mask, its caches): a mixin of
    `MultiHeadAttention` (and of any layer with the same attributes: `num_heads`,
    `num_kv_heads`, `head_dim`, `kdim`, `vdim`, `d_in`, `context_length`, `W_key`). The spec
    is swapped whole; what each call needs of it (the cache layout, the prefix, the kernel
    options) is derived at the swap, so nothing can go stale.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    d_in: int
    kdim: int
    vdim: int
    context_length: int
    W_key: nn.Linear
    dropout: nn.Dropout
    _unprobed: bool
    _trace: list[Plan | None]

    @property
    def spec(self) -> AttentionSpec:
        """What the attention computes: mask, score modifiers, scale, RoPE, sink, heads."""
        return self._spec

    @spec.setter
    def spec(self, new: AttentionSpec) -> None:
        old: AttentionSpec | None = self.__dict__.get("_spec")
        self._spec: AttentionSpec = new if old is None else old.check_swap(new)
        self._unprobed = True  # a new mask or modifier is tried at the next call
        bounds = new.mask.bounds  # what each call reads, derived here from the one spec
        self._prefix, self._cross = bounds.prefix, bounds.everything
        self._layout: tuple[object, ...] | None = (
            None
            if bounds.prefix is None
            else (self.num_kv_heads, self.head_dim, bounds.reach or None, bounds.anchor)
        )
        self._options: Options | None = None  # made at the next call

    def _new_options(self, dropout_p: float, sink_logits: Tensor | None = None) -> Options:
        """The kernel's options from the spec, kept for the next calls (the layer makes new
        ones when dropout's `p`, 0 out of training, or the sink logits change)."""
        from attention.layer.fused import Options  # fused's options, for this spec

        spec = self._spec
        self._options = Options(
            self.num_heads, dropout_p, spec.scale, sink_logits, spec.score_mods, self.dropout
        )
        return self._options

    @property
    def last_plan(self) -> Plan | None:
        """The plan the last call ran ([`plan_call`][attention.layer.fused.plan_call])."""
        return self._trace[0]

    def replace(
        self,
        *,
        mask: Mask | Callable[..., Tensor] | None = None,
        score_mods: Sequence[ScoreMod | Callable[..., Tensor]] | None = None,
        scale: float | None = None,
    ) -> Self:
        """Swap in a spec with another mask, score modifiers or scale; returns the layer.

        The whole spec changes at once, so nothing derived from the old one survives; a cache
        made for another window or sinks is then refused by name. Head counts, the sink
        logit and RoPE shape the parameters and stay.

        Examples:
            >>> from attention import MultiHeadAttention
            >>> from attention.layer.masks import causal, window
            >>> mha = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2)
            >>> mha.replace(mask=causal() & window(4)).window
            4
        """
        self.spec = self._spec.replace(mask=mask, score_mods=score_mods, scale=scale)
        return self

    def _read_only(self, name: str) -> None:
        raise AttributeError(
            f"Specified.{name} is part of its spec: swap the whole "
            f"spec with layer.replace({name}=...)"
        )

    @property
    def rule(self) -> Mask:
        """The [`Mask`][attention.layer.masks.Mask]: `mask`, or the one the shorthand names."""
        return self._spec.mask

    @rule.setter
    def rule(self, value: object) -> None:
        self._read_only("mask")

    @property
    def score_mods(self) -> tuple[ScoreMod, ...]:
        """The tuple of [`ScoreMod`][attention.layer.score_mods.ScoreMod]s, applied in order."""
        return self._spec.score_mods

    @score_mods.setter
    def score_mods(self, value: object) -> None:
        self._read_only("score_mods")

    @property
    def scale(self) -> float | None:
        """What $q \\cdot k$ is multiplied by; None: $1 / \\sqrt{d_h}$."""
        return self._spec.scale

    @scale.setter
    def scale(self, value: object) -> None:
        self._read_only("scale")

    @property
    def rope(self) -> bool:
        return self._spec.rope_base is not None

    @property
    def rope_base(self) -> float | None:
        return self._spec.rope_base

    @property
    def causal(self) -> bool:
        """Whether the mask certainly hides the future (its bounds)."""
        return self.rule.bounds.causal

    @property
    def window(self) -> int | None:
        """How far back a query sees at most (the mask's reach), or None: unbounded (or a
        reach of 0: only the anchors, as `prefix(n)` alone, which no ring can hold)."""
        return self.rule.bounds.reach or None

    @property
    def sinks(self) -> int:
        """The first positions every query may see beyond the reach (the mask's anchor)."""
        return self.rule.bounds.anchor

    @property
    def layout(self) -> tuple[object, ...] | None:
        """What a self-attention cache must be made for (None: this layer takes none)."""
        return self._layout

    def extra_repr(self) -> str:
        """Shown by `print(module)`: what is not visible in the submodules."""
        options = [f"num_heads={self.num_heads}", f"causal={self.causal}"]
        if (self.kdim, self.vdim) != (self.d_in, self.d_in):
            options.append(f"kdim={self.kdim}, vdim={self.vdim}")
        if self.num_kv_heads != self.num_heads:
            options.append(f"num_kv_heads={self.num_kv_heads}")
        if self.rule.name not in ("causal()", "everything()"):
            options.append(f"mask={self.rule!r}")
        if self.score_mods:
            options.append(f"score_mods={list(self.score_mods)}")
        if self.scale is not None:
            options.append(f"scale={self.scale:g}")
        if self.rope_base is not None:
            options.append(f"rope_base={self.rope_base:g}")
        if self._spec.rope_scaling is not None:
            options.append(f"rope_scaling={self._spec.rope_scaling.rope_type}")
        if self._spec.qk_norm is not None:
            options.append(f"qk_norm={self._spec.qk_norm!r}")
        return ", ".join(options)

    def mask(self, num_tokens: int, device: torch.device | str | None = None) -> Tensor:
        """This layer's `(num_tokens, num_tokens)` bool mask, True = may attend, from its rule.

        Examples:
            >>> from attention import MultiHeadAttention
            >>> mha = MultiHeadAttention(4, 4, 8, 0.0, num_heads=1, window=2)
            >>> mha.mask(3)
            tensor([[ True, False, False],
                    [ True,  True, False],
                    [False,  True,  True]])
        """
        return chunk_mask(0, num_tokens, self.rule, device)

    def init_cache(self, batch_size: int, max_tokens: int | None = None) -> KVCache:
        """An empty key/value cache for generating with this module, on its device and dtype.

        A layer with a window gets a ring buffer of `window + sinks` slots, whatever the
        length; any other layer a linear cache of `max_tokens`.

        Args:
            batch_size: sequences generated together.
            max_tokens: the most tokens it will take, prompt (and padding) included; default
                `context_length`, or no limit for a layer with a window.

        Returns:
            A [`KVCache`][attention.layer.cache.KVCache] of `num_kv_heads` heads.

        A module with `causal=False` caches only for cross-attention: the other sequence's
        keys and values, `max_tokens` of them (default `context_length`), stored once.

        Raises:
            ValueError: `max_tokens` (without a window, causal) exceeds `context_length`.
        """
        window = self.window
        if max_tokens is None and window is None:
            max_tokens = self.context_length
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
            if self.layout is not None and window is None and max_tokens > self.context_length:
                raise ValueError(
                    f"max_tokens={max_tokens} is longer than context_length={self.context_length}"
                )
        weight = self.W_key.weight
        cache = KVCache(
            batch_size,
            max_tokens,
            self.num_kv_heads,
            self.head_dim,
            window=window,
            sinks=self.sinks,
            device=weight.device,
            dtype=weight.dtype,
        )
        cache.layout = self.layout
        return cache

    def check_cache(self, cache: object, batch_size: int, num_tokens: int) -> None:
        """Raise an error naming `cache` unless it was made for this layer and fits the chunk.

        Raises:
            TypeError: not a `KVCache`.
            ValueError: a mask that no cache can take, another head layout, dtype or device,
                window, batch size, or no room left.
        """
        check_cache(self, cache, batch_size, num_tokens, self.W_key.weight)
