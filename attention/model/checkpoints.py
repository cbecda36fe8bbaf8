r"""Weights in and out: Hugging Face's GPT-2, the book's chapter-5 layout, Llama attention.

A trained model is a dictionary of named tensors. Loading one into another library's classes
is a matter of three things, never of arithmetic: the **names**, the **layout** of each
tensor, and which tensors are **fused** into one. This module writes each correspondence down
once, as a table, and reads it in both directions, so that what is loaded is exactly what is
saved (the round trips are tested bit for bit).

**GPT-2.** Hugging Face's `GPT2LMHeadModel` and the book's
[`GPTModel`][attention.model.gpt.GPTModel] are the same network. Per block $i$ (Hugging Face's
names without their `transformer.` prefix):

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
`attn.masked_bias`), ignored here. [`gpt2_from_hf`][attention.model.checkpoints.gpt2_from_hf]
reads a state dict, a `.safetensors` or `.bin` file, or a `save_pretrained` directory;
[`gpt2_to_hf`][attention.model.checkpoints.gpt2_to_hf] writes the state dict back.

**The book's layout.** Chapter 5 reads OpenAI's TensorFlow checkpoint into nested
dictionaries, `params["blocks"][i]["attn"]["c_attn"]["w"]`, with the same tensors in the
same `(in, out)` layout as Hugging Face's: only the names differ (`w`/`b` for a projection's
weight and bias, `g`/`b` for a norm's scale and shift, `params["g"]` and `params["b"]` for
the final norm), and the output head is the token embedding (tied).
[`load_weights_into_gpt`][attention.model.checkpoints.load_weights_into_gpt] keeps the book's
name and signature; [`gpt2_to_params`][attention.model.checkpoints.gpt2_to_params] writes that
layout.

**One attention layer of Llama or Mistral.** `q_proj`, `k_proj`, `v_proj` and `o_proj` are
`nn.Linear`s, as ours are (`W_query`, `W_key`, `W_value`, `out_proj`); heads are contiguous
blocks of `head_dim` outputs, and query head $i$ reads key/value head
$\lfloor i\,h_{kv}/h \rfloor$ in both; RoPE is rotate-half with
$\theta_i = \text{base}^{-2i/d_h}$ in both, and Mistral's `sliding_window` is the number of
keys a query sees, itself included, as our `window` is. Only the output bias differs: ours
always has one, Hugging Face's only with `attention_bias`, so loading sets it to zero and
writing refuses a nonzero one.

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

import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import torch
from torch import Tensor, nn

from attention.checks import check_dropout, check_flag, check_positive, check_size, check_tensor
from attention.layer.masks import from_flags
from attention.layer.multihead import MultiHeadAttention
from attention.layer.softcap import softcap
from attention.model.gpt import GPTModel, LayerNorm

__all__ = [
    "GPT2_HEADS",
    "attention_from_llama",
    "attention_to_llama",
    "gpt2_config",
    "gpt2_from_hf",
    "gpt2_from_pretrained",
    "gpt2_to_hf",
    "gpt2_to_params",
    "gpt2_unsupported",
    "llama_attention_config",
    "load_weights_into_gpt",
]

_M = TypeVar("_M", bound=nn.Module)

GPT2_HEADS = {768: 12, 1024: 16, 1280: 20, 1600: 25}
"""The GPT-2 family's heads by width: small, medium, large, XL (64 dimensions per head)."""

# ---------------------------------------------------------------------------------------------
# GPT-2: the one table, read both ways


class _Slot(NamedTuple):
    """One tensor of Hugging Face's GPT-2 and the parameters of ours it holds."""

    key: str  # Hugging Face's name, without `transformer.`
    parts: tuple[Tensor | None, ...]  # ours, stacked along its output dimension; None: no bias
    shape: tuple[int, ...]  # Hugging Face's shape
    conv: bool  # stored (in, out): the transpose of ours


def _linear_slots(key: str, *linears: nn.Linear, conv: bool = True) -> list[_Slot]:
    """A weight and a bias slot for `nn.Linear`s fused along their outputs (a `Conv1D`)."""
    out = sum(int(linear.weight.shape[0]) for linear in linears)
    d_in = int(linears[0].weight.shape[1])
    weights = tuple(linear.weight for linear in linears)
    biases = tuple(linear.bias for linear in linears)
    return [
        _Slot(f"{key}.weight", weights, (d_in, out) if conv else (out, d_in), conv),
        _Slot(f"{key}.bias", biases, (out,), False),
    ]


