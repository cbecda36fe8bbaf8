r"""What one attention layer of a Llama-family config computes: every setting read, or refused.

A Hugging Face config holds the settings of a whole model: its vocabulary, its feed-forward,
its norms, and those of its attention layers. [`llama_layer`][attention.model.llama_config.llama_layer]
reads the last kind into a [`LlamaLayer`][attention.model.llama_config.LlamaLayer], for one
layer, and refuses what it cannot read, so that a layer is never loaded computing something
else than the checkpoint's. The rule, key by key of the config:

1. **Read**: the attention settings this module understands (`READ`): the sizes, RoPE's base,
   its scaling (linear, dynamic, YaRN, Llama 3.1's) and partial rotation (Gemma 3's
   per layer kind), bias and dropout, `sliding_window` and `layer_types` (full,
   sliding or chunked attention per layer), `no_rope_layers` (SmolLM3's and Llama 4's NoPE
   layers: `1` rotates, `0` does not), Gemma 2's and Granite's scale, Gemma 2's soft cap and
   Llama 4's temperature tuning of its NoPE layers.
2. **Elsewhere**: settings of the rest of the model (`ELSEWHERE`: embeddings, tokens and
   output, the feed-forward and its experts, the norms, the config's own bookkeeping),
   listed by concern: they do not change what an attention layer computes.
3. **Anything else** is refused, naming it, when it is *on* (not None nor False) and its name
   says it concerns attention (`att`, `head`, `rope`, `qk`, `query`, `key`, `window`,
   `chunk`, `scal`, `softcap`, `sink`, `clip`, ...): `use_qk_norm=True` outside Llama 4
   (Cohere's, a layer norm with gains), OLMo's `clip_qkv`, Gemma 3's
   `sliding_window_pattern`. An unknown setting with no such word (a new feed-forward size,
   say) passes.

One fact no setting states: whether a family rotates **interleaved pairs**
$(x_{2i}, x_{2i+1})$ (Meta's original layout, kept by Helium, Ernie 4.5, Cohere and
Llama 4) or **halves** $(x_i, x_{i + d_h/2})$ (Hugging Face's Llama layout). That is written
in each family's modeling file, so it is read from `model_type`, by a table of the families
whose files were read (`ROTATE_HALF`, `INTERLEAVED`); a config without `model_type` (a
plain dict) means Llama's, and any other `model_type` is refused.

Examples:
    >>> config = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
    ...           "max_position_embeddings": 128, "num_hidden_layers": 4,
    ...           "no_rope_layers": [1, 1, 1, 0], "vocab_size": 1000}
    >>> llama_layer(config, layer=3).rope  # SmolLM3's fourth layer: no RoPE
    False
    >>> llama_layer({**config, "use_qk_norm": True}, layer=0)
    Traceback (most recent call last):
    ...
    ValueError: config sets use_qk_norm=True, which attention_from_llama does not apply: MultiHeadAttention computes no such thing, so it cannot hold this layer
    >>> llama4 = {**config, "model_type": "llama4_text", "use_qk_norm": True}
    >>> llama_layer(llama4, layer=0).l2_qk_norm, llama_layer(llama4, layer=3).l2_qk_norm
    (True, False)
"""  # noqa: E501

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from attention.checks import check_dropout, check_flag, check_positive, check_size
from attention.layer.rope_scaling import RopeScaling

__all__ = [
    "ATTENTION_WORDS",
    "ELSEWHERE",
    "INTERLEAVED",
    "READ",
    "ROTATE_HALF",
    "LlamaLayer",
    "llama_layer",
]

