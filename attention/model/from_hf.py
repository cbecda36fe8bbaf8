r"""Whole models from transformers: `from_hf(hf_model)` -> a [`LlamaModel`][attention.model.llama_block.LlamaModel].

A `*ForCausalLM` of the Llama family (Llama, Mistral, Qwen2 and 3, Gemma 2 and 3, OLMo 2,
SmolLM3, Granite-free settings, ...), its mixtures of experts (Mixtral, Qwen-MoE, OLMoE,
Llama 4), Qwen3-Next (Gated DeltaNet layers) or DeepSeek-V3 (latent attention) is read into
this package's model with the same weights: its `forward(input_ids)` gives transformers'
logits, and
[`generate`][attention.model.generation.generate] drives it. Nothing is read from a list of
model types except RoPE's pair layout (the attention loader's table); what a model computes
is read from its config and its modules, and every setting the loader does not apply is
refused by name:

- **attention**, layer by layer: [`attention_from_llama`][attention.model.llama.attention_from_llama]
  (heads, RoPE and its scaling, NoPE layers, windows and chunks, scale and soft cap,
  QK-norm from the state dict's `q_norm` / `k_norm`), which refuses what it does not read;
- **the block's norms** from the names the decoder layer has: `input_layernorm` and
  `post_attention_layernorm` (pre-norm: Llama), the four of Gemma (`pre_feedforward_...`,
  `post_feedforward_...`: sandwich), or only the two *post* norms (OLMo 2);
- **each norm's formula** from the norm itself: it is run on a probe and must compute
  $x/\operatorname{rms}(x) \cdot g$ (Llama) or $x/\operatorname{rms}(x) \cdot (1 + g)$
  (Gemma, whose gains are then stored as $1 + g$); anything else is refused;
- **the feed-forward**: `gate_proj`, `up_proj`, `down_proj` with `hidden_act` (or Gemma's
  `hidden_activation`), or, layer by layer, a top-k mixture of experts
  ([`MixtureOfExperts`][attention.model.experts.MixtureOfExperts]: a router `gate` whose
  weights are run on a probe, stacked `experts`, a gated `shared_expert` or DeepSeek-V3's
  `shared_experts`: Mixtral, Qwen-MoE, OLMoE, Qwen3-Next, DeepSeek-V3, Llama 4); another
  mixture, `mlp_bias`, and Granite's and Cohere's multipliers are refused by name;
- **embeddings and head**: Gemma's `embed_scale`, a tied or untied `lm_head`,
  `final_logit_softcapping`;
- **every tensor** of the state dict must be read: one left over is refused, named.

Last, unless `check=False`, both models run a short probe and the logits must agree (to
$10^{-4}$ of their scale in float32 and float64, $3 \cdot 10^{-2}$ in 16-bit floats): a family
whose modeling code does something no setting says is refused rather than loaded wrong.

Examples:
    >>> import transformers  # doctest: +SKIP
    >>> config = transformers.Qwen3Config(hidden_size=64, num_attention_heads=4,
    ...     num_key_value_heads=2, head_dim=16, num_hidden_layers=2, intermediate_size=96,
    ...     vocab_size=100)  # doctest: +SKIP
    >>> model = from_hf(transformers.Qwen3ForCausalLM(config))  # doctest: +SKIP
"""  # noqa: E501

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from attention.checks import check_flag
from attention.layer import gated_delta, latent, sparse_index
from attention.layer.multihead import MultiHeadAttention
from attention.model.experts import Router
from attention.model.llama import attention_from_llama
from attention.model.llama_block import ACTIVATIONS, LlamaModel

__all__ = ["MODULES", "MULTIPLIERS", "from_hf"]

MODULES: dict[str, Callable[[nn.Module], nn.Module]] = {
    "Qwen3NextGatedDeltaNet": gated_delta.from_transformers,
    "DeepseekV3Attention": latent.from_hf_latent,
    "DeepseekV32Attention": sparse_index.from_hf_sparse,
}
"""One attention module of a transformers model, by its class's name -> the function that
returns the package's layer with its weights."""

