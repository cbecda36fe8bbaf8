r"""Hugging Face's GPT-2 and the book's `GPTModel`: one table of tensors, read both ways.

A trained model is a dictionary of named tensors. Loading one into another library's classes
is a matter of three things, never of arithmetic: the **names**, the **layout** of each
tensor, and which tensors are **fused** into one. This module writes GPT-2's correspondence
down once, as a table of slots, and reads it in both directions, so that what is loaded is
exactly what is saved (the round trips are tested bit for bit).

Hugging Face's `GPT2LMHeadModel` and the book's [`GPTModel`][attention.model.gpt.GPTModel]
are the same network. Per block $i$ (Hugging Face's names without their `transformer.`
prefix):

| Hugging Face | ours | layout |
| --- | --- | --- |
| `wte.weight`, `wpe.weight` | `tok_emb.weight`, `pos_emb.weight` | the same |
| `h.i.ln_1.weight`, `.bias` | `trf_blocks[i].norm1.scale`, `.shift` | the same |
| `h.i.attn.c_attn.weight` | `att.W_query`, `W_key`, `W_value` weights | transposed, fused |
| `h.i.attn.c_attn.bias` | their biases (zeros without `qkv_bias`) | fused |
| `h.i.attn.c_proj` | `att.out_proj` | weight transposed |
| `h.i.ln_2` | `norm2` | the same |
| `h.i.mlp.c_fc`, `h.i.mlp.c_proj` | `ff.layers[0]`, `ff.layers[2]` | weights transposed |
| `ln_f` | `final_norm` | the same |
| `lm_head.weight` | `out_head.weight` | the same; absent when tied to `wte` |

Hugging Face keeps GPT-2's projections in `Conv1D` modules, whose weight is stored
`(in, out)`, the transpose of an `nn.Linear`'s `(out, in)`, and computes the query, key and
value projections in one matrix, $[W_q\; W_k\; W_v]$, split after the product. Its checkpoints
also carry two buffers that are not weights (`attn.bias`, the causal mask, and
`attn.masked_bias`), ignored here. [`gpt2_from_hf`][attention.model.hf_gpt2.gpt2_from_hf]
reads a state dict, a `.safetensors` or `.bin` file, or a `save_pretrained` directory
([`attention.model.files`][attention.model.files]);
[`gpt2_to_hf`][attention.model.hf_gpt2.gpt2_to_hf] writes the state dict back.

Examples:
    >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": True}
    >>> model = GPTModel(cfg).eval()
    >>> state = gpt2_to_hf(model)  # Hugging Face's names and layouts
    >>> state["transformer.h.0.attn.c_attn.weight"].shape  # (in, 3 out): W_q, W_k, W_v
    torch.Size([32, 96])
    >>> again = gpt2_from_hf(state, n_heads=4)
    >>> all(torch.equal(a, b) for a, b in zip(gpt2_to_hf(again).values(), state.values()))
    True
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from attention.checks import check_size, check_tensor
from attention.layer.masks import causal
from attention.layer.multihead import MultiHeadAttention
from attention.model.files import as_device, read_source, uninitialised
from attention.model.gpt import GPTModel, LayerNorm

__all__ = [
    "GPT2_HEADS",
    "gpt2_from_hf",
    "gpt2_from_pretrained",
    "gpt2_to_hf",
    "gpt2_unsupported",
]

GPT2_HEADS = {768: 12, 1024: 16, 1280: 20, 1600: 25}
"""The GPT-2 family's heads by width: small, medium, large, XL (64 dimensions per head)."""

# ---------------------------------------------------------------------------------------------
# GPT-2: the one table, read both ways


class Slot(NamedTuple):
    """One tensor of Hugging Face's GPT-2 and the parameters of ours it holds."""

    key: str  # Hugging Face's name, without `transformer.`
    parts: tuple[Tensor | None, ...]  # ours, stacked along its output dimension; None: no bias
    shape: tuple[int, ...]  # Hugging Face's shape
    conv: bool  # stored (in, out): the transpose of ours


def _linear_slots(key: str, *linears: nn.Linear, conv: bool = True) -> list[Slot]:
    """A weight and a bias slot for `nn.Linear`s fused along their outputs (a `Conv1D`)."""
    out = sum(int(linear.weight.shape[0]) for linear in linears)
    d_in = int(linears[0].weight.shape[1])
    weights = tuple(linear.weight for linear in linears)
    biases = tuple(linear.bias for linear in linears)
    return [
        Slot(f"{key}.weight", weights, (d_in, out) if conv else (out, d_in), conv),
        Slot(f"{key}.bias", biases, (out,), False),
    ]