READ = {
    "sizes": {
        "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "num_hidden_layers", "max_position_embeddings"},
    "projections": {"attention_bias", "use_bias", "qkv_bias", "attention_dropout"},
    "positions": {
        "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
        "no_rope_layers", "no_rope_layer_interval"},
    "mask": {
        "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
        "attention_chunk_size"},
    "scores": {
        "attention_multiplier", "query_pre_attn_scalar", "attn_logit_softcapping",
        "attn_temperature_tuning", "floor_scale", "attn_scale"},
    "norms": {"use_qk_norm"},
}  # fmt: skip
"""The attention settings `llama_layer` reads, by what they set."""

ELSEWHERE = {
    "embeddings, tokens and output": {
        "vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings",
        "embedding_multiplier", "logits_scaling", "logit_scale", "final_logit_softcapping",
        "initializer_range", "use_cache"},
    "feed-forward and experts": {
        "intermediate_size", "intermediate_size_mlp", "hidden_act", "hidden_activation",
        "mlp_bias", "num_experts_per_tok", "num_local_experts", "moe_layers",
        "interleave_moe_layer_step", "output_router_logits", "router_aux_loss_coef",
        "router_jitter_noise", "routed_scaling_factor", "pretraining_tp"},
    "norms and residuals": {"rms_norm_eps", "layer_norm_eps", "residual_multiplier"},
    "linear-attention layers (Qwen3-Next's Gated DeltaNet, read by its own loader)": {
        "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
        "linear_num_key_heads", "linear_num_value_heads"},
    "the config's bookkeeping": {
        "architectures", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label",
        "label2id", "is_encoder_decoder", "output_attentions", "output_hidden_states",
        "problem_type", "return_dict", "transformers_version", "tokenizer_class",
        "attn_implementation"},
}  # fmt: skip
"""Settings of the rest of the model, by concern: never an attention layer's."""

ATTENTION_WORDS = re.compile(
    r"att|head|rope|rotary|position|qk|query|key|value|kv|window|chunk|scal|softcap|"
    r"temperature|sink|causal|bidirectional|clip|mask|alibi"
)
"""An unknown setting whose name has one of these words concerns attention."""

ROTATE_HALF = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "smollm3",
        "olmo",
        "olmo2",
        "olmoe",
        "starcoder2",
        "phi3",
    }
)
"""Families whose modeling file rotates halves, as `MultiHeadAttention` does."""

INTERLEAVED = frozenset({"helium", "ernie4_5", "ernie4_5_moe", "cohere", "llama4_text"})
"""Families whose modeling file rotates interleaved pairs: their q/k rows are permuted."""