_DENSE = {"gate_proj", "up_proj", "down_proj"}
_MIXTURE = ("gate", "router", "experts", "shared_expert", "shared_expert_gate", "shared_experts")
_SHARED = ("shared_expert", "shared_experts")  # Qwen's name, DeepSeek-V3's
_RENAMED = tuple((f".{ours}.", f".{theirs}.") for ours, theirs in [_SHARED, ("gate", "router")])
"""Our name in a feed-forward's state -> another family's: DeepSeek-V3's shared experts,
Llama 4's router."""

MULTIPLIERS = ("embedding_multiplier", "logits_scaling", "logit_scale", "residual_multiplier")
"""Granite's and Cohere's scalings of the embeddings, logits and residuals: refused unless 1."""

_PLACEMENTS = {  # the decoder layer's norms -> (placement, our name for each)
    ("input_layernorm", "post_attention_layernorm"): (
        "pre", {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}),
    ("input_layernorm", "post_attention_layernorm", "post_feedforward_layernorm",
     "pre_feedforward_layernorm"): (
        "sandwich", {"input_layernorm": "norm1", "post_attention_layernorm": "post_att_norm",
                     "pre_feedforward_layernorm": "norm2",
                     "post_feedforward_layernorm": "post_ff_norm"}),
    ("post_attention_layernorm", "post_feedforward_layernorm"): (
        "post", {"post_attention_layernorm": "post_att_norm",
                 "post_feedforward_layernorm": "post_ff_norm"}),
}  # fmt: skip


def from_hf(hf_model: nn.Module, *, check: bool = True) -> LlamaModel | nn.Module:
    """transformers' `*ForCausalLM` as a [`LlamaModel`][attention.model.llama_block.LlamaModel]
    with the same weights (copies), in their dtype and on their device, in eval mode; or one
    attention module of a transformers model (a class named in `MODULES`, such as Qwen3-Next's
    `linear_attn`, `Qwen3NextGatedDeltaNet`, or DeepSeek-V3.2's `self_attn`,
    `DeepseekV32Attention`) as the package's layer with the same weights.

    Args:
        hf_model: a Llama-family `*ForCausalLM` (`LlamaForCausalLM`, `Qwen3ForCausalLM`,
            `Gemma3ForCausalLM`, `Olmo2ForCausalLM`, `MistralForCausalLM`,
            `SmolLM3ForCausalLM`, ...), or an attention module of a class in `MODULES`.
        check: run both models on a probe and refuse the model if their logits differ
            (whole models only).

    Raises:
        TypeError: `hf_model` is not a transformers model with a config.
        ValueError: a setting, module or tensor it does not apply, named; or logits that
            differ on the probe.
    """
    check = check_flag("check", check)  # "no" would be truthy: a check the caller turned off
    if type(hf_model).__name__ in MODULES:
        return MODULES[type(hf_model).__name__](hf_model).eval()
    config = getattr(hf_model, "config", None)
    if not isinstance(hf_model, nn.Module) or not hasattr(config, "to_dict"):
        raise TypeError(
            f"hf_model must be a transformers *ForCausalLM (a module with a config) or an "
            f"attention module of a class in MODULES ({', '.join(MODULES)}), got "
            f"{type(hf_model).__name__}"
        )
    settings: dict[str, Any] = config.to_dict()  # type: ignore[union-attr]
    _refuse(settings)
    state = _with_gains(hf_model, dict(hf_model.state_dict()))
    n_layers = int(settings["num_hidden_layers"])
    placement, names = _placement(state)
    layers = [_attention(hf_model, state, config, i) for i in range(n_layers)]
    embedding: Any = getattr(hf_model, "get_input_embeddings")()  # noqa: B009
    head: Any = getattr(hf_model, "get_output_embeddings")()  # noqa: B009
    tied = head is not None and head.weight is embedding.weight
    scale = getattr(embedding, "embed_scale", None)
    context = next(
        (att.context_length for att in layers if isinstance(att, MultiHeadAttention)),
        settings.get("max_position_embeddings", 2048),
    )
    width = _dense_width(state, settings, n_layers)
    cfg = {
        "vocab_size": settings["vocab_size"],
        "context_length": context,
        "emb_dim": settings["hidden_size"],
        "hidden_dim": width,
        "n_layers": n_layers,
        "layers": layers,
        "act": _activation(settings),
        "norm_eps": settings.get("rms_norm_eps") or 1e-6,
        "norms": placement,
        "tie_embeddings": tied,
        "embed_scale": None if scale is None else float(scale),
        "final_softcap": settings.get("final_logit_softcapping"),
        "experts": [_experts(hf_model, state, i) for i in range(n_layers)],
    }
    like = next(layers[0].parameters())
    model = LlamaModel(cfg).to(dtype=like.dtype, device=like.device).eval()
    _copy(model, state, names, n_layers, tied)
    if check:
        _check_logits(model, hf_model)
    return model


