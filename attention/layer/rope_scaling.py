r"""Longer contexts from a RoPE model: scaled frequencies, and part of each head rotated.

A model trained at $L$ positions has seen pair $i$ turn by at most $L\,\theta_i$. Every
method below changes the frequencies $\theta_i = \text{base}^{-2i/d}$ (one per pair, $d$ the
rotated width) so that a longer context turns the slow pairs no further than training did:

- **linear** (position interpolation, Chen et al. 2023): $\theta_i' = \theta_i / s$ for every
  pair, $s$ the `factor`: positions squeezed $s$ times.
- **dynamic** (dynamic NTK, the *NTK-aware* base change): the base grows with the sequence,
  $\text{base}' = \text{base}\,\bigl(s\,n / L - (s - 1)\bigr)^{d/(d-2)}$ for $n > L$ tokens,
  so the fast pairs barely change and the slowest is divided by about $s\,n/L$; for $n \le L$
  it is the plain RoPE.
- **yarn** (Peng et al. 2023): by wavelength. Pairs that turn more than `beta_fast` times over
  the original $L$ keep $\theta_i$, pairs that turn fewer than `beta_slow` times take
  $\theta_i / s$, and a linear ramp between the two mixes them; cos and sin (so queries and
  keys) are multiplied by the *attention factor* $0.1 \ln s + 1$, which sharpens the
  softmax by its square.
- **llama3** (Llama 3.1): by wavelength $\lambda_i = 2\pi/\theta_i$: $\lambda_i < L /
  \text{high}$ keeps $\theta_i$, $\lambda_i > L / \text{low}$ takes $\theta_i / s$, and in
  between $\theta_i' = (1 - \sigma)\,\theta_i / s + \sigma\,\theta_i$ with
  $\sigma = (L / \lambda_i - \text{low}) / (\text{high} - \text{low})$.

With `partial_rotary_factor` $p < 1$ only the first $\lfloor p\, d_h \rfloor$ dimensions of
each head rotate (their halves paired, as everywhere here); the rest pass unchanged.

[`RopeScaling.frequencies`][attention.layer.rope_scaling.RopeScaling.frequencies] computes each
in float64; the tests check them against transformers' `ROPE_INIT_FUNCTIONS` for the same
config.

Examples:
    >>> scaling = RopeScaling.from_parameters({"rope_type": "linear", "factor": 4.0})
    >>> theta, factor = scaling.frequencies(head_dim=4, base=100.0)
    >>> theta  # 1 and 0.1, each divided by 4
    tensor([0.2500, 0.0250], dtype=torch.float64)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attention.checks import check_flag, check_positive, check_size

__all__ = ["KINDS", "RopeScaling", "as_rope_scaling"]

KINDS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
               "high_freq_factor"),
}  # fmt: skip
"""Each RoPE type this module computes, and the settings it reads."""

_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclass(frozen=True)
class RopeScaling:
    """One RoPE scaling method and its settings (transformers' `rope_parameters` names).

    Args:
        rope_type: `default`, `linear`, `dynamic`, `yarn` or `llama3`.
        factor: $s$, how many times longer than the original context.
        original_max_position_embeddings: $L$ (yarn, llama3).
        max_position_embeddings: the model's context (dynamic's $L$; yarn's $s$ when
            `factor` is None).
        low_freq_factor: llama3's `low`.
        high_freq_factor: llama3's `high`.
        beta_fast: yarn's fast bound in turns (default 32).
        beta_slow: yarn's slow bound in turns (default 1).
        attention_factor: yarn's factor on cos and sin; default from $s$ (and `mscale`).
        mscale: DeepSeek's yarn numerator scale.
        mscale_all_dim: DeepSeek's yarn denominator scale.
        truncate: yarn: round the ramp's ends to whole pairs (default True).
        partial_rotary_factor: the share of each head that rotates.
    """

    rope_type: str = "default"
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    partial_rotary_factor: float = 1.0

    @classmethod
    def from_parameters(
        cls, parameters: Mapping[str, Any], max_position_embeddings: int | None = None
    ) -> RopeScaling:
        """Read a config's `rope_parameters` (or `rope_scaling`); refuse what it does not read.

        Raises:
            TypeError: `parameters` is not a mapping.
            ValueError: an unknown `rope_type` or a setting it does not read (named), or a
                missing or out-of-range value.
        """
        if not isinstance(parameters, Mapping):
            raise TypeError(
                f"rope_parameters must be a dict (rope_type, factor, ...), got "
                f"{type(parameters).__name__}"
            )
        kind = parameters.get("rope_type", parameters.get("type", "default"))
        if kind not in KINDS:
            raise ValueError(
                f"rope_type={kind!r} is not supported: only {', '.join(KINDS)} are computed here"
            )
        unread = [
            f"{key}={value!r}"
            for key, value in parameters.items()
            if key not in KINDS[kind] + _COMMON and value is not None
        ]
        if unread:
            raise ValueError(
                f"rope_type={kind!r} does not read {', '.join(unread)}: a RoPE built without "
                "it would compute other angles"
            )
        values = {key: parameters[key] for key in KINDS[kind] if parameters.get(key) is not None}
        if "partial_rotary_factor" in parameters:
            values["partial_rotary_factor"] = parameters["partial_rotary_factor"]
        return cls(kind, max_position_embeddings=max_position_embeddings, **values)

    def __post_init__(self) -> None:
        if self.rope_type not in KINDS:
            raise ValueError(f"rope_type must be one of {', '.join(KINDS)}, got {self.rope_type!r}")
        for name in KINDS[self.rope_type]:
            value = getattr(self, name)
            if value is not None and name != "truncate":
                object.__setattr__(self, name, check_positive(name, value))
        needed = {
            "linear": ("factor",),
            "dynamic": ("factor", "max_position_embeddings"),
            "llama3": KINDS["llama3"][:4],
            "yarn": ("original_max_position_embeddings",),
        }
        missing = [name for name in needed.get(self.rope_type, ()) if getattr(self, name) is None]
        if self.rope_type == "yarn" and not (self.factor or self.max_position_embeddings):
            missing.append("factor (or max_position_embeddings)")
        if missing:
            raise ValueError(f"rope_type={self.rope_type!r} needs {', '.join(missing)}")
        p = check_positive("partial_rotary_factor", self.partial_rotary_factor)
        if p > 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {p!r}")

    def replace(self, **changes: Any) -> RopeScaling:
        """This scaling with some settings changed."""
        return dataclasses.replace(self, **changes)

    def rotary_dim(self, head_dim: int) -> int:
        """How many dimensions of each head rotate: $\\lfloor p\\, d_h \\rfloor$, even.

        Raises:
            ValueError: that width is odd or zero.
        """
        check_size("head_dim", head_dim)
        dim = int(head_dim * self.partial_rotary_factor)
        if dim < 2 or dim % 2:
            raise ValueError(
                f"partial_rotary_factor={self.partial_rotary_factor} of head_dim={head_dim} "
                f"rotates {dim} dimensions: RoPE needs an even number, at least 2"
            )
        return dim

    def frequencies(
        self, head_dim: int, base: float, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        r"""$\theta_i'$, float64, `(rotary_dim / 2,)`, and the factor on cos and sin.

        Args:
            head_dim: $d_h$; the rotated width is [`rotary_dim`][attention.layer.rope_scaling.RopeScaling.rotary_dim].
            base: RoPE's base.
            seq_len: dynamic only: the tokens the model looks at (default and below
                `max_position_embeddings`: the plain RoPE).
        """  # noqa: E501
        d = self.rotary_dim(head_dim)
        exponents = torch.arange(0, d, 2, dtype=torch.float64) / d  # 2i / d
        if self.rope_type == "dynamic":
            assert self.factor is not None and self.max_position_embeddings is not None
            s, length = self.factor, self.max_position_embeddings
            n = max(seq_len or length, length)
            base = base * (s * n / length - (s - 1)) ** (d / (d - 2))  # the NTK-aware base
        theta = base**-exponents  # theta_i, (d/2,)
        if self.rope_type == "linear":
            assert self.factor is not None
            return theta / self.factor, 1.0
        if self.rope_type == "llama3":
            return self._llama3(theta), 1.0
        if self.rope_type == "yarn":
            return self._yarn(theta, d, base)
        return theta, 1.0

    def _llama3(self, theta: Tensor) -> Tensor:
        """Llama 3.1: keep the fast pairs, divide the slow ones by s, blend in between."""
        s, length = self.factor, self.original_max_position_embeddings
        low, high = self.low_freq_factor, self.high_freq_factor
        assert s is not None and length is not None and low is not None and high is not None
        wavelength = 2 * math.pi / theta  # lambda_i, positions per turn
        sigma = (length / wavelength - low) / (high - low)  # 0 at L / low, 1 at L / high
        blended = (1 - sigma) * theta / s + sigma * theta
        slow, fast = wavelength > length / low, wavelength < length / high
        return torch.where(slow, theta / s, torch.where(fast, theta, blended))

    def _yarn(self, theta: Tensor, d: int, base: float) -> tuple[Tensor, float]:
        """YaRN: a ramp by turns over the original context, and its attention factor."""
        length = self.original_max_position_embeddings
        assert length is not None
        s = self.factor
        if s is None:  # DeepSeek's: the ratio of the contexts
            assert self.max_position_embeddings is not None
            s = self.max_position_embeddings / length

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        factor = self.attention_factor
        if factor is None:
            both = self.mscale and self.mscale_all_dim
            factor = (
                mscale(s, self.mscale) / mscale(s, self.mscale_all_dim)  # type: ignore[arg-type]
                if both
                else mscale(s)
            )

        def pair_turning(turns: float) -> float:  # the pair that turns `turns` times over L
            return d * math.log(length / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(self.beta_fast or 32), pair_turning(self.beta_slow or 1)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001  # no division by zero
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        # ramp 0: the fast pairs keep theta_i (extrapolate); 1: the slow ones take theta_i / s
        return theta / s * ramp + theta * (1 - ramp), float(factor)


def as_rope_scaling(
    scaling: object, rope: bool, head_dim: int, context_length: int
) -> RopeScaling | None:
    """The layer's `RopeScaling` (from a dict too), or None; refused without `rope`, and
    dynamic NTK past its `max_position_embeddings` (cached keys keep their first angles)."""
    check_flag("rope", rope)
    if scaling is None:
        return None
    if isinstance(scaling, Mapping):
        scaling = RopeScaling.from_parameters(scaling)
    if not isinstance(scaling, RopeScaling):
        kind = type(scaling).__name__
        raise TypeError(f"rope_scaling must be a RopeScaling or a dict, got {kind}")
    if not rope:
        raise ValueError(f"rope_scaling={scaling.rope_type!r} needs rope=True")
    scaling.rotary_dim(head_dim)  # an even rotated width
    if scaling.rope_type == "dynamic" and context_length > (scaling.max_position_embeddings or 0):
        raise ValueError(
            f"rope_scaling 'dynamic' changes the frequencies past max_position_embeddings="
            f"{scaling.max_position_embeddings}, which keys cached earlier do not follow: "
            f"context_length={context_length} must not exceed it"
        )
    return scaling