class LlamaLayer(NamedTuple):
    """What one attention layer of a Llama-family configuration computes."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: bool  # False: a NoPE layer (SmolLM3's, Llama 4's no_rope_layers)
    rope_theta: float
    interleaved: bool  # RoPE rotates pairs (2i, 2i+1): q/k rows are permuted on loading
    window: int | None  # sliding_window, where the layer has one
    chunk: int | None  # Llama 4's attention_chunk_size, where the layer is chunked
    bias: bool  # attention_bias (Ernie's use_bias): q, k, v (and o) have a bias
    context_length: int
    dropout: float
    scale: float | None  # Gemma 2's query_pre_attn_scalar ** -0.5, Granite's multiplier
    softcap: float | None  # Gemma 2's attn_logit_softcapping
    temperature: tuple[float, float] | None  # Llama 4's (floor_scale, attn_scale), NoPE layers
    rope_scaling: RopeScaling | None = None  # scaled frequencies, partial rotation
    l2_qk_norm: bool = False  # Llama 4's use_qk_norm: each q and k head / its RMS, no gains


def _rope_theta(config: Mapping[str, Any], layer_kind: str = "global") -> float:
    """RoPE's base (transformers 5 and 4 configs; Gemma 3's per layer kind)."""
    rope, key = _rope_parameters(config, layer_kind)
    name, theta = (
        (f"config's {key}['rope_theta']", rope["rope_theta"])
        if "rope_theta" in rope
        else ("config's rope_theta", config.get("rope_theta", 10000.0))
    )
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not 1 < theta < math.inf:
        raise ValueError(f"{name} must be a finite number > 1 (RoPE's base), got {theta!r}")
    return float(theta)


def _rope_parameters(config: Mapping[str, Any], layer_kind: str) -> tuple[Mapping[str, Any], str]:
    """The layer's RoPE settings: `rope_parameters` (or transformers 4's `rope_scaling`), or,
    where they are given per layer kind (Gemma 3's local and global bases), its kind's."""
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = config.get(key) or {}
    if not isinstance(rope, Mapping):
        raise TypeError(
            f"config's {key} must be a dict (rope_type, rope_theta, ...), got "
            f"{rope!r:.60} ({type(rope).__name__})"
        )
    if rope and all(isinstance(value, Mapping) for value in rope.values()):  # per layer kind
        kind = "full_attention" if layer_kind == "global" else layer_kind
        if kind not in rope:
            raise ValueError(f"config's {key} has no entry for the layer's {kind!r}")
        return rope[kind], f"{key}[{kind!r}]"
    return rope, key


def _rope_scaling(config: Mapping[str, Any], layer_kind: str) -> RopeScaling | None:
    """The layer's RoPE scaling and partial rotation, or None for the plain RoPE; an unknown
    `rope_type` or setting is refused by name
    ([`RopeScaling`][attention.layer.rope_scaling.RopeScaling])."""
    rope, _ = _rope_parameters(config, layer_kind)
    partial = config.get("partial_rotary_factor")
    if partial is not None and "partial_rotary_factor" not in rope:
        rope = {**rope, "partial_rotary_factor": partial}
    scaling = RopeScaling.from_parameters(rope, config.get("max_position_embeddings"))
    plain = RopeScaling(max_position_embeddings=scaling.max_position_embeddings)
    return None if scaling == plain else scaling


def _config_dict(config: object) -> tuple[Mapping[str, Any], str]:
    """The config as a mapping, and what to call it in a message (its class, or `config`)."""
    name = "config"
    if hasattr(config, "to_dict"):  # a transformers config object
        name = type(config).__name__
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(
            f"config must be a transformers config or its dict, got {type(config).__name__}"
        )
    missing = [key for key in ("hidden_size", "num_attention_heads") if key not in config]
    if missing:
        raise ValueError(f"config needs hidden_size and num_attention_heads: missing {missing}")
    return config, name


def _refuse_unread(config: Mapping[str, Any], name: str) -> None:
    """Refuse every attention setting that is on and that this module does not read."""
    known = set().union(*READ.values(), *ELSEWHERE.values())
    unread = [
        f"{key}={value!r:.40}"
        for key, value in config.items()
        if not str(key).startswith("_")
        and key not in known  # "_...": transformers' own
        and value is not None
        and value is not False
        and ATTENTION_WORDS.search(str(key))
    ]
    if unread:
        raise ValueError(
            f"{name} sets {', '.join(unread)}, which attention_from_llama does not apply: "
            "MultiHeadAttention computes no such thing, so it cannot hold this layer"
        )


def _l2_qk_norm(config: Mapping[str, Any], name: str, rope: int) -> bool:
    r"""Llama 4's `use_qk_norm`: $x / \sqrt{\operatorname{mean}(x^2) + \epsilon}$ of each query
    and key head after RoPE, on its RoPE layers (`Llama4TextL2Norm`). Without gains, that
    norm is the same before RoPE: a rotation keeps each pair's length, so the head's mean
    square; and so it is `MultiHeadAttention`'s per-head QK-norm with its gains at one. Another
    family's `use_qk_norm` (Cohere's layer norm with gains) is refused."""
    on = config.get("use_qk_norm")
    if on is None or not check_flag(f"{name}'s use_qk_norm", on):
        return False
    if config.get("model_type") != "llama4_text":
        raise ValueError(
            f"{name} sets use_qk_norm=True, which attention_from_llama does not apply: "
            "MultiHeadAttention computes no such thing, so it cannot hold this layer"
        )
    return bool(rope)


def _interleaved(config: Mapping[str, Any]) -> bool:
    """Whether the family rotates interleaved pairs (True) or halves (False)."""
    kind = config.get("model_type")
    if kind is None or kind in ROTATE_HALF:
        return False
    if kind in INTERLEAVED:
        return True
    raise ValueError(
        f"config's model_type={kind!r} is none of the families whose RoPE layout is known "
        f"(halves: {', '.join(sorted(ROTATE_HALF))}; interleaved pairs: "
        f"{', '.join(sorted(INTERLEAVED))}): its modeling code, not its settings, says how "
        "it rotates, and may differ in more (Cohere 2's full layers have no RoPE)"
    )


def _num_layers(config: Mapping[str, Any]) -> int:
    return check_size("num_hidden_layers", config.get("num_hidden_layers"))


def _layer_types(config: Mapping[str, Any]) -> list[str] | None:
    """Each layer's attention: the config's `layer_types`, or what a `config.json` without them
    means: Qwen2's (`use_sliding_window`, and a window only from layer `max_window_layers` on)
    or Gemma 2's (a window in every other layer, the first included)."""
    types = config.get("layer_types")
    if types:
        if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
            raise TypeError(
                f"config's layer_types must be a list of strings, one per layer "
                f"('full_attention', ...), got {types!r:.60}"
            )
        return list(types)
    if config.get("model_type") == "gemma2" and config.get("sliding_window") is not None:
        return [
            "sliding_attention" if i % 2 == 0 else "full_attention"
            for i in range(_num_layers(config))
        ]
    if "max_window_layers" not in config:
        return None
    windowed = bool(config.get("use_sliding_window")) and config.get("sliding_window") is not None
    first = check_size("max_window_layers", config["max_window_layers"], minimum=0)
    return [
        "sliding_attention" if windowed and i >= first else "full_attention"
        for i in range(_num_layers(config))
    ]