def _attention(
    hf_model: nn.Module, state: Mapping[str, Tensor], config: object, i: int
) -> nn.Module:
    """Decoder layer `i`'s attention: a softmax `self_attn` read by `attention_from_llama`,
    or another module (Qwen3-Next's `linear_attn`) by its loader in `MODULES`."""
    prefix = f"model.layers.{i}."
    if any(key.startswith(prefix + "self_attn.") for key in state):
        module = hf_model.get_submodule(prefix + "self_attn")
        if type(module).__name__ in MODULES:  # DeepSeek-V3's latent attention
            return MODULES[type(module).__name__](module)
        return attention_from_llama(state, config, prefix=prefix + "self_attn.", layer=i)
    names = sorted(
        {
            key.removeprefix(prefix).split(".")[0]
            for key in state
            if key.startswith(prefix) and "norm" not in key and ".mlp." not in key
        }
    )
    for name in names:
        module = hf_model.get_submodule(prefix + name)
        if type(module).__name__ in MODULES:
            return MODULES[type(module).__name__](module)
    raise ValueError(
        f"decoder layer {i} has no self_attn and none of {names} is a module from_hf reads "
        f"({', '.join(MODULES)})"
    )


def _refuse(settings: Mapping[str, Any]) -> None:
    """Refuse, by name, a model-level setting that the package's model does not apply."""
    found = [
        f"{key}={settings[key]!r}" for key in MULTIPLIERS if settings.get(key) not in (None, 1, 1.0)
    ]
    if settings.get("mlp_bias"):
        found.append("mlp_bias=True")
    if found:
        raise ValueError(f"config sets {', '.join(found)}, which from_hf does not apply")
    _activation(settings)


def _dense_width(state: Mapping[str, Tensor], settings: Mapping[str, Any], n_layers: int) -> int:
    """The dense feed-forward's width, from the first layer that has one (Llama 4's is its
    `intermediate_size_mlp`, not `intermediate_size`, its experts')."""
    for i in range(n_layers):
        gate = state.get(_feed_forward(state, i) + "gate_proj.weight")
        if gate is not None:
            return int(gate.shape[0])
    return int(settings["intermediate_size"])


def _feed_forward(state: Mapping[str, Tensor], i: int) -> str:
    """Decoder layer `i`'s feed-forward's prefix: `mlp.`, or Llama 4's `feed_forward.`."""
    prefix = f"model.layers.{i}."
    llama4 = any(key.startswith(prefix + "feed_forward.") for key in state)
    return prefix + ("feed_forward." if llama4 else "mlp.")


