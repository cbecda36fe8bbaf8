"""The book's chapter-5 layout of GPT-2's weights: nested dictionaries, read and written.

Chapter 5 reads OpenAI's TensorFlow checkpoint into nested dictionaries,
`params["blocks"][i]["attn"]["c_attn"]["w"]`, with the same tensors in the same `(in, out)`
layout as Hugging Face's ([`attention.model.hf_gpt2`][attention.model.hf_gpt2]): only the names
differ (`w`/`b` for a projection's weight and bias, `g`/`b` for a norm's scale and shift,
`params["g"]` and `params["b"]` for the final norm), and the output head is the token
embedding (tied). So this module is a second set of names for the same slots:
[`load_weights_into_gpt`][attention.model.book_weights.load_weights_into_gpt] keeps the book's
name and signature, [`gpt2_to_params`][attention.model.book_weights.gpt2_to_params] writes that
layout, and [`gpt2_config`][attention.model.book_weights.gpt2_config] turns OpenAI's
`hparams.json` into the book's `cfg`.

Examples:
    >>> settings = {"n_vocab": 50, "n_ctx": 16, "n_embd": 32, "n_head": 4, "n_layer": 1}
    >>> gpt2_config(settings)["context_length"]
    16
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from attention.checks import check_dropout, check_size
from attention.model.gpt import GPTModel
from attention.model.hf_gpt2 import check_gpt2, gpt2_slots, load_gpt2, read_slot

__all__ = ["gpt2_config", "gpt2_to_params", "load_weights_into_gpt"]


def gpt2_config(settings: Mapping[str, Any], *, drop_rate: float = 0.0) -> dict[str, Any]:
    """The book's `cfg` for OpenAI's `hparams.json` (`settings`): its keys, `qkv_bias=True`.

    Examples:
        >>> gpt2_config({"n_vocab": 50257, "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        ...              "n_layer": 12})["emb_dim"]
        768
    """
    keys = {
        "n_vocab": "vocab_size",
        "n_ctx": "context_length",
        "n_embd": "emb_dim",
        "n_head": "n_heads",
        "n_layer": "n_layers",
    }
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
    top = {
        "wte.weight": ("wte",),
        "wpe.weight": ("wpe",),
        "ln_f.weight": ("g",),
        "ln_f.bias": ("b",),
    }
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
            in `params`); [`gpt2_config`][attention.model.book_weights.gpt2_config] makes its `cfg`.
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
        torch.Size([32, 96])
        >>> gpt = GPTModel(gpt2_config(settings))
        >>> load_weights_into_gpt(gpt, params)
        >>> all(torch.equal(a, b) for a, b in zip(gpt.parameters(), book.parameters()))
        True
    """
    gpt = check_gpt2(gpt, "gpt")
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be the book's nested dict, got {type(params).__name__}")
    by_path = {_book_path(slot.key): slot.key for slot in gpt2_slots(gpt)}
    weights: dict[str, Tensor] = {}
    names: dict[str, str] = {}
    for path, value in _leaves(params):
        key = by_path.get(path)
        if key is None:
            blocks = params.get("blocks", ())
            n_blocks = len(blocks) if isinstance(blocks, list | tuple) else "no list of them"
            raise ValueError(
                f"{_show(path)} is not a weight of this model ({len(gpt.trf_blocks)} "
                f"blocks; params has {n_blocks})"
            )
        weights[key], names[key] = _array(value, _show(path)), _show(path)
    names.update({key: _show(path) for path, key in by_path.items() if key not in names})
    load_gpt2(gpt, weights, names)


def _array(value: object, name: str) -> Tensor:
    """A leaf of the book's `params` (a NumPy array, or a tensor) as a tensor."""
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{name} must be an array of numbers (NumPy or torch), got "
            f"{type(value).__name__} {value!r:.40}"
        ) from error


def gpt2_to_params(model: GPTModel) -> tuple[dict[str, int], dict[str, Any]]:
    """`model` in the book's layout: `(settings, params)`, nested as `download_and_load_gpt2`
    returns them.

    `settings` holds `hparams.json`'s keys; `params` the weights, nested as in the book, as
    CPU tensors (bfloat16 as float32, which holds it exactly) where the book's download holds
    NumPy arrays of the same shapes: NumPy is not needed (nor a dependency of this package;
    with it, `.numpy()` on a leaf gives the book's array).
    [`load_weights_into_gpt`][attention.model.book_weights.load_weights_into_gpt] takes either.
    The layout has no output head of its own: the book's loader ties it to `wte`, so an untied
    model is refused.

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
    model = check_gpt2(model)
    if not torch.equal(model.out_head.weight, model.tok_emb.weight):
        raise ValueError(
            "the book's layout ties the output head to wte: "
            "model.out_head.weight must equal model.tok_emb.weight"
        )
    blocks = model.blocks
    params: dict[str, Any] = {"blocks": [{} for _ in blocks]}
    like = model.tok_emb.weight
    for slot in gpt2_slots(model):
        *path, leaf = _book_path(slot.key)
        tree: Any = params
        for step in path:
            tree = tree[step] if isinstance(step, int) else tree.setdefault(step, {})
        value = read_slot(slot, like).cpu()  # a fresh copy: params share no memory with model
        tree[leaf] = value.float() if value.dtype == torch.bfloat16 else value
    emb_dim = int(like.shape[1])
    settings = {
        "n_vocab": model.vocab_size,
        "n_ctx": model.context_length,
        "n_embd": emb_dim,
        "n_head": blocks[0].att.num_heads,
        "n_layer": len(blocks),
    }
    return settings, params