def _norm_slots(key: str, norm: LayerNorm) -> list[Slot]:
    shape = tuple(norm.scale.shape)
    return [
        Slot(f"{key}.weight", (norm.scale,), shape, False),
        Slot(f"{key}.bias", (norm.shift,), shape, False),
    ]


def gpt2_slots(model: GPTModel) -> list[Slot]:
    """Every tensor of Hugging Face's `GPT2Model`, in its order, and where ours keeps it."""
    assert model.pos_emb is not None  # gpt2_unsupported() was asked first
    slots = [
        Slot(f"{name}.weight", (emb.weight,), tuple(emb.weight.shape), False)
        for name, emb in (("wte", model.tok_emb), ("wpe", model.pos_emb))
    ]
    blocks = model.blocks
    for i, block in enumerate(blocks):
        att, h = block.att, f"h.{i}"
        fc, proj = block.ff.layers[0], block.ff.layers[2]
        assert isinstance(fc, nn.Linear) and isinstance(proj, nn.Linear)
        slots += _norm_slots(f"{h}.ln_1", block.norm1)
        slots += _linear_slots(f"{h}.attn.c_attn", att.W_query, att.W_key, att.W_value)
        slots += _linear_slots(f"{h}.attn.c_proj", att.out_proj)
        slots += _norm_slots(f"{h}.ln_2", block.norm2)
        slots += _linear_slots(f"{h}.mlp.c_fc", fc)
        slots += _linear_slots(f"{h}.mlp.c_proj", proj)
    return slots + _norm_slots("ln_f", model.final_norm)


def read_slot(slot: Slot, like: Tensor) -> Tensor:
    """Hugging Face's tensor from ours: stacked, transposed, a fresh contiguous copy."""
    if any(part is None for part in slot.parts):  # no qkv_bias: Hugging Face's zero bias
        return torch.zeros(slot.shape, dtype=like.dtype, device=like.device)
    parts = [part.detach() for part in slot.parts if part is not None]
    if slot.conv:  # (out, in) each -> (in, sum of outs)
        return torch.cat([part.t() for part in parts], dim=1).contiguous()
    return torch.cat(parts).contiguous()


def _checked(slot: Slot, value: object, name: str) -> Tensor:
    """Hugging Face's tensor `value` (called `name` in the source), checked, in our layout."""
    value = check_tensor(name, value, floating=True)
    if tuple(value.shape) != slot.shape:
        raise ValueError(f"{name}: expected shape {slot.shape}, got {tuple(value.shape)}")
    if any(part is None for part in slot.parts) and bool(value.any()):
        raise ValueError(
            f"{name} is not zero, and the model has no query/key/value bias: "
            "build it with qkv_bias=True"
        )
    return value.t() if slot.conv else value


def _write_slot(slot: Slot, value: Tensor) -> None:
    """Copy a checked tensor into our parameters, in place (keeping their memory layout)."""
    if any(part is None for part in slot.parts):  # a zero bias the model does not have
        return
    sizes = [part.shape[0] for part in slot.parts if part is not None]
    with torch.no_grad():
        for part, piece in zip(slot.parts, value.split(sizes), strict=True):
            assert part is not None
            part.copy_(piece)


def _what_gpt2_lacks(att: MultiHeadAttention) -> list[str]:
    """What one attention computes beyond GPT-2's: causal, learned positions, one key/value
    head per query head, $1/\\sqrt{d_h}$, nothing added to the scores."""
    rule = att.rule
    mask = []
    if rule != causal():
        window = att.window is not None and rule.bounds.causal
        named = f"the mask {rule!r} (GPT-2's: causal())"
        mask = ["a sliding window (window)" if window else named]
        if att.sinks and window:
            mask.append("attention sinks (sinks)")
    return mask + [
        why
        for why, bad in [
            ("rotary positions (rope_base)", att.rope),
            ("grouped-query attention (n_kv_heads)", att.num_kv_heads != att.num_heads),
            ("sink logits (sink_logit)", att.sink_logits is not None),
            (f"score modifiers {list(att.score_mods)}", bool(att.score_mods)),
            (f"a scale of its own (scale={att.scale})", att.scale is not None),
        ]
        if bad
    ]