def _experts(hf_model: nn.Module, state: Mapping[str, Tensor], i: int) -> dict[str, Any] | None:
    """Decoder layer `i`'s feed-forward: None where it is `gate_proj`, `up_proj`, `down_proj`;
    a [`MixtureOfExperts`][attention.model.experts.MixtureOfExperts]' settings where it is a
    router (`gate`, or Llama 4's `router`) and stacked `experts`, and optionally a
    `shared_expert` and its `shared_expert_gate` (Mixtral, Qwen-MoE, OLMoE, Qwen3-Next, Llama 4)
    or `shared_experts` (DeepSeek-V3); refused by name otherwise."""
    prefix = _feed_forward(state, i)
    parts = {key.removeprefix(prefix).split(".")[0] for key in state if key.startswith(prefix)}
    if parts <= _DENSE:  # (one missing, or no mlp at all: the copy names what it misses)
        return None
    module = hf_model.get_submodule(prefix[:-1])
    router = getattr(module, "gate", getattr(module, "router", None))
    experts = getattr(module, "experts", None)
    weights = [
        getattr(part, name, None)
        for part, name in ((router, "weight"), (experts, "gate_up_proj"), (experts, "down_proj"))
    ]
    one_router = len({"gate", "router"} & parts) == 1
    known = one_router and "experts" in parts and parts <= set(_MIXTURE)
    if not known or not all(isinstance(w, Tensor) for w in weights):
        raise ValueError(
            f"layer {i}'s feed-forward {type(module).__name__} has {sorted(parts)}: a mixture "
            f"of experts from_hf does not build (it builds {list(_MIXTURE)}: a router, the "
            "experts, shared ones)"
        )
    routing = _routing(router, i)  # type: ignore[arg-type]
    up = weights[1].shape  # type: ignore[union-attr]
    # (E, 2H, D), or Llama 4's (E, D, 2H): its experts multiply x by the weight, not by its T
    hidden = up[2] // 2 if routing.get("scale_input") else up[1] // 2
    shared = next(
        (
            state[prefix + f"{name}.gate_proj.weight"]
            for name in _SHARED
            if prefix + f"{name}.gate_proj.weight" in state
        ),
        None,
    )
    return {
        "num_experts": int(up[0]),
        "top_k": int(getattr(router, "top_k", 0)),
        "hidden_dim": int(hidden),
        **routing,
        "shared_dim": None if shared is None or not shared.numel() else int(shared.shape[0]),
        "shared_gate": "shared_expert_gate" in parts
        and bool(shared is not None and shared.numel()),
    }


def _adds_nothing(state: Mapping[str, Tensor], key: str) -> bool:
    """Whether `key` is a weight of a shared expert of width 0 (`n_shared_experts=0`,
    `shared_expert_intermediate_size=0`), or of its gate: it adds 0, and the model has none."""
    for name in _SHARED:
        for part in (f".{name}.", f".{name}_gate."):  # the expert, or its gate
            if part in key:
                gate = state.get(f"{key[: key.index(part)]}.{name}.gate_proj.weight")
                return gate is not None and gate.numel() == 0
    return False


def _routing(router: nn.Module, i: int) -> dict[str, Any]:
    """The [`Router`][attention.model.experts.Router] settings that compute what transformers'
    `router` computes: read from its attributes where it has DeepSeek-V3's, a sigmoid where it
    returns every expert's weight (Llama 4's, which scales the experts' inputs), else a
    softmax; then checked by running both on a probe, in float64 (a copy of `router`: a
    bfloat16 model's router is found as a float32 one's). A router that computes none is
    refused."""
    hf: Any = copy.deepcopy(router).to(torch.float64)
    weight: Tensor = hf.weight.detach()
    x = _probe(6, weight.shape[1], weight)
    with torch.no_grad():
        out = hf(x)
    if hasattr(hf, "routed_scaling_factor") or hasattr(hf, "e_score_correction_bias"):
        bias = getattr(hf, "e_score_correction_bias", None)
        candidates = [
            {
                "scoring": "sigmoid",
                "normalize": bool(hf.norm_topk_prob),
                "groups": int(getattr(hf, "num_group", getattr(hf, "n_group", 1))),
                "topk_group": int(hf.topk_group),
                "scale": float(getattr(hf, "routed_scaling_factor", 1.0)),
                "choice_bias": bias is not None,
            }
        ]
    elif isinstance(out, tuple) and len(out) == 2:  # Llama 4: (each expert's weight, logits)
        candidates = [{"scoring": "sigmoid", "normalize": False, "scale_input": True}]
    else:
        candidates = [{"scoring": "softmax", "normalize": value} for value in (False, True)]
    for settings in candidates:
        if isinstance(out, tuple) and len(out) in (2, 3) and not _differs(hf, settings, x, out):
            return settings
    raise ValueError(
        f"layer {i}'s router {type(router).__name__} computes none of the routings from_hf "
        "builds: the top-k of softmax(W_r x), those weights divided by their sum, "
        "DeepSeek-V3's grouped sigmoid, or Llama 4's sigmoid"
    )