def _norm_slots(key: str, norm: LayerNorm) -> list[_Slot]:
    shape = tuple(norm.scale.shape)
    return [_Slot(f"{key}.weight", (norm.scale,), shape, False),
            _Slot(f"{key}.bias", (norm.shift,), shape, False)]  # fmt: skip


def _gpt2_slots(model: GPTModel) -> list[_Slot]:
    """Every tensor of Hugging Face's `GPT2Model`, in its order, and where ours keeps it."""
    assert model.pos_emb is not None  # gpt2_unsupported() was asked first
    slots = [_Slot(f"{name}.weight", (emb.weight,), tuple(emb.weight.shape), False)
             for name, emb in (("wte", model.tok_emb), ("wpe", model.pos_emb))]  # fmt: skip
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


def _read_slot(slot: _Slot, like: Tensor) -> Tensor:
    """Hugging Face's tensor from ours: stacked, transposed, a fresh contiguous copy."""
    if any(part is None for part in slot.parts):  # no qkv_bias: Hugging Face's zero bias
        return torch.zeros(slot.shape, dtype=like.dtype, device=like.device)
    parts = [part.detach() for part in slot.parts if part is not None]
    if slot.conv:  # (out, in) each -> (in, sum of outs)
        return torch.cat([part.t() for part in parts], dim=1).contiguous()
    return torch.cat(parts).contiguous()


def _checked(slot: _Slot, value: object, name: str) -> Tensor:
    """Hugging Face's tensor `value` (called `name` in the source), checked, in our layout."""
    value = check_tensor(name, value, floating=True)
    if tuple(value.shape) != slot.shape:
        raise ValueError(f"{name}: expected shape {slot.shape}, got {tuple(value.shape)}")
    if any(part is None for part in slot.parts) and bool(value.any()):
        raise ValueError(f"{name} is not zero, and the model has no query/key/value bias: "
                         "build it with qkv_bias=True")  # fmt: skip
    return value.t() if slot.conv else value


def _write_slot(slot: _Slot, value: Tensor) -> None:
    """Copy a checked tensor into our parameters, in place (keeping their memory layout)."""
    if any(part is None for part in slot.parts):  # a zero bias the model does not have
        return
    sizes = [part.shape[0] for part in slot.parts if part is not None]
    with torch.no_grad():
        for part, piece in zip(slot.parts, value.split(sizes), strict=True):
            assert part is not None
            part.copy_(piece)


def gpt2_unsupported(model: GPTModel) -> list[str]:
    """What of `model` Hugging Face's GPT-2 (and the book's layout) cannot hold: empty for GPT-2.

    Examples:
        >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
        >>> gpt2_unsupported(GPTModel(cfg))
        []
        >>> gpt2_unsupported(GPTModel({**cfg, "n_kv_heads": 2, "rope_base": 10000.0}))
        ['rotary positions (rope_base)', 'grouped-query attention (n_kv_heads)']
    """
    reasons = []
    if model.pos_emb is None:
        reasons.append("rotary positions (rope_base)")
    atts: list[MultiHeadAttention] = [block.att for block in model.trf_blocks]  # type: ignore[misc]
    if any(att.num_kv_heads != att.num_heads for att in atts):
        reasons.append("grouped-query attention (n_kv_heads)")
    if any(att.window is not None for att in atts):
        reasons.append("a sliding window (window)")
    if any(att.sinks or att.sink_logits is not None for att in atts):
        reasons.append("attention sinks (sinks)")
    return reasons


def _check_gpt2(model: object, name: str = "model") -> GPTModel:
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
    model = _check_gpt2(model)
    like = model.tok_emb.weight
    state = {f"transformer.{slot.key}": _read_slot(slot, like) for slot in _gpt2_slots(model)}
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
        raise ValueError(f"n_heads must divide the width {emb_dim} (wte.weight's columns), "
                         f"got n_heads={n_heads}")  # fmt: skip
    return {"vocab_size": int(vocab_size), "context_length": int(context_length),
            "emb_dim": int(emb_dim), "n_heads": n_heads, "n_layers": max(blocks) + 1,
            "drop_rate": 0.0, "qkv_bias": True}  # fmt: skip


def _uninitialised(build: Callable[[], _M], dtype: torch.dtype, device: torch.device) -> _M:
    """`build()` in eval mode, its parameters allocated but not initialised (all are copied
    over next): built on the meta device, so no random init of a large model is wasted."""
    with torch.device("meta"):
        module = build()
    if next(module.buffers(), None) is not None:  # a buffer to keep: build it for real
        return build().to(device=device, dtype=dtype).eval()
    return module.to(dtype).to_empty(device=device).eval()


