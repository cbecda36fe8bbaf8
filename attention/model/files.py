"""Checkpoint files: safetensors, pickled state dicts, sharded `save_pretrained` directories.

What every loader of [`attention.model`][attention.model] reads before it maps a single name:
a state dict given as is, one `.safetensors`, `.bin`, `.pt` or `.pth` file, or a directory
that `save_pretrained` wrote (its `config.json`, and the weights whole or in shards that an
index names). Every failure names the file and what is wrong with it, the reader's own error
chained; pickles are read with `torch.load(weights_only=True)`, which runs no code.
[`uninitialised`][attention.model.files.uninitialised] builds the module the weights are
copied into without initialising it first.

Examples:
    >>> state, config = read_source({"wte.weight": torch.zeros(2, 3)})  # a state dict: as is
    >>> list(state), config
    (['wte.weight'], None)
    >>> read_source("no/such/file.safetensors")
    Traceback (most recent call last):
    ...
    FileNotFoundError: source 'no/such/file.safetensors' is neither a file nor a directory
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

__all__ = ["as_device", "read_source", "uninitialised"]

_M = TypeVar("_M", bound=nn.Module)


def uninitialised(build: Callable[[], _M], dtype: torch.dtype, device: torch.device) -> _M:
    """`build()` in eval mode, its parameters allocated but not initialised (all are copied
    over next): built on the meta device, so no random init of a large model is wasted."""
    with torch.device("meta"):
        module = build()
    if next(module.buffers(), None) is not None:  # a buffer to keep: build it for real
        return build().to(device=device, dtype=dtype).eval()
    return module.to(dtype).to_empty(device=device).eval()


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
        raise ImportError(
            f"reading {path.name} needs safetensors: pip install safetensors"
        ) from error
    try:
        return load_file(path)
    except SafetensorError as error:
        raise ValueError(
            f"{path} is not a complete safetensors file (truncated or corrupted): {error}"
        ) from error


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
            raise ValueError(
                f"{path} pickles objects other than tensors ({reason}), which "
                "torch.load(weights_only=True) refuses to run: save the model's "
                "state_dict(), or safetensors"
            ) from error
        raise ValueError(
            f"{path} is not a PyTorch checkpoint (empty, truncated, corrupted or "
            f"another format): {reason}"
        ) from error


def _read_json(path: Path) -> Any:
    """What a JSON file of a checkpoint directory holds, or an error that names the file."""
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} is not a valid JSON file (truncated or corrupted): {error}"
        ) from error


def _shards(path: Path, index: Path) -> list[Path]:
    """The shard files an index (`model.safetensors.index.json`) names, each checked."""
    weight_map = _read_json(index)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(shard, str) for shard in weight_map.values())
    ):
        raise ValueError(
            f"{index} must hold a JSON object whose weight_map maps tensor names "
            f"to shard files, got weight_map={weight_map!r:.80}"
        )
    names = sorted(set(weight_map.values()))
    for name in names:
        if not (path / name).resolve().is_relative_to(path.resolve()):
            raise ValueError(f"{index} names a shard outside {path}: {name!r}")
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{index} names the shard {name!r}, which is not a file in {path}"
            )
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


def read_source(source: object) -> tuple[Mapping[str, Any], dict[str, Any] | None]:
    """`(state, config)` from a state dict (config None), a checkpoint file (config None) or a
    `save_pretrained` directory (its `config.json`, or None without one).

    Raises:
        TypeError: `source` is neither a mapping nor a path.
        ValueError: an empty path, or a file that cannot be read, named with what is wrong.
        FileNotFoundError: no such file or directory, or a shard its index names.
    """
    if isinstance(source, Mapping):
        return source, None
    if not isinstance(source, str | os.PathLike):
        raise TypeError(
            f"source must be a state dict, or the path of a file or directory, "
            f"got {type(source).__name__}"
        )
    if not os.fspath(source):
        raise ValueError("source must be a state dict or a path, got the empty path ''")
    path = Path(source)
    if path.is_dir():
        return _load_dir(path)
    if not path.is_file():
        raise FileNotFoundError(f"source {str(path)!r} is neither a file nor a directory")
    return _load_file(path), None


def as_device(device: object) -> torch.device:
    """`device` as a `torch.device`, or an error that names the argument.

    Examples:
        >>> as_device("cpu")
        device(type='cpu')
    """
    if isinstance(device, bool) or not isinstance(device, torch.device | str | int):
        raise TypeError(
            f"device must be a torch.device or a string such as 'cpu' or 'cuda:0', "
            f"got {device!r} ({type(device).__name__})"
        )
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"device must be a device such as 'cpu', 'cuda' or 'cuda:0', got {device!r}"
        ) from error