def _differs(hf: Any, settings: dict[str, Any], x: Tensor, out: tuple[Tensor, ...]) -> bool:
    """Whether our `Router` of `settings`, with `hf`'s weights, routes the probe `x` otherwise
    than `hf` did (`out`: its logits, weights and chosen experts; or Llama 4's weight of every
    expert, 0 where not chosen, and logits)."""
    routing = {key: value for key, value in settings.items() if key != "scale_input"}
    try:
        ours = Router(hf.weight.shape[1], hf.weight.shape[0], int(hf.top_k), **routing)
    except (TypeError, ValueError):
        return True
    ours = ours.double()
    with torch.no_grad():
        ours.weight.copy_(hf.weight)
        if ours.e_score_correction_bias is not None:
            ours.e_score_correction_bias.copy_(hf.e_score_correction_bias)
        weights, picked = ours(x.double())
        mine = torch.zeros(x.shape[0], ours.num_experts, dtype=torch.float64).scatter(
            -1, picked, weights
        )  # (6, E): each expert's weight, 0 where not chosen
    if len(out) == 2:
        theirs = out[0].double()
    else:
        _, values, chosen = out
        theirs = torch.zeros_like(mine).scatter(-1, chosen.long(), values.double())
    if not torch.equal(theirs != 0, mine != 0):
        return True
    # float32's precision: transformers takes some routers' softmax in float32 (Qwen's), and
    # the routings told apart here differ by far more (a sum of weights, a sigmoid)
    error = float((theirs - mine).abs().max())
    return not error <= 1e-5 * (1 + float(mine.abs().max()))


def _activation(settings: Mapping[str, Any]) -> str:
    """The feed-forward's gate activation: Gemma's `hidden_activation`, else `hidden_act`."""
    key = "hidden_activation" if settings.get("hidden_activation") else "hidden_act"
    act = settings.get(key, "silu")
    if act not in ACTIVATIONS:
        raise ValueError(
            f"config's {key}={act!r} is none of the activations from_hf applies: "
            f"{', '.join(ACTIVATIONS)}"
        )
    return str(act)