def _load_gpt2(model: GPTModel, weights: Mapping[str, Tensor], names: Mapping[str, str]) -> None:
    """Copy every slot from `weights`; the head from `lm_head.weight`, or else `wte.weight`."""
    slots = _gpt2_slots(model)
    expected = {slot.key for slot in slots} | {"lm_head.weight"}
    unknown = sorted(names[key] for key in weights if key not in expected)
    missing = [f"{names.get(slot.key, slot.key)} {slot.shape}" for slot in slots
               if slot.key not in weights]  # fmt: skip
    if unknown or missing:
        raise ValueError(
            "not the weights of this GPT-2: "
            + (f"unknown keys {unknown}" if unknown else "")
            + ("; " if unknown and missing else "")
            + (f"missing (with their shapes) {missing}" if missing else "")
        )
    head = "lm_head.weight" if "lm_head.weight" in weights else "wte.weight"
    slots.append(_Slot(head, (model.out_head.weight,), tuple(model.out_head.weight.shape), False))
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
    expected = {"model_type": ("gpt2",), "activation_function": ("gelu_new", "gelu_pytorch_tanh"),
                "layer_norm_epsilon": (1e-5,), "scale_attn_weights": (True,),
                "scale_attn_by_inverse_layer_idx": (False,)}  # fmt: skip
    for key, allowed in expected.items():
        if key in config and config[key] not in allowed:
            raise ValueError(f"config.json has {key}={config[key]!r}; GPT-2 (and GPTModel) "
                             f"compute with {' or '.join(map(repr, allowed))}")  # fmt: skip