def _rope_layers(config: Mapping[str, Any]) -> list[int] | None:
    """Each layer's RoPE, 1 or 0: `no_rope_layers` (in transformers, 1 means the layer *uses*
    RoPE), or, with only `no_rope_layer_interval` $n$, SmolLM3's and Llama 4's rule: every
    $n$-th layer has none. None: every layer rotates."""
    flags = config.get("no_rope_layers")
    if not flags and config.get("no_rope_layer_interval") is not None:
        n = check_size("no_rope_layer_interval", config["no_rope_layer_interval"])
        flags = [int((i + 1) % n != 0) for i in range(_num_layers(config))]
    if not flags:
        return None
    if not isinstance(flags, list | tuple) or any(f not in (0, 1) for f in flags):
        raise TypeError(
            f"config's no_rope_layers must be a list of 1 (RoPE) and 0 (none), one "
            f"per layer, got {flags!r:.60}"
        )
    return [int(f) for f in flags]


def _pick(config: Mapping[str, Any], layer: int | None) -> tuple[str, int]:
    """The layer's attention kind (`full_attention`, ...) and its RoPE flag (1 or 0)."""
    types, ropes = _layer_types(config), _rope_layers(config)
    per_layer = [values for values in (types, ropes) if values]
    if not per_layer:
        return "global", 1
    if layer is None:
        if any(len(set(values)) > 1 for values in per_layer):
            differ = [
                f"{key}: {sorted(set(values), key=str)}"
                for key, values in (("layer_types", types), ("no_rope_layers", ropes))
                if values
            ]
            raise ValueError(
                f"config's layers attend differently ({'; '.join(differ)}): pass layer=, the "
                "layer's index"
            )
        layer = 0
    count = min(len(values) for values in per_layer)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < count:
        raise ValueError(f"layer must be an index into the config's {count} layers, got {layer!r}")
    return (types[layer] if types else "full_attention"), (ropes[layer] if ropes else 1)


def _mask(config: Mapping[str, Any], kind: str) -> tuple[int | None, int | None]:
    """The layer's `(window, chunk)`: Mistral's window for every layer, or per layer."""
    if kind == "global":
        window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
        return (None if window is None else check_size("sliding_window", window)), None
    if kind == "sliding_attention":
        return check_size("sliding_window", config.get("sliding_window")), None
    if kind == "chunked_attention":
        return None, check_size("attention_chunk_size", config.get("attention_chunk_size"))
    if kind != "full_attention":
        raise ValueError(
            f"the layer is {kind!r}: only full_attention, sliding_attention and "
            "chunked_attention are supported"
        )
    return None, None


def _positive(config: Mapping[str, Any], key: str) -> float | None:
    """`config[key]` as a finite number above 0, or None where it is absent or None."""
    value = config.get(key)
    if value is None:
        return None
    return check_positive(f"config's {key}", value)