def gpt2_unsupported(model: GPTModel) -> list[str]:
    """What of `model` Hugging Face's GPT-2 (and the book's layout) cannot hold: empty for GPT-2.

    Each block's attention is asked what it computes (its mask, positions, heads, score
    modifiers, sink logits, scale); every difference from GPT-2's is named once, in the
    order first met.

    Examples:
        >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
        >>> gpt2_unsupported(GPTModel(cfg))
        []
        >>> gpt2_unsupported(GPTModel({**cfg, "n_kv_heads": 2, "rope_base": 10000.0}))
        ['rotary positions (rope_base)', 'grouped-query attention (n_kv_heads)']
    """
    reasons = [] if model.pos_emb is not None else ["rotary positions (rope_base)"]
    for block in model.trf_blocks:
        att = block.att
        if not isinstance(att, MultiHeadAttention):
            raise TypeError(f"a block's att must be a MultiHeadAttention, got {type(att).__name__}")
        reasons += [why for why in _what_gpt2_lacks(att) if why not in reasons]
    return reasons


def check_gpt2(model: object, name: str = "model") -> GPTModel:
    if not isinstance(model, GPTModel):
        raise TypeError(f"{name} must be a GPTModel, got {type(model).__name__}")
    reasons = gpt2_unsupported(model)
    if reasons:
        raise ValueError(
            "Hugging Face's GPT-2 holds the plain GPT-2 configuration only; this model uses "
            + ", ".join(reasons)
        )
    return model


def gpt2_to_hf(model: GPTModel) -> dict[str, Tensor]:
    """`model`'s weights as a Hugging Face `GPT2LMHeadModel` state dict, names and layouts.

    Every key of `GPT2LMHeadModel.state_dict()`, in its order: `transformer.wte.weight`, ...,
    `transformer.ln_f.bias`, `lm_head.weight` (written even when it equals `wte`). Fresh
    contiguous tensors on `model`'s device and in its dtype, ready for
    `hf.load_state_dict(...)` or `safetensors.torch.save_file`. Without `qkv_bias` the fused
    `c_attn.bias` is zeros, as Hugging Face's GPT-2 always has one.

    Args:
        model: a plain GPT-2 `GPTModel` (learned positions, one key/value head per query head,
            no window, no sinks).

    Returns:
        The state dict.

    Raises:
        TypeError: `model` is not a `GPTModel`.
        ValueError: it uses what GPT-2 cannot hold, named.

    Examples:
        >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        ...        "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False}
        >>> state = gpt2_to_hf(GPTModel(cfg))
        >>> list(state)[:3], len(state)
        (['transformer.wte.weight', 'transformer.wpe.weight', 'transformer.h.0.ln_1.weight'], 17)
        >>> bool(state["transformer.h.0.attn.c_attn.bias"].any())  # no qkv_bias: zeros
        False
    """
    model = check_gpt2(model)
    like = model.tok_emb.weight
    state = {f"transformer.{slot.key}": read_slot(slot, like) for slot in gpt2_slots(model)}
    state["lm_head.weight"] = model.out_head.weight.detach().clone(
        memory_format=torch.contiguous_format
    )  # GPTModel keeps it (in, out) in memory
    return state


# ---------------------------------------------------------------------------------------------
# GPT-2 from Hugging Face: a state dict, a file, a directory

_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")  # the causal mask: not a weight
_BLOCK = re.compile(r"h\.(\d+)\.")