def _check_config_against(config: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
    """Refuse a `config.json` that the tensors contradict (a block missing, say)."""
    pairs = {"n_layer": "n_layers", "n_embd": "emb_dim", "n_positions": "context_length",
             "vocab_size": "vocab_size"}  # fmt: skip
    for key, ours in pairs.items():
        if key in config and check_size(f"config.json's {key}", config[key]) != cfg[ours]:
            raise ValueError(f"config.json says {key}={config[key]!r}, but the weights hold "
                             f"{cfg[ours]}: a missing or extra tensor, or another model's "
                             "config")  # fmt: skip


def _load_file(path: Path) -> Mapping[str, Tensor]:
    """One checkpoint file: `.safetensors`, or a pickled state dict (`.bin`, `.pt`, `.pth`)."""
    if path.suffix == ".safetensors":
        return _load_safetensors(path)
    if path.suffix in (".bin", ".pt", ".pth"):
        state = _load_pickled(path)
        if not isinstance(state, Mapping):
            raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict")
        return state
    raise ValueError(f"source must be a .safetensors, .bin, .pt or .pth file, got {path.name!r}")


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError as error:
        raise ImportError(f"reading {path.name} needs safetensors: pip install "
                          "safetensors") from error  # fmt: skip
    try:
        return load_file(path)
    except SafetensorError as error:
        raise ValueError(f"{path} is not a complete safetensors file (truncated or corrupted): "
                         f"{error}") from error  # fmt: skip


def _load_pickled(path: Path) -> object:
    """`torch.load(path, weights_only=True)`, its errors told apart: a file that is no
    checkpoint (empty, truncated, another format) from one that pickles more than tensors."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, MemoryError):  # their messages name the file, or concern no file
        raise
    except Exception as error:  # torch's unpicklers raise any kind
        text = str(error)
        found = re.search(r"WeightsUnpickler error:\s*(.*?)(?:\. |\n|$)", text)
        reason = found.group(1) if found else text.split(". ")[0].strip() or type(error).__name__
        if "Unsupported global" in text:
            raise ValueError(f"{path} pickles objects other than tensors ({reason}), which "
                             "torch.load(weights_only=True) refuses to run: save the model's "
                             "state_dict(), or safetensors") from error  # fmt: skip
        raise ValueError(f"{path} is not a PyTorch checkpoint (empty, truncated, corrupted or "
                         f"another format): {reason}") from error  # fmt: skip


def _read_json(path: Path) -> Any:
    """What a JSON file of a checkpoint directory holds, or an error that names the file."""
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a valid JSON file (truncated or corrupted): "
                         f"{error}") from error  # fmt: skip


def _shards(path: Path, index: Path) -> list[Path]:
    """The shard files an index (`model.safetensors.index.json`) names, each checked."""
    weight_map = _read_json(index)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(shard, str) for shard in weight_map.values())
    ):
        raise ValueError(f"{index} must hold a JSON object whose weight_map maps tensor names "
                         f"to shard files, got weight_map={weight_map!r:.80}")  # fmt: skip
    names = sorted(set(weight_map.values()))
    for name in names:
        if not (path / name).resolve().is_relative_to(path.resolve()):
            raise ValueError(f"{index} names a shard outside {path}: {name!r}")
        if not (path / name).is_file():
            raise FileNotFoundError(f"{index} names the shard {name!r}, which is not a file "
                                    f"in {path}")  # fmt: skip
    return [path / name for name in names]


def _load_dir(path: Path) -> tuple[dict[str, Tensor], dict[str, Any] | None]:
    """A `save_pretrained` directory: `config.json` and the weights, sharded or not."""
    config_path = path / "config.json"
    config = _read_json(config_path) if config_path.exists() else None
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, got a {type(config).__name__}")
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (path / index_name).exists():
            shards = _shards(path, path / index_name)
            return {k: v for shard in shards for k, v in _load_file(shard).items()}, config
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return dict(_load_file(path / name)), config
    raise ValueError(f"{path} holds neither model.safetensors nor pytorch_model.bin")


def _read_source(source: object) -> tuple[Mapping[str, Any], dict[str, Any] | None]:
    if isinstance(source, Mapping):
        return source, None
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"source must be a state dict, or the path of a file or directory, "
                        f"got {type(source).__name__}")  # fmt: skip
    if not os.fspath(source):
        raise ValueError("source must be a state dict or a path, got the empty path ''")
    path = Path(source)
    if path.is_dir():
        return _load_dir(path)
    if not path.is_file():
        raise FileNotFoundError(f"source {str(path)!r} is neither a file nor a directory")
    return _load_file(path), None


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
    ([`GPT2_HEADS`][attention.model.checkpoints.GPT2_HEADS]). Without `lm_head.weight` (tied to `wte`:
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
    state, config = _read_source(source)
    if config is not None:
        _check_hf_config(config)
    weights, names = _hf_names(state)
    wte = _embedding(weights, "wte.weight")
    cfg = _gpt2_cfg(weights, _n_heads(n_heads, config, int(wte.shape[1])))
    if config is not None:
        _check_config_against(config, cfg)
    where = wte.device if device is None else _device(device)
    model = _uninitialised(lambda: GPTModel(cfg), dtype or wte.dtype, where)
    _load_gpt2(model, weights, names)
    return model


def _device(device: object) -> torch.device:
    """`device` as a `torch.device`, or an error that names the argument."""
    if isinstance(device, bool) or not isinstance(device, torch.device | str | int):
        raise TypeError(f"device must be a torch.device or a string such as 'cpu' or 'cuda:0', "
                        f"got {device!r} ({type(device).__name__})")  # fmt: skip
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device must be a device such as 'cpu', 'cuda' or 'cuda:0', got "
                         f"{device!r}") from error  # fmt: skip


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
        raise TypeError(f"name must be a Hub repository such as 'openai-community/gpt2', got "
                        f"{name!r} ({type(name).__name__})")  # fmt: skip
    if not name:
        raise ValueError("name must be a Hub repository such as 'openai-community/gpt2', got ''")
    if revision is not None and not isinstance(revision, str):
        raise TypeError(f"revision must be a branch, tag or commit (a str), got "
                        f"{revision!r} ({type(revision).__name__})")  # fmt: skip
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise ImportError(
            "gpt2_from_pretrained downloads through huggingface_hub: pip install "
            "huggingface_hub, or download the files yourself and call gpt2_from_hf(directory)"
        ) from error
    path = snapshot_download(
        name, revision=revision,
        allow_patterns=["config.json", "*.safetensors", "model.safetensors.index.json"],
    )  # fmt: skip
    return gpt2_from_hf(path, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------
# The book's chapter-5 layout: the same tensors, nested under other names


def gpt2_config(settings: Mapping[str, Any], *, drop_rate: float = 0.0) -> dict[str, Any]:
    """The book's `cfg` for OpenAI's `hparams.json` (`settings`): its keys, `qkv_bias=True`.

    Examples:
        >>> gpt2_config({"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        ...              "n_layer": 12})["emb_dim"]
        768
    """
    keys = {"n_vocab": "vocab_size", "n_ctx": "context_length", "n_embd": "emb_dim",
            "n_head": "n_heads", "n_layer": "n_layers"}  # fmt: skip
    if not isinstance(settings, Mapping):
        raise TypeError(f"settings must be hparams.json's dict, got {type(settings).__name__}")
    missing = [key for key in keys if key not in settings]
    if missing:
        raise ValueError(f"settings (hparams.json) needs {', '.join(keys)}: missing {missing}")
    cfg = {
        ours: check_size(f"settings' {theirs}", settings[theirs]) for theirs, ours in keys.items()
    }
    return {**cfg, "drop_rate": check_dropout(drop_rate, "drop_rate"), "qkv_bias": True}


def _book_path(key: str) -> tuple[str | int, ...]:
    """Where the book's `params` keeps Hugging Face's tensor `key`."""
    top = {"wte.weight": ("wte",), "wpe.weight": ("wpe",), "ln_f.weight": ("g",),
           "ln_f.bias": ("b",)}  # fmt: skip
    if key in top:
        return top[key]
    _, block, *modules, leaf = key.split(".")  # h, i, attn, c_attn, weight
    short = ("g" if modules[0].startswith("ln_") else "w") if leaf == "weight" else "b"
    return ("blocks", int(block), *modules, short)


def _show(path: Sequence[str | int]) -> str:
    return "params" + "".join(f"[{p!r}]".replace("'", '"') for p in path)


def _leaves(tree: object, path: tuple[str | int, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """`(path, value)` for every array of the nested `params`."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from _leaves(value, (*path, i))
    else:
        yield path, tree


def load_weights_into_gpt(gpt: GPTModel, params: Mapping[str, Any]) -> None:
    """The book's listing 5.5: OpenAI's GPT-2 weights, as the book's `params`, into `gpt`.

    `params` is what the book's `load_gpt2_params_from_tf_ckpt` returns (NumPy arrays, or
    tensors). As in the book, the output head is the token embedding `params["wte"]`. Every
    parameter is copied in place (the book replaces them), so `gpt` keeps its dtype, device
    and memory layout.

    Args:
        gpt: a plain GPT-2 `GPTModel` of `params`' shapes, with `qkv_bias=True` (or zero biases
            in `params`); [`gpt2_config`][attention.model.checkpoints.gpt2_config] makes its `cfg`.
        params: the nested weights.

    Raises:
        ValueError: a missing or unknown entry, or a wrong shape, each named.

    Examples:
        >>> settings = {"n_vocab": 50, "n_ctx": 16, "n_embd": 32, "n_head": 4, "n_layer": 2}
        >>> book = GPTModel(gpt2_config(settings))
        >>> with torch.no_grad():
        ...     _ = book.out_head.weight.copy_(book.tok_emb.weight)  # tied, as GPT-2 is
        >>> settings, params = gpt2_to_params(book)
        >>> params["blocks"][0]["attn"]["c_attn"]["w"].shape  # (in, 3 out)
        (32, 96)
        >>> gpt = GPTModel(gpt2_config(settings))
        >>> load_weights_into_gpt(gpt, params)
        >>> all(torch.equal(a, b) for a, b in zip(gpt.parameters(), book.parameters()))
        True
    """
    gpt = _check_gpt2(gpt, "gpt")
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be the book's nested dict, got {type(params).__name__}")
    by_path = {_book_path(slot.key): slot.key for slot in _gpt2_slots(gpt)}
    weights: dict[str, Tensor] = {}
    names: dict[str, str] = {}
    for path, value in _leaves(params):
        key = by_path.get(path)
        if key is None:
            blocks = params.get("blocks", ())
            n_blocks = len(blocks) if isinstance(blocks, list | tuple) else "no list of them"
            raise ValueError(f"{_show(path)} is not a weight of this model ({len(gpt.trf_blocks)} "
                             f"blocks; params has {n_blocks})")  # fmt: skip
        weights[key], names[key] = _array(value, _show(path)), _show(path)
    names.update({key: _show(path) for path, key in by_path.items() if key not in names})
    _load_gpt2(gpt, weights, names)


def _array(value: object, name: str) -> Tensor:
    """A leaf of the book's `params` (a NumPy array, or a tensor) as a tensor."""
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{name} must be an array of numbers (NumPy or torch), got "
                        f"{type(value).__name__} {value!r:.40}") from error  # fmt: skip


def gpt2_to_params(model: GPTModel) -> tuple[dict[str, int], dict[str, Any]]:
    """`model` in the book's layout: `(settings, params)`, as `download_and_load_gpt2` returns.

    `settings` holds `hparams.json`'s keys; `params` NumPy arrays (bfloat16 as float32, which
    holds it exactly), nested as in the book. The layout has no output head of its own: the
    book's loader ties it to `wte`, so an untied model is refused.

    Raises:
        TypeError: `model` is not a `GPTModel`.
        ValueError: `model` uses what GPT-2 cannot hold, or its `out_head` is not `tok_emb`.

    Examples:
        >>> settings = {"n_vocab": 50, "n_ctx": 16, "n_embd": 32, "n_head": 4, "n_layer": 1}
        >>> gpt2_to_params(GPTModel(gpt2_config(settings)))  # the book's own init: untied
        Traceback (most recent call last):
        ...
        ValueError: the book's layout ties the output head to wte: model.out_head.weight must equal model.tok_emb.weight
    """  # noqa: E501
    model = _check_gpt2(model)
    if not torch.equal(model.out_head.weight, model.tok_emb.weight):
        raise ValueError("the book's layout ties the output head to wte: "
                         "model.out_head.weight must equal model.tok_emb.weight")  # fmt: skip
    blocks = model.blocks
    params: dict[str, Any] = {"blocks": [{} for _ in blocks]}
    like = model.tok_emb.weight
    for slot in _gpt2_slots(model):
        *path, leaf = _book_path(slot.key)
        tree: Any = params
        for step in path:
            tree = tree[step] if isinstance(step, int) else tree.setdefault(step, {})
        value = _read_slot(slot, like).cpu()
        tree[leaf] = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    emb_dim = int(like.shape[1])
    settings = {"n_vocab": model.vocab_size, "n_ctx": model.context_length, "n_embd": emb_dim,
                "n_head": blocks[0].att.num_heads, "n_layer": len(blocks)}  # fmt: skip
    return settings, params


# ---------------------------------------------------------------------------------------------
# One attention layer of Llama or Mistral


class _Llama(NamedTuple):
    """What an attention layer needs of a Llama or Mistral configuration."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    window: int | None
    bias: bool  # attention_bias: every projection has a bias
    context_length: int
    dropout: float
    scale: float | None  # Gemma 2's query_pre_attn_scalar ** -0.5, Granite's multiplier
    softcap: float | None  # Gemma 2's attn_logit_softcapping


def _rope_theta(config: Mapping[str, Any]) -> float:
    """RoPE's base; refuses any scaling but the default (transformers 5 and 4 configs)."""
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = config.get(key) or {}
    if not isinstance(rope, Mapping):
        raise TypeError(f"config's {key} must be a dict (rope_type, rope_theta, ...), got "
                        f"{rope!r:.60} ({type(rope).__name__})")  # fmt: skip
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"config's RoPE type is {kind!r}: only the default (unscaled) RoPE "
                         "is supported")  # fmt: skip
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"config rotates part of each head (partial_rotary_factor={partial!r}): "
                         "MultiHeadAttention rotates all of it")  # fmt: skip
    name, theta = ((f"config's {key}['rope_theta']", rope["rope_theta"]) if "rope_theta" in rope
                   else ("config's rope_theta", config.get("rope_theta", 10000.0)))  # fmt: skip
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not 1 < theta < math.inf:
        raise ValueError(f"{name} must be a finite number > 1 (RoPE's base), got {theta!r}")
    return float(theta)