def _scale(config: Mapping[str, Any], head_dim: int) -> float | None:
    """What q.k is multiplied by, where the config says other than 1 / sqrt(head_dim)."""
    multiplier = _positive(config, "attention_multiplier")  # Granite: the scale itself
    scalar = _positive(config, "query_pre_attn_scalar")  # Gemma 2: scale = scalar ** -0.5
    if multiplier is not None and scalar is not None:
        raise ValueError("config has both attention_multiplier and query_pre_attn_scalar")
    scale = multiplier if scalar is None else scalar**-0.5
    return None if scale is None or math.isclose(scale, head_dim**-0.5) else scale


def _temperature(config: Mapping[str, Any], rope: int) -> tuple[float, float] | None:
    """Llama 4's `(floor_scale, attn_scale)`, where its temperature tuning applies: NoPE layers."""
    tuning = config.get("attn_temperature_tuning")
    if tuning is None or not check_flag("config's attn_temperature_tuning", tuning) or rope:
        return None
    floor = _positive(config, "floor_scale")
    scale = config.get("attn_scale")
    if floor is None or isinstance(scale, bool) or not isinstance(scale, int | float):
        raise ValueError(
            f"config's attn_temperature_tuning needs floor_scale and attn_scale "
            f"numbers, got {floor!r} and {scale!r}"
        )
    return floor, float(scale)


def _heads(config: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """`(hidden_size, heads, kv_heads, head_dim)`, checked against each other."""
    hidden = check_size("hidden_size", config["hidden_size"])
    heads = check_size("num_attention_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim")
    head_dim = check_size("head_dim", hidden // heads if head_dim is None else head_dim)
    kv_heads = config.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else check_size("num_key_value_heads", kv_heads)
    if heads % kv_heads:
        raise ValueError(
            f"config's num_key_value_heads={kv_heads} must divide "
            f"num_attention_heads={heads} (a group of query heads per key/value "
            "head)"
        )
    return hidden, heads, kv_heads, head_dim


def _context(config: Mapping[str, Any], context_length: int | None) -> int:
    context = config.get("max_position_embeddings") if context_length is None else context_length
    if context is None:
        raise ValueError("config has no max_position_embeddings: pass context_length")
    return check_size(
        "context_length" if context_length is not None else "config's max_position_embeddings",
        context,
    )


def _bias(config: Mapping[str, Any]) -> bool:
    """`attention_bias` (Llama's), or `use_bias` (Ernie 4.5's): the projections' biases."""
    flags = [
        check_flag(f"config's {key}", config[key])
        for key in ("attention_bias", "use_bias")
        if config.get(key) is not None
    ]
    return any(flags)


def llama_layer(
    config: object, context_length: int | None = None, layer: int | None = None
) -> LlamaLayer:
    """What layer `layer` of a Llama-family `config` computes (the module's rule, above).

    Args:
        config: a transformers config, its `to_dict()`, or `config.json` read as a dict.
        context_length: the longest sequence one call takes; default
            `max_position_embeddings`.
        layer: the layer's index, needed where layers differ (`layer_types`,
            `no_rope_layers`).

    Raises:
        TypeError: `config` is neither a config nor a mapping, or a value of the wrong kind.
        ValueError: a setting it does not apply, named; an unknown RoPE type; an unknown family's
            `model_type`; sizes that disagree; layers that differ without `layer`.
    """
    config, name = _config_dict(config)
    _refuse_unread(config, name)
    hidden, heads, kv_heads, head_dim = _heads(config)
    context = _context(config, context_length)
    kind, rope = _pick(config, layer)
    window, chunk = _mask(config, kind)
    dropout = config.get("attention_dropout")
    scaling = _rope_scaling(config, kind) if rope else None
    if scaling is not None and scaling.partial_rotary_factor != 1 and _interleaved(config):
        raise ValueError(
            f"config rotates interleaved pairs of part of each head (partial_rotary_factor="
            f"{scaling.partial_rotary_factor}): only halves are rotated partially here"
        )
    return LlamaLayer(
        hidden,
        heads,
        kv_heads,
        head_dim,
        bool(rope),
        _rope_theta(config, kind),
        _interleaved(config),
        window,
        chunk,
        _bias(config),
        context,
        0.0 if dropout is None else check_dropout(dropout, "config's attention_dropout"),
        _scale(config, head_dim),
        _positive(config, "attn_logit_softcapping"),
        _temperature(config, rope),
        scaling,
        _l2_qk_norm(config, name, rope),
    )