def _hf_names(state: Mapping[str, Any]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Weights by Hugging Face's name without `transformer.`, and each one's name in `state`."""
    weights: dict[str, Tensor] = {}
    names: dict[str, str] = {}
    for name, value in state.items():
        key = str(name).removeprefix("transformer.")
        if _BUFFER.fullmatch(key):
            continue
        if key in names:
            raise ValueError(f"state dict has both {names[key]} and {name}")
        weights[key], names[key] = value, str(name)
    return weights, names


def _embedding(weights: Mapping[str, Tensor], key: str) -> Tensor:
    if key not in weights:
        raise ValueError(f"state dict has no {key} (nor transformer.{key}): not GPT-2's")
    return check_tensor(key, weights[key], ndim=2, floating=True)


def _gpt2_cfg(weights: Mapping[str, Tensor], n_heads: int) -> dict[str, Any]:
    """The book's configuration from the shapes of Hugging Face's tensors."""
    vocab_size, emb_dim = _embedding(weights, "wte.weight").shape
    context_length = _embedding(weights, "wpe.weight").shape[0]
    blocks = {int(m.group(1)) for key in weights if (m := _BLOCK.match(key))}
    if not blocks:
        raise ValueError("state dict has no transformer block (h.0.*): not GPT-2's")
    if emb_dim % n_heads:
        raise ValueError(
            f"n_heads must divide the width {emb_dim} (wte.weight's columns), got n_heads={n_heads}"
        )
    return {
        "vocab_size": int(vocab_size),
        "context_length": int(context_length),
        "emb_dim": int(emb_dim),
        "n_heads": n_heads,
        "n_layers": max(blocks) + 1,
        "drop_rate": 0.0,
        "qkv_bias": True,
    }


def load_gpt2(model: GPTModel, weights: Mapping[str, Tensor], names: Mapping[str, str]) -> None:
    """Copy every slot from `weights`; the head from `lm_head.weight`, or else `wte.weight`."""
    slots = gpt2_slots(model)
    expected = {slot.key for slot in slots} | {"lm_head.weight"}
    unknown = sorted(names[key] for key in weights if key not in expected)
    missing = [
        f"{names.get(slot.key, slot.key)} {slot.shape}" for slot in slots if slot.key not in weights
    ]
    if unknown or missing:
        raise ValueError(
            "not the weights of this GPT-2: "
            + (f"unknown keys {unknown}" if unknown else "")
            + ("; " if unknown and missing else "")
            + (f"missing (with their shapes) {missing}" if missing else "")
        )
    head = "lm_head.weight" if "lm_head.weight" in weights else "wte.weight"
    slots.append(Slot(head, (model.out_head.weight,), tuple(model.out_head.weight.shape), False))
    values = [_checked(slot, weights[slot.key], names[slot.key]) for slot in slots]  # all first
    for slot, value in zip(slots, values, strict=True):
        _write_slot(slot, value)


def _n_heads(n_heads: int | None, config: Mapping[str, Any] | None, emb_dim: int) -> int:
    """The heads: the argument, else `config.json`'s `n_head`, else GPT-2's for this width."""
    from_config = None if config is None else config.get("n_head")
    if from_config is not None:
        from_config = check_size("config.json's n_head", from_config)
    if n_heads is not None:
        check_size("n_heads", n_heads)
        if from_config is not None and from_config != n_heads:
            raise ValueError(f"n_heads={n_heads}, but config.json says n_head={from_config}")
        return n_heads
    if from_config is not None:
        return from_config
    if emb_dim in GPT2_HEADS:
        return GPT2_HEADS[emb_dim]
    raise ValueError(
        f"the heads cannot be read from a state dict's shapes, and width {emb_dim} is none of "
        f"GPT-2's ({', '.join(f'{w}: {h}' for w, h in GPT2_HEADS.items())}): pass n_heads"
    )


def _check_hf_config(config: Mapping[str, Any]) -> None:
    """Refuse a `config.json` that is not GPT-2's arithmetic (the shapes check the rest)."""
    expected = {
        "model_type": ("gpt2",),
        "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
        "layer_norm_epsilon": (1e-5,),
        "scale_attn_weights": (True,),
        "scale_attn_by_inverse_layer_idx": (False,),
    }
    for key, allowed in expected.items():
        if key in config and config[key] not in allowed:
            raise ValueError(
                f"config.json has {key}={config[key]!r}; GPT-2 (and GPTModel) "
                f"compute with {' or '.join(map(repr, allowed))}"
            )


def _check_config_against(config: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
    """Refuse a `config.json` that the tensors contradict (a block missing, say)."""
    pairs = {
        "n_layer": "n_layers",
        "n_embd": "emb_dim",
        "n_positions": "context_length",
        "vocab_size": "vocab_size",
    }
    for key, ours in pairs.items():
        if key in config and check_size(f"config.json's {key}", config[key]) != cfg[ours]:
            raise ValueError(
                f"config.json says {key}={config[key]!r}, but the weights hold "
                f"{cfg[ours]}: a missing or extra tensor, or another model's "
                "config"
            )


def gpt2_from_hf(
    source: Mapping[str, Tensor] | str | os.PathLike[str],
    *,
    n_heads: int | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> GPTModel:
    """A `GPTModel` holding Hugging Face GPT-2 weights, in eval mode: the same logits.

    The configuration is read from the tensors' shapes (vocabulary, context, width, blocks)
    with `qkv_bias=True` (GPT-2's `c_attn` has a bias). The heads, which no shape shows, come
    from `n_heads`, else the directory's `config.json`, else GPT-2's own for the width
    ([`GPT2_HEADS`][attention.model.hf_gpt2.GPT2_HEADS]). Without `lm_head.weight` (tied to `wte`:
    `GPT2Model`, or a `safetensors` file, which stores a tied tensor once) the head is a copy
    of `wte`. The buffers `attn.bias` and `attn.masked_bias` are ignored.

    Args:
        source: a `GPT2LMHeadModel` or `GPT2Model` state dict (keys with or without
            `transformer.`), a `.safetensors` file, a `.bin`/`.pt` file (read with
            `weights_only=True`), or a directory written by `save_pretrained`.
        n_heads: the number of heads.
        dtype: the model's dtype; default the checkpoint's (`wte`'s).
        device: where the model is built; default where `wte` is.

    Returns:
        The model.

    Raises:
        TypeError: `source` or `device` of another kind, a tensor that is not floating point,
            or a `config.json` size that is not an int.
        ValueError: a missing or unknown key, a wrong shape (each named, with the expected and
            the actual shape), unknown heads, or a `config.json` that is not GPT-2's; a file
            that cannot be read (an empty, truncated or corrupted checkpoint, a pickle of more
            than tensors, invalid JSON, an index without its `weight_map`), named with what
            is wrong with it, the reader's own error chained.
        FileNotFoundError: no such file or directory, or a shard an index names.

    Examples:
        >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": True}
        >>> model = GPTModel(cfg).eval()
        >>> state = gpt2_to_hf(model)
        >>> del state["lm_head.weight"]  # tied, as in GPT-2's own checkpoints
        >>> loaded = gpt2_from_hf(state, n_heads=4)
        >>> torch.equal(loaded.out_head.weight, model.tok_emb.weight)
        True
        >>> gpt2_from_hf(state)  # 32 wide: not a GPT-2 width
        Traceback (most recent call last):
        ...
        ValueError: the heads cannot be read from a state dict's shapes, and width 32 is none of GPT-2's (768: 12, 1024: 16, 1280: 20, 1600: 25): pass n_heads
    """  # noqa: E501
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    state, config = read_source(source)
    if config is not None:
        _check_hf_config(config)
    weights, names = _hf_names(state)
    wte = _embedding(weights, "wte.weight")
    cfg = _gpt2_cfg(weights, _n_heads(n_heads, config, int(wte.shape[1])))
    if config is not None:
        _check_config_against(config, cfg)
    where = wte.device if device is None else as_device(device)
    model = uninitialised(lambda: GPTModel(cfg), dtype or wte.dtype, where)
    load_gpt2(model, weights, names)
    return model


def gpt2_from_pretrained(
    name: str = "openai-community/gpt2",
    *,
    revision: str | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> GPTModel:
    """Download a GPT-2 from the Hugging Face Hub and load it with `gpt2_from_hf`.

    Fetches `config.json` and the `safetensors` weights only (through `huggingface_hub`'s
    `snapshot_download`, which caches them).

    Args:
        name: the repository: `openai-community/gpt2`, `-medium`, `-large`, `-xl`.
        revision: a branch, tag or commit; default the newest.
        dtype: the model's dtype; default the checkpoint's.
        device: where to build it.

    Raises:
        ImportError: `huggingface_hub` is not installed.

    Examples:
        >>> callable(gpt2_from_pretrained)  # needs the network: see gpt2_from_hf
        True
    """
    if not isinstance(name, str):
        raise TypeError(
            f"name must be a Hub repository such as 'openai-community/gpt2', got "
            f"{name!r} ({type(name).__name__})"
        )
    if not name:
        raise ValueError("name must be a Hub repository such as 'openai-community/gpt2', got ''")
    if revision is not None and not isinstance(revision, str):
        raise TypeError(
            f"revision must be a branch, tag or commit (a str), got "
            f"{revision!r} ({type(revision).__name__})"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise ImportError(
            "gpt2_from_pretrained downloads through huggingface_hub: pip install "
            "huggingface_hub, or download the files yourself and call gpt2_from_hf(directory)"
        ) from error
    path = snapshot_download(
        name,
        revision=revision,
        allow_patterns=["config.json", "*.safetensors", "model.safetensors.index.json"],
    )
    return gpt2_from_hf(path, dtype=dtype, device=device)