def _config_dict(config: object) -> Mapping[str, Any]:
    if hasattr(config, "to_dict"):  # a transformers config object
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a transformers config or its dict, got "
                        f"{type(config).__name__}")  # fmt: skip
    missing = [key for key in ("hidden_size", "num_attention_heads") if key not in config]
    if missing:
        raise ValueError(f"config needs hidden_size and num_attention_heads: missing {missing}")
    return config


def _layer_types(config: Mapping[str, Any]) -> list[str] | None:
    """Each layer's attention: the config's `layer_types`, or what a `config.json` without them
    means: Qwen2's (`use_sliding_window`, and a window only from layer `max_window_layers` on)
    or Gemma 2's (a window in every other layer, the first included)."""
    types = config.get("layer_types")
    if types:
        if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
            raise TypeError(f"config's layer_types must be a list of strings, one per layer "
                            f"('full_attention', ...), got {types!r:.60}")  # fmt: skip
        return list(types)
    if config.get("model_type") == "gemma2" and config.get("sliding_window") is not None:
        layers = check_size("num_hidden_layers", config.get("num_hidden_layers"))
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if "max_window_layers" not in config:
        return None
    layers = check_size("num_hidden_layers", config.get("num_hidden_layers"))
    windowed = bool(config.get("use_sliding_window")) and config.get("sliding_window") is not None
    first = check_size("max_window_layers", config["max_window_layers"], minimum=0)
    return ["sliding_attention" if windowed and i >= first else "full_attention"
            for i in range(layers)]  # fmt: skip


