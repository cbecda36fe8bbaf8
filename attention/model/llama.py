r"""One attention layer of the Llama family, in and out: Llama, Mistral, Qwen2, Gemma 2, ...

`q_proj`, `k_proj`, `v_proj` and `o_proj` are `nn.Linear`s, as ours are (`W_query`, `W_key`,
`W_value`, `out_proj`); heads are contiguous blocks of `head_dim` outputs, and query head $i$
reads key/value head $\lfloor i\,h_{kv}/h \rfloor$ in both; RoPE is rotate-half with
$\theta_i = \text{base}^{-2i/d_h}$ in both, and Mistral's `sliding_window` is the number of
keys a query sees, itself included, as our `window` is. What a layer computes is read from
its config by [`llama_layer`][attention.model.llama_config.llama_layer], which refuses any
attention setting it does not apply.

**Interleaved RoPE.** Helium, Ernie 4.5, Cohere and Llama 4 rotate the pairs
$(x_{2i}, x_{2i+1})$ of each head by $\theta_i$, where ours rotates $(x_i, x_{i+d_h/2})$. A
score is a dot product, $q \cdot k = \sum_j q_j k_j$, unchanged when the *same* permutation
reorders the dimensions of both $q$ and $k$; so sending dimension $2i$ to $i$ and $2i+1$ to
$i + d_h/2$ in every query and key head, which is permuting the rows of $W_q$ and $W_k$ (and
their biases), turns the interleaved rotation into ours exactly: transformers'
`convert_llama_weights_to_hf.py` does the same to Meta's checkpoints (its `permute`). Values
are not rotated and keep their rows.

**Biases.** Ours always has an output bias; Hugging Face's `o_proj` has one only with
`attention_bias` (Helium's never), so loading reads `o_proj.bias` where the state dict has
one and sets it to zero otherwise, and writing refuses a nonzero one.

Examples:
    >>> config = {"model_type": "helium", "hidden_size": 8, "num_attention_heads": 1,
    ...           "max_position_embeddings": 16}
    >>> state = {f"{n}_proj.weight": torch.eye(8) for n in "qkvo"}
    >>> att = attention_from_llama(state, config)
    >>> att.W_query.weight.argmax(dim=1)  # row i reads dimension 2i, row i + 4 reads 2i + 1
    tensor([0, 2, 4, 6, 1, 3, 5, 7])
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor

from attention.checks import check_positive, check_size, check_tensor
from attention.layer.masks import Bounds, Mask, from_flags
from attention.layer.multihead import MultiHeadAttention
from attention.layer.qk_norm import QKNormKind
from attention.layer.score_mods import ScoreMod
from attention.layer.softcap import softcap
from attention.model.llama_config import LlamaLayer, llama_layer

__all__ = ["attention_from_llama", "attention_to_llama", "chunks", "llama_attention_config"]


def _same_chunk(c: int, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    return q // c == kv // c


def chunks(c: int) -> Mask:
    r"""$\lfloor i / c \rfloor = \lfloor j / c \rfloor$: a query sees the keys of its own
    chunk of `c` positions (Llama 4's chunked attention, with `causal()`).

    Here rather than in [`attention.layer.masks`][attention.layer.masks], as only this loader
    uses it. Its bounds: a visible key lies fewer than `c` positions away.

    Examples:
        >>> chunks(2).grid(torch.arange(4), torch.arange(4)).int()
        tensor([[1, 1, 0, 0],
                [1, 1, 0, 0],
                [0, 0, 1, 1],
                [0, 0, 1, 1]], dtype=torch.int32)
    """
    check_size("chunk", c)
    return Mask(partial(_same_chunk, c), f"chunks({c})", Bounds(reach=c), f"chunks({c})")


def _tuned(
    floor: float, scale: float, score: Tensor, b: Tensor, h: Tensor, q: Tensor, kv: Tensor
) -> Tensor:
    r"""Llama 4's temperature: $s \cdot (1 + \text{scale} \log(1 + \lfloor (i+1)/\text{floor}
    \rfloor))$, what multiplying query $i$ by that factor does to its scores."""
    factor = torch.log1p(torch.floor((q.to(torch.float32) + 1.0) / floor)) * scale + 1.0
    return score * factor.to(score.dtype)


def _score_mods(spec: LlamaLayer) -> list[ScoreMod]:
    mods = [] if spec.softcap is None else [softcap(spec.softcap)]
    if spec.temperature is not None:
        floor, scale = spec.temperature
        mods.append(ScoreMod(partial(_tuned, floor, scale), f"temperature({floor}, {scale})"))
    return mods


def _halves(rows: Tensor, head_dim: int) -> Tensor:
    r"""Rows of interleaved pairs, per head, reordered as halves: $2i \to i$,
    $2i + 1 \to i + d_h/2$ (`(heads * head_dim, ...)` in and out)."""
    heads = rows.shape[0] // head_dim
    pairs = rows.unflatten(0, (heads, head_dim // 2, 2))  # (heads, d_h/2, 2, ...)
    halves: Tensor = pairs.transpose(1, 2).flatten(0, 2)  # (heads * d_h, ...)
    return halves


def _llama_slots(
    att: MultiHeadAttention, o_bias: bool, gains: bool = True
) -> list[tuple[str, Tensor | None, tuple[int, ...]]]:
    """Hugging Face's names for our projections, and their shapes: the weights, the query,
    key and value biases if `att` has them, `o_proj.bias` if `o_bias`, QK-norm's gains if
    `att` has them and `gains` (Llama 4's norm has none)."""
    pairs = [
        ("q_proj", att.W_query),
        ("k_proj", att.W_key),
        ("v_proj", att.W_value),
        ("o_proj", att.out_proj),
    ]
    if att.W_gate is not None:  # Qwen3-Next: the gate's rows, split from q_proj's
        pairs.append(("gate", att.W_gate))
    slots: list[tuple[str, Tensor | None, tuple[int, ...]]] = []
    for name, linear in pairs:
        slots.append((f"{name}.weight", linear.weight, tuple(linear.weight.shape)))
        if linear.bias is not None and (name != "o_proj" or o_bias):
            slots.append((f"{name}.bias", linear.bias, (linear.weight.shape[0],)))
    for name, norm in (("q_norm", att.q_norm), ("k_norm", att.k_norm)):
        if norm is not None and gains:  # QK-norm's gains (Qwen3, Gemma 3, OLMo 2)
            slots.append((f"{name}.weight", norm.weight, tuple(norm.weight.shape)))
    return slots


def _llama_state(state_dict: object, prefix: object) -> dict[str, Any]:
    """The tensors of `state_dict` under `prefix`, without it (and without RoPE's buffer)."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"state_dict must be a mapping from names to tensors (a module's "
            f"state_dict()), got {type(state_dict).__name__}"
        )
    if not isinstance(prefix, str):
        raise TypeError(
            f"prefix must be a str (e.g. 'model.layers.0.self_attn.'), got "
            f"{prefix!r} ({type(prefix).__name__})"
        )
    odd = [key for key in state_dict if not isinstance(key, str)]
    if odd:
        raise TypeError(
            f"state_dict's keys must be str (tensor names), got {odd[0]!r} "
            f"({type(odd[0]).__name__})"
        )
    state = {
        k.removeprefix(prefix): v
        for k, v in state_dict.items()
        if k.startswith(prefix) and not k.endswith("rotary_emb.inv_freq")
    }
    if not state:
        raise ValueError(f"state_dict has no key that starts with prefix={prefix!r}")
    return state


def attention_from_llama(
    state_dict: Mapping[str, Tensor],
    config: object,
    *,
    prefix: str = "",
    context_length: int | None = None,
    layer: int | None = None,
) -> MultiHeadAttention:
    """A causal `MultiHeadAttention` holding one Llama-family attention layer, in eval mode.

    What the layer computes is [`llama_layer`][attention.model.llama_config.llama_layer]'s
    reading of `config`, which refuses, by name, every attention setting it does not apply:
    RoPE with the config's `rope_theta` (none in a NoPE layer: `no_rope_layers`),
    `num_key_value_heads` key/value heads, the layer's `sliding_window` as `window` or its
    `attention_chunk_size` as a [`chunks`][attention.model.llama.chunks] mask, Gemma 2's and
    Granite's scale and cap, Llama 4's temperature tuning. An interleaved family's query and
    key rows are permuted to halves (the module's docstring). With `attention_bias` (or
    Ernie's `use_bias`) the query, key and value projections have biases; without it, they
    are read if the state dict has them (Qwen2's); `out_proj.bias` is `o_proj.bias` where the
    state dict has one, zero otherwise. In the state dict's dtype and on its device.

    Positions: a chunk, and Llama 4's temperature, are counted at the layer's positions (the
    tokens' indices, or `positions=`), where transformers counts the cache's positions; the
    two are the same in generation, where `position_ids` are those.

    Args:
        state_dict: `q_proj.weight`, `k_proj.weight`, `v_proj.weight`, `o_proj.weight` (and
            biases): a `LlamaAttention`'s, or a whole model's with `prefix`.
        config: a `LlamaConfig`, `MistralConfig` (or another of their family), or its
            `to_dict()`, or `config.json` read as a dict: `hidden_size`, `num_attention_heads`,
            and optionally `num_key_value_heads`, `head_dim`, `rope_parameters` (or
            `rope_theta`), `sliding_window`, `attention_bias`, `max_position_embeddings`.
        prefix: take the keys that start with it, e.g. `model.layers.0.self_attn.`.
        context_length: the longest sequence one call takes; default
            `max_position_embeddings`.
        layer: the layer's index, where the config's `layer_types` or `no_rope_layers` give
            layers different attention (Qwen2's first `max_window_layers` without a window,
            SmolLM3's every fourth layer without RoPE).

    Raises:
        TypeError: `config` is neither a config nor a mapping, `state_dict` not a mapping
            with str keys, `prefix` not a str, tensors not floating point or of more than one
            dtype, or a size, flag or probability (argument or config value) of another kind.
        ValueError: a missing or unknown key or a wrong shape (named, expected and actual),
            an attention setting it does not apply (named), a family whose RoPE layout is
            unknown (`model_type`), an unknown RoPE type, a RoPE base not above 1, or
            key/value heads that do not divide the heads.

    Examples:
        >>> config = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
        ...           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        ...           "sliding_window": 16, "max_position_embeddings": 128}
        >>> state = {"q_proj.weight": torch.randn(64, 64), "k_proj.weight": torch.randn(16, 64),
        ...          "v_proj.weight": torch.randn(16, 64), "o_proj.weight": torch.randn(64, 64)}
        >>> att = attention_from_llama(state, config)
        >>> att.num_kv_heads, att.window, att.rope, att.rope_base
        (2, 16, True, 10000.0)
        >>> torch.equal(attention_to_llama(att)["k_proj.weight"], state["k_proj.weight"])
        True
    """
    state = _llama_state(state_dict, prefix)
    if layer is not None:
        check_size("layer", layer, minimum=0)
    spec = llama_layer(config, context_length, layer)
    name, like = next(iter(state.items()))
    like = check_tensor(prefix + name, like, floating=True)
    qkv_bias = spec.bias or "q_proj.bias" in state  # Qwen2: biases on q, k, v only
    qk_norm = "head" if spec.l2_qk_norm else _qk_norm(state, spec, prefix)
    gated = _split_gate(state, spec)
    # built for real, not on the meta device: RotaryTable keeps its frequencies in a plain
    # tensor attribute, which to_empty() would leave on the meta device
    att = _layer(spec, qkv_bias, qk_norm, _norm_eps(config), output_gate=gated)
    att = att.to(dtype=like.dtype, device=like.device).eval()
    if spec.l2_qk_norm:  # Llama 4's norm has no gains: ours stay at one, and are not trained
        for norm in (att.q_norm, att.k_norm):
            assert norm is not None
            norm.weight.requires_grad_(False)
    slots = _llama_slots(att, o_bias="o_proj.bias" in state, gains=not spec.l2_qk_norm)
    unknown = sorted(prefix + key for key in state if key not in {s[0] for s in slots})
    missing = [f"{prefix}{key} {shape}" for key, _, shape in slots if key not in state]
    if unknown or missing:
        raise ValueError(
            f"not a Llama attention layer of this config: unknown keys {unknown}, "
            f"missing keys {missing}"
        )
    values = [
        check_tensor(prefix + key, state[key], floating=True, like=like) for key, _, _ in slots
    ]
    with torch.no_grad():
        att.out_proj.bias.zero_()  # Hugging Face's o_proj has none, unless the state has one
        for (key, param, shape), value in zip(slots, values, strict=True):
            if tuple(value.shape) != shape:
                raise ValueError(f"{prefix}{key}: expected shape {shape}, got {tuple(value.shape)}")
            if spec.interleaved and key[0] in "qk":  # pairs (2i, 2i + 1) -> halves (i, i + d/2),
                # rows of the projections and entries of QK-norm's gains alike
                value = _halves(value, spec.head_dim)
            assert param is not None
            param.copy_(value)
    return att


def _split_gate(state: dict[str, Any], spec: LlamaLayer) -> bool:
    """Qwen3-Next's gated attention: a `q_proj` twice `num_heads * head_dim` wide, each
    head's query rows then its gate's, is split in `state` into `q_proj` and `gate`."""
    weight, heads, d_h = state.get("q_proj.weight"), spec.num_heads, spec.head_dim
    if not isinstance(weight, Tensor) or weight.ndim != 2 or weight.shape[0] != 2 * heads * d_h:
        return False
    for name in ("weight", "bias"):
        if f"q_proj.{name}" in state:  # (h * 2 * d_h, ...) -> (h, [query, gate], d_h, ...)
            rows = state[f"q_proj.{name}"].unflatten(0, (heads, 2, d_h))
            state[f"q_proj.{name}"] = rows[:, 0].flatten(0, 1)  # (h * d_h, ...)
            state[f"gate.{name}"] = rows[:, 1].flatten(0, 1)  # (h * d_h, ...)
    return True


def _qk_norm(state: Mapping[str, Tensor], spec: LlamaLayer, prefix: str) -> QKNormKind | None:
    """QK-norm where the state dict has its gains: `"head"` where `q_norm.weight` is `d_h`
    wide (Qwen3, Gemma 3), `"projection"` where it is `h d_h` wide (OLMo 2)."""
    gain = state.get("q_norm.weight")
    if gain is None:
        return None
    widths = {spec.head_dim: "head", spec.num_heads * spec.head_dim: "projection"}
    width = gain.shape[-1] if isinstance(gain, Tensor) and gain.ndim == 1 else None
    if width not in widths:
        raise ValueError(
            f"{prefix}q_norm.weight must be (head_dim,) = ({spec.head_dim},) or "
            f"(num_heads * head_dim,) = ({spec.num_heads * spec.head_dim},), got "
            f"{tuple(gain.shape) if isinstance(gain, Tensor) else type(gain).__name__}"
        )
    return widths[width]  # type: ignore[return-value]


def _norm_eps(config: object) -> float:
    """The config's `rms_norm_eps` (Llama's default 1e-6 where it has none)."""
    settings = config.to_dict() if hasattr(config, "to_dict") else config
    eps = settings.get("rms_norm_eps") if isinstance(settings, Mapping) else None
    return 1e-6 if eps is None else check_positive("config's rms_norm_eps", eps)


def _layer(
    spec: LlamaLayer,
    qkv_bias: bool,
    qk_norm: QKNormKind | None = None,
    eps: float = 1e-6,
    *,
    output_gate: bool = False,
) -> MultiHeadAttention:
    """The `MultiHeadAttention` that computes `spec`: its mask, RoPE, scale and modifiers."""
    mask = None if spec.chunk is None else chunks(spec.chunk)
    return MultiHeadAttention(
        spec.hidden_size,
        spec.num_heads * spec.head_dim,  # d_out: Qwen3's and Gemma 3's may differ from d_in
        spec.context_length,
        spec.dropout,
        spec.num_heads,
        qkv_bias,
        causal=True,
        num_kv_heads=spec.num_kv_heads,
        window=spec.window,
        rope=spec.rope,
        rope_base=spec.rope_theta,
        mask=mask,
        score_mods=_score_mods(spec),
        scale=spec.scale,
        rope_scaling=spec.rope_scaling,
        qk_norm=qk_norm,
        qk_norm_eps=eps,
        out_features=spec.hidden_size,
        output_gate=output_gate,
    )


def _check_llama_like(att: object) -> MultiHeadAttention:
    if not isinstance(att, MultiHeadAttention):
        raise TypeError(f"att must be a MultiHeadAttention, got {type(att).__name__}")
    reasons = [
        why
        for why, bad in [
            ("not causal", not att.causal),
            ("no RoPE (rope=False)", not att.rope),
            ("attention sinks (sinks)", att.sinks > 0),
            ("sink logits", att.sink_logits is not None),
            (f"rope_scaling={att.spec.rope_scaling}", att.spec.rope_scaling is not None),
            (f"qk_norm={att.spec.qk_norm!r}", att.spec.qk_norm is not None),
            ("score modifiers", bool(att.score_mods)),
            (f"scale={att.scale}", att.scale is not None),
            (f"mask {att.rule!r}", att.rule != from_flags(True, att.window, 0)),
            (f"d_in={att.d_in} != d_out={att.d_out}", att.d_in != att.d_out),
            (f"out_features={att.out_features}", att.out_features != att.d_out),
            ("an output gate (output_gate)", att.W_gate is not None),
        ]
        if bad
    ]
    if reasons:
        raise ValueError(
            "a Llama/Mistral attention layer is causal, rotates with RoPE, has no sinks and "
            f"maps hidden_size to hidden_size; att has {', '.join(reasons)}"
        )
    return att


def attention_to_llama(att: MultiHeadAttention) -> dict[str, Tensor]:
    """`att`'s weights as a `LlamaAttention` (or `MistralAttention`) state dict.

    `q_proj`, `k_proj`, `v_proj`, `o_proj` weights, and their biases when `att` has
    `qkv_bias` (Hugging Face's `attention_bias`, which gives all four a bias). Fresh tensors;
    [`llama_attention_config`][attention.model.llama.llama_attention_config] gives the config.
    The rows are in Llama's RoPE layout (the two halves of each head rotated together), the
    layout the package keeps: a layer loaded from a family that rotates interleaved pairs
    (Helium, say) comes back in Llama's layout, for a Llama config, not in its own.

    Raises:
        TypeError: `att` is not a `MultiHeadAttention`.
        ValueError: `att` is not causal, has no RoPE, has sinks, `d_in != d_out`, or has a
            nonzero `out_proj.bias` without `qkv_bias`.

    Examples:
        >>> att = MultiHeadAttention(32, 32, 64, 0.0, num_heads=4, num_kv_heads=2, rope=True)
        >>> attention_to_llama(att)
        Traceback (most recent call last):
        ...
        ValueError: att.out_proj.bias is not zero, but without qkv_bias the layer has attention_bias=False: Hugging Face's o_proj has no bias
        >>> with torch.no_grad():
        ...     _ = att.out_proj.bias.zero_()
        >>> {k: tuple(v.shape) for k, v in attention_to_llama(att).items()}
        {'q_proj.weight': (32, 32), 'k_proj.weight': (16, 32), 'v_proj.weight': (16, 32), 'o_proj.weight': (32, 32)}
    """  # noqa: E501
    att = _check_llama_like(att)
    qkv_bias = att.W_query.bias is not None
    if not qkv_bias and bool(att.out_proj.bias.any()):
        raise ValueError(
            "att.out_proj.bias is not zero, but without qkv_bias the layer has "
            "attention_bias=False: Hugging Face's o_proj has no bias"
        )
    slots = _llama_slots(att, o_bias=qkv_bias)  # attention_bias: all four have one
    return {
        key: param.detach().clone(memory_format=torch.contiguous_format)
        for key, param, _ in slots
        if param is not None
    }


def llama_attention_config(att: MultiHeadAttention) -> dict[str, Any]:
    """The `LlamaConfig` / `MistralConfig` keys that describe `att`: `LlamaConfig(**keys)`.

    Examples:
        >>> att = MultiHeadAttention(32, 32, 64, 0.0, num_heads=4, num_kv_heads=2, rope=True,
        ...                          window=8)
        >>> config = llama_attention_config(att)
        >>> config["num_key_value_heads"], config["sliding_window"], config["head_dim"]
        (2, 8, 8)
    """
    att = _check_llama_like(att)
    return {
        "hidden_size": att.d_in,
        "num_attention_heads": att.num_heads,
        "num_key_value_heads": att.num_kv_heads,
        "head_dim": att.head_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": att.rope_base},
        "sliding_window": att.window,
        "attention_bias": att.W_query.bias is not None,
        "max_position_embeddings": att.context_length,
        "attention_dropout": att.dropout.p,
    }