def _probe(rows: int, width: int, like: Tensor) -> Tensor:
    """The same seeded random inputs `(rows, width)` every time, in `like`'s dtype and device:
    what a module of transformers is run on to find what it computes."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(rows, width, generator=generator).to(like.device, like.dtype)


def _gain_offset(module: nn.Module) -> float:
    """0 if `module` computes x / rms(x) * g (Llama), 1 if x / rms(x) * (1 + g) (Gemma):
    found by running it on a probe; anything else is refused."""
    weight: Tensor = getattr(module, "weight").detach()  # noqa: B009
    x = _probe(3, weight.shape[0], weight)
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    with torch.no_grad():
        out = module(x).double()
    normed = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)
    tolerance = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 3e-2
    for offset in (0.0, 1.0):
        want = normed * (weight.double() + offset)
        if float((out - want).abs().max()) <= tolerance * (1 + float(want.abs().max())):
            return offset
    raise ValueError(
        f"{type(module).__name__} computes neither x / rms(x) * weight (Llama's RMSNorm) nor "
        "x / rms(x) * (1 + weight) (Gemma's): from_hf does not apply it"
    )


def _with_gains(hf_model: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """`state` with every norm's gain as the package's `RMSNorm` applies it (Gemma's 1 + g)."""
    offsets: dict[type, float] = {}
    loaded = tuple(
        f"{name}." for name, module in hf_model.named_modules() if type(module).__name__ in MODULES
    )
    for name, module in hf_model.named_modules():
        key = f"{name}.weight"
        if "norm" not in name.rsplit(".", 1)[-1] or key not in state or key.startswith(loaded):
            continue  # (a module of MODULES, and its norms, its loader reads as they are)
        kind = type(module)
        if kind not in offsets:
            offsets[kind] = _gain_offset(module)
        if offsets[kind]:
            state[key] = state[key] + offsets[kind]
    return state


def _placement(state: Mapping[str, Tensor]) -> tuple[str, dict[str, str]]:
    """The block's norm placement, from the norms decoder layer 0 has."""
    prefix = "model.layers.0."
    norms = tuple(
        sorted(
            key.removeprefix(prefix).removesuffix(".weight")
            for key in state
            if key.startswith(prefix) and key.count(".") == 4 and "norm" in key
        )
    )
    if norms not in _PLACEMENTS:
        raise ValueError(
            f"the decoder layers' norms {list(norms)} are none of the placements from_hf "
            f"builds: {[list(names) for names in _PLACEMENTS]}"
        )
    return _PLACEMENTS[norms]


def _copy(
    model: LlamaModel,
    state: Mapping[str, Tensor],
    names: Mapping[str, str],
    n_layers: int,
    tied: bool,
) -> None:
    """Copy every tensor besides the attention's into `model`; refuse any left unread."""
    ours = model.state_dict(keep_vars=True)
    pairs = {
        "model.embed_tokens.weight": "tok_emb.weight",
        "model.norm.weight": "final_norm.weight",
    }
    if not tied:
        pairs["lm_head.weight"] = "out_head.weight"
    transposed: set[str] = set()
    for i in range(n_layers):
        for hf, name in names.items():
            pairs[f"model.layers.{i}.{hf}.weight"] = f"trf_blocks.{i}.{name}.weight"
        ff, prefix = model.blocks[i].ff, _feed_forward(state, i)
        for name in ff.state_dict():  # the same names (the router's bias is a buffer), but
            hf = prefix + name
            for ours_, theirs_ in _RENAMED:  # DeepSeek-V3's shared_experts, Llama 4's router
                if hf.replace(ours_, theirs_) in state:
                    hf = hf.replace(ours_, theirs_)
            pairs[hf] = f"trf_blocks.{i}.ff.{name}"
            if getattr(ff, "scale_input", False) and name.startswith("experts."):
                transposed.add(hf)  # Llama 4's experts: (E, D, 2H) and (E, H, D)
    read = set(pairs) | {"lm_head.weight"} if tied else set(pairs)
    unread = sorted(
        key
        for key in state
        if key not in read
        and ".self_attn." not in key
        and ".linear_attn." not in key
        and not _adds_nothing(state, key)
    )
    missing = sorted(key for key in pairs if key not in state)
    if unread or missing:
        raise ValueError(
            f"from_hf does not read {unread[:6]}{' ...' if len(unread) > 6 else ''} and "
            f"misses {missing[:6]}: not a model of the Llama block"
        )
    with torch.no_grad():
        for hf, name in pairs.items():
            value = state[hf].transpose(-1, -2) if hf in transposed else state[hf]
            if ours[name].shape != value.shape:
                raise ValueError(
                    f"{hf}: expected shape {tuple(ours[name].shape)}, got {tuple(value.shape)}"
                )
            ours[name].copy_(value)


def _check_logits(model: LlamaModel, hf_model: nn.Module) -> None:
    """Both models' logits on a probe of up to 8 tokens; refuse where they differ."""
    num_tokens = min(8, model.context_length)
    device = model.tok_emb.weight.device
    ids = (torch.arange(num_tokens, device=device) * 7 + 3)[None] % model.vocab_size  # (1, T)
    training = hf_model.training
    try:
        with torch.no_grad():
            theirs = hf_model.eval()(input_ids=ids).logits.double()
            ours = model(ids).double()
    finally:
        hf_model.train(training)
    dtype = model.tok_emb.weight.dtype
    tolerance = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
    error, scale = float((ours - theirs).abs().max()), float(theirs.abs().max())
    if not error <= tolerance * (1 + scale):
        raise ValueError(
            f"the loaded model's logits differ from transformers' by {error:.3g} (largest "
            f"{scale:.3g}, tolerance {tolerance:g} of it) on a probe of {num_tokens} tokens: "
            f"{type(hf_model).__name__} computes something from_hf does not read"
        )