def _window(config: Mapping[str, Any], layer: int | None) -> int | None:
    """The layer's sliding window: Mistral's, for every layer; or per layer (`layer_types`,
    Qwen2's and Gemma's), which needs the layer's index."""
    types = _layer_types(config)
    if not types:
        window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
        return None if window is None else check_size("sliding_window", window)
    if layer is None:
        if len(set(types)) > 1:
            raise ValueError(f"config's layers attend differently (layer_types: "
                             f"{sorted(set(types))}): pass layer=, the layer's index")  # fmt: skip
        layer = 0
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(types):
        raise ValueError(f"layer must be an index into the config's {len(types)} layers, got "
                         f"{layer!r}")  # fmt: skip
    if types[layer] not in ("full_attention", "sliding_attention"):
        raise ValueError(f"layer {layer} is {types[layer]!r}: only full_attention and "
                         "sliding_attention are supported")  # fmt: skip
    if types[layer] == "full_attention":
        return None
    return check_size("sliding_window", config.get("sliding_window"))


def _llama(config: object, context_length: int | None, layer: int | None = None) -> _Llama:
    """The layer's sizes from a Llama or Mistral configuration."""
    config = _config_dict(config)
    hidden = check_size("hidden_size", config["hidden_size"])
    heads = check_size("num_attention_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim")
    head_dim = check_size("head_dim", hidden // heads if head_dim is None else head_dim)
    if heads * head_dim != hidden:
        raise ValueError(
            f"num_attention_heads * head_dim = {heads} * {head_dim} must equal hidden_size="
            f"{hidden}: MultiHeadAttention's out_proj is square (d_out x d_out)"
        )
    context = config.get("max_position_embeddings") if context_length is None else context_length
    if context is None:
        raise ValueError("config has no max_position_embeddings: pass context_length")
    context = check_size("context_length" if context_length is not None
                         else "config's max_position_embeddings", context)  # fmt: skip
    bias, dropout = config.get("attention_bias"), config.get("attention_dropout")
    kv_heads = config.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else check_size("num_key_value_heads", kv_heads)
    if heads % kv_heads:
        raise ValueError(f"config's num_key_value_heads={kv_heads} must divide "
                         f"num_attention_heads={heads} (a group of query heads per key/value "
                         "head)")  # fmt: skip
    _refuse_unsupported(config)
    return _Llama(
        hidden, heads, kv_heads, head_dim, _rope_theta(config), _window(config, layer),
        bias is not None and check_flag("config's attention_bias", bias), context,
        0.0 if dropout is None else check_dropout(dropout, "config's attention_dropout"),
        _scale(config, head_dim),
        _positive(config, "attn_logit_softcapping"),
    )  # fmt: skip


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


# Settings of the Llama family that change the attention in ways this layer does not express:
# each is refused by name (unless neutral) rather than silently ignored.
_UNSUPPORTED = {
    "clip_qkv": "OLMo's clip_qkv (queries, keys and values clamped)",
    "use_qk_norm": "a norm on the queries and keys (use_qk_norm)",
    "attn_temperature_tuning": "Llama 4's attention temperature tuning",
    "use_bidirectional_attention": "bidirectional attention (use_bidirectional_attention)",
}


def _refuse_unsupported(config: Mapping[str, Any]) -> None:
    found = [why for key, why in _UNSUPPORTED.items() if config.get(key) not in (None, False)]
    if str(config.get("model_type", "")).startswith("cohere"):
        found.append("Cohere's interleaved RoPE (model_type cohere)")
    if found:
        raise ValueError(f"config sets {'; '.join(found)}: MultiHeadAttention does not "
                         "compute that, so it cannot hold this layer")  # fmt: skip


def _llama_slots(
    att: MultiHeadAttention, o_bias: bool
) -> list[tuple[str, Tensor | None, tuple[int, ...]]]:
    """Hugging Face's names for our projections, and their shapes: the weights, the query,
    key and value biases if `att` has them, `o_proj.bias` if `o_bias`."""
    pairs = [("q_proj", att.W_query), ("k_proj", att.W_key), ("v_proj", att.W_value),
             ("o_proj", att.out_proj)]  # fmt: skip
    slots: list[tuple[str, Tensor | None, tuple[int, ...]]] = []
    for name, linear in pairs:
        slots.append((f"{name}.weight", linear.weight, tuple(linear.weight.shape)))
        if linear.bias is not None and (name != "o_proj" or o_bias):
            slots.append((f"{name}.bias", linear.bias, (linear.weight.shape[0],)))
    return slots


def _llama_state(state_dict: object, prefix: object) -> dict[str, Any]:
    """The tensors of `state_dict` under `prefix`, without it (and without RoPE's buffer)."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping from names to tensors (a module's "
                        f"state_dict()), got {type(state_dict).__name__}")  # fmt: skip
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str (e.g. 'model.layers.0.self_attn.'), got "
                        f"{prefix!r} ({type(prefix).__name__})")  # fmt: skip
    odd = [key for key in state_dict if not isinstance(key, str)]
    if odd:
        raise TypeError(f"state_dict's keys must be str (tensor names), got {odd[0]!r} "
                        f"({type(odd[0]).__name__})")  # fmt: skip
    state = {k.removeprefix(prefix): v for k, v in state_dict.items()
             if k.startswith(prefix) and not k.endswith("rotary_emb.inv_freq")}  # fmt: skip
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
    """A causal `MultiHeadAttention` holding one Llama or Mistral attention layer, in eval mode.

    RoPE with the config's `rope_theta`, `num_key_value_heads` key/value heads, Mistral's
    `sliding_window` as `window`. With `attention_bias` every projection has a bias; without
    it, query, key and value biases are read if the state dict has them (Qwen2's), and
    `out_proj.bias` is zero unless it has `o_proj.bias`. In the state dict's dtype and on its
    device.

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
        layer: the layer's index, where the config's `layer_types` give layers different
            attention (Qwen2's first `max_window_layers` without a window, say).

    Raises:
        TypeError: `config` is neither a config nor a mapping, `state_dict` not a mapping
            with str keys, `prefix` not a str, tensors not floating point or of more than one
            dtype, or a size, flag or probability (argument or config value) of another kind.
        ValueError: a missing or unknown key or a wrong shape (named, expected and actual),
            RoPE scaling, a RoPE base not above 1, `num_attention_heads * head_dim !=
            hidden_size`, or key/value heads that do not divide the heads.

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
    spec = _llama(config, context_length, layer)
    name, like = next(iter(state.items()))
    like = check_tensor(prefix + name, like, floating=True)
    qkv_bias = spec.bias or "q_proj.bias" in state  # Qwen2: biases on q, k, v only
    mods = [] if spec.softcap is None else [softcap(spec.softcap)]
    att = _uninitialised(lambda: MultiHeadAttention(
        spec.hidden_size, spec.hidden_size, spec.context_length, spec.dropout, spec.num_heads,
        qkv_bias, num_kv_heads=spec.num_kv_heads, window=spec.window, rope=True,
        rope_base=spec.rope_theta, score_mods=mods, scale=spec.scale), like.dtype,
        like.device)  # fmt: skip
    slots = _llama_slots(att, o_bias=spec.bias or "o_proj.bias" in state)
    unknown = sorted(prefix + key for key in state if key not in {s[0] for s in slots})
    missing = [f"{prefix}{key} {shape}" for key, _, shape in slots if key not in state]
    if unknown or missing:
        raise ValueError(f"not a Llama attention layer of this config: unknown keys {unknown}, "
                         f"missing keys {missing}")  # fmt: skip
    with torch.no_grad():
        att.out_proj.bias.zero_()  # Hugging Face's o_proj has none, unless the state has one
        for key, param, shape in slots:
            value = check_tensor(prefix + key, state[key], floating=True, like=like)
            if tuple(value.shape) != shape:
                raise ValueError(f"{prefix}{key}: expected shape {shape}, got {tuple(value.shape)}")
            assert param is not None
            param.copy_(value)
    return att


def _check_llama_like(att: object) -> MultiHeadAttention:
    if not isinstance(att, MultiHeadAttention):
        raise TypeError(f"att must be a MultiHeadAttention, got {type(att).__name__}")
    reasons = [why for why, bad in [
        ("not causal", not att.causal), ("no RoPE (rope=False)", not att.rope),
        ("attention sinks (sinks)", att.sinks > 0), ("sink logits", att.sink_logits is not None),
        ("score modifiers", bool(att.score_mods)), (f"scale={att.scale}", att.scale is not None),
        (f"mask {att.rule!r}", att.rule != from_flags(True, att.window, 0)),
        (f"d_in={att.d_in} != d_out={att.d_out}", att.d_in != att.d_out)] if bad]  # fmt: skip
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
    [`llama_attention_config`][attention.model.checkpoints.llama_attention_config] gives the config.

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
        raise ValueError("att.out_proj.bias is not zero, but without qkv_bias the layer has "
                         "attention_bias=False: Hugging Face's o_proj has no bias")  # fmt: skip
    slots = _llama_slots(att, o_bias=qkv_bias)  # attention_bias: all four have one
    return {key: param.detach().clone(memory_format=torch.contiguous_format)
            for key, param, _ in slots if param is not None}  # fmt: skip


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
    return {"hidden_size": att.d_in, "num_attention_heads": att.num_heads,
            "num_key_value_heads": att.num_kv_heads, "head_dim": att.head_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": att.rope_base},
            "sliding_window": att.window, "attention_bias": att.W_query.bias is not None,
            "max_position_embeddings": att.context_length,
            "attention_dropout": att.dropout.p}  # fmt: skip
