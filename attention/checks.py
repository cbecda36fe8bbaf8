"""Argument checks: every public function and module rejects bad input here, by name.

Each check raises a `TypeError` (wrong kind of value) or a `ValueError` (right kind, wrong
value) whose message names the argument, what was expected and what arrived, before the
input reaches torch, whose own errors (a matmul's dtype mismatch, an `IndexError`) name none
of these.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = [
    "check_config",
    "check_dropout",
    "check_flag",
    "check_ids",
    "check_input",
    "check_padding_mask",
    "check_positive",
    "check_size",
    "check_tensor",
]


def check_config(
    cfg: object, required: Sequence[str], optional: Sequence[str], kind: str = "a dict"
) -> None:
    """A model's `cfg`: a mapping with every `required` key and no other than the `optional`.

    Examples:
        >>> check_config({"n_layers": 2, "colour": 1}, ("n_layers",), ("window",))
        Traceback (most recent call last):
        ...
        ValueError: cfg needs the keys n_layers (optional: window): missing [], unknown ['colour']
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(f"cfg must be {kind}, got {type(cfg).__name__}")
    missing = [key for key in required if key not in cfg]
    unknown = [key for key in cfg if key not in (*required, *optional)]
    if missing or unknown:
        raise ValueError(
            f"cfg needs the keys {', '.join(required)} (optional: {', '.join(optional)}): "
            f"missing {missing}, unknown {unknown}"
        )


def check_tensor(
    name: str,
    value: object,
    *,
    ndim: int | Sequence[int] | None = None,
    floating: bool = False,
    like: Tensor | None = None,
    shape: Sequence[int] | None = None,
    dims: str = "",
) -> Tensor:
    """Check that `value` is a tensor of the expected rank, kind, dtype, device and shape.

    Args:
        name: the argument's name, for the message.
        value: what was passed.
        ndim: the allowed number of dimensions (one, or several).
        floating: whether it must be a floating-point tensor.
        like: a tensor whose dtype and device `value` must share.
        shape: the shape it must have, checked last.
        dims: the names of `shape`'s dimensions, for the message, e.g. `"(B, H, T)"`.

    Returns:
        `value`, a tensor.

    Raises:
        TypeError: not a tensor, not floating point, or another dtype than `like`.
        ValueError: another rank, another device than `like`, or another shape.

    Examples:
        >>> check_tensor("queries", [[1.0]])
        Traceback (most recent call last):
        ...
        TypeError: queries must be a torch.Tensor, got list
        >>> check_tensor("keys", torch.zeros(3), ndim=(2, 3))
        Traceback (most recent call last):
        ...
        ValueError: keys must have 2 or 3 dimensions, got shape (3,)
        >>> check_tensor("beta", torch.zeros(2, 3), shape=(2, 4), dims="(B, T)")
        Traceback (most recent call last):
        ...
        ValueError: beta must have shape (B, T) = (2, 4), got (2, 3)
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.ndim not in allowed:
            dims = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have {dims} dimensions, got shape {tuple(value.shape)}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if like is not None:
        if value.dtype != like.dtype:
            raise TypeError(f"{name} must have dtype {like.dtype}, got {value.dtype}")
        if value.device != like.device:
            raise ValueError(f"{name} must be on {like.device}, got it on {value.device}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        want = f"{dims} = {tuple(shape)}" if dims else f"{tuple(shape)}"
        raise ValueError(f"{name} must have shape {want}, got {tuple(value.shape)}")
    return value


def check_flag(name: str, value: object) -> bool:
    """Check that a switch (`causal`, `qkv_bias`, `need_weights`) is a bool.

    A string such as `"False"` is truthy: accepting it would silently switch the option on.

    Examples:
        >>> check_flag("causal", "False")
        Traceback (most recent call last):
        ...
        TypeError: causal must be True or False, got 'False' (str)
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def check_input(
    x: Tensor,
    d_in: int,
    context_length: int | None = None,
    *,
    batched: bool,
    like: Tensor | None = None,
) -> None:
    """Raise an error naming the expected and the actual value of an attention input.

    Args:
        x: the input tensor.
        d_in: the expected last dimension.
        context_length: the longest sequence the module supports, if it has a limit.
        batched: whether `x` must be `(batch, num_tokens, d_in)`; otherwise
            `(num_tokens, d_in)` is also accepted.
        like: a parameter of the module: `x` must have its device and its dtype (or, under
            autocast, the dtype autocast casts to).

    Raises:
        TypeError: `x` is not a tensor, not floating point, or not of `like`'s dtype.
        ValueError: wrong rank, wrong last dimension, too many tokens, or not on `like`'s
            device.

    Examples:
        >>> check_input(torch.zeros(2, 7, 3), d_in=3, context_length=6, batched=True)
        Traceback (most recent call last):
        ...
        ValueError: sequence of 7 tokens is longer than context_length=6
        >>> check_input(torch.zeros(2, 6, 3, dtype=torch.long), d_in=3, batched=True)
        Traceback (most recent call last):
        ...
        TypeError: expected a floating-point input (embeddings, not ids), got dtype torch.int64
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"expected the input x to be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"expected a floating-point input (embeddings, not ids), got dtype {x.dtype}"
        )
    if like is not None:
        if x.device != like.device:
            raise ValueError(
                f"expected the input on {like.device} (where the module's parameters are), "
                f"got it on {x.device}: move one with .to()"
            )
        allowed = [like.dtype]  # and, under autocast, what it casts from and to
        if _autocast(x.device.type):
            allowed += [torch.float32, torch.float16, torch.bfloat16]
        if x.dtype not in allowed:
            raise TypeError(
                f"expected input of dtype {' or '.join(map(str, dict.fromkeys(allowed)))} "
                f"(the module's parameters{', or autocast' if len(allowed) > 1 else ''}), "
                f"got {x.dtype}: "
                f"convert the input with x.to({like.dtype}) or the module with .to({x.dtype})"
            )
    expected = "(batch, num_tokens, d_in)" if batched else "(num_tokens, d_in)"
    ranks = (3,) if batched else (2, 3)
    if x.ndim not in ranks:
        raise ValueError(
            f"expected input of shape {expected} with d_in={d_in}, "
            f"got a {x.ndim}-d tensor of shape {tuple(x.shape)}"
        )
    if x.shape[-1] != d_in:
        raise ValueError(
            f"expected input of shape {expected} with d_in={d_in}, "
            f"got last dimension {x.shape[-1]} (shape {tuple(x.shape)})"
        )
    num_tokens = x.shape[-2]
    if context_length is not None and num_tokens > context_length:
        raise ValueError(
            f"sequence of {num_tokens} tokens is longer than context_length={context_length}"
        )


def _autocast(device_type: str) -> bool:
    """Whether autocast is on for this kind of device (never for `meta`, which has none)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know
        return False


def check_size(name: str, value: object, *, minimum: int = 1) -> int:
    """Check that a size argument (a width, a count, a length) is an int of at least `minimum`.

    Args:
        name: the argument's name, for the message.
        value: what was passed.
        minimum: the smallest allowed value.

    Returns:
        `value`, as an `int`.

    Raises:
        TypeError: `value` is not an int (a float, a bool or a tensor, say).
        ValueError: `value` is below `minimum`.

    Examples:
        >>> check_size("num_heads", 2.0)
        Traceback (most recent call last):
        ...
        TypeError: num_heads must be an int, got 2.0 (float)
        >>> check_size("context_length", 0)
        Traceback (most recent call last):
        ...
        ValueError: context_length must be >= 1, got 0
    """
    if isinstance(value, torch.SymInt):  # a symbolic size, under torch.export
        return value  # type: ignore[return-value]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # NumPy's ints too
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive(name: str, value: object) -> float:
    """Check that a rate or a scale (`lr`, `scale`, a soft cap) is a finite number above 0.

    Examples:
        >>> check_positive("lr", float("nan"))
        Traceback (most recent call last):
        ...
        ValueError: lr must be a finite number > 0, got nan
    """
    # numbers.Real: numpy's floats and ints too; a bool is not a rate
    number = float(value) if isinstance(value, numbers.Real) else math.nan
    if isinstance(value, bool) or not 0 < number < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def check_dropout(value: object, name: str = "dropout") -> float:
    """Check that a dropout probability is a real number in $[0, 1)$.

    $p = 1$ would drop every weight and scale the rest by $1/(1-p)$, a division by zero.

    Args:
        value: what was passed.
        name: the argument's name, for the message.

    Returns:
        `value`, as a `float`.

    Raises:
        TypeError: `value` is not a real number (None, a string, a bool).
        ValueError: `value` is outside $[0, 1)$, or NaN.

    Examples:
        >>> check_dropout(1.5)
        Traceback (most recent call last):
        ...
        ValueError: dropout must be a probability in [0, 1), got 1.5
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a float in [0, 1), got {value!r} ({type(value).__name__})")
    if not 0.0 <= value < 1.0:  # False for NaN too
        raise ValueError(f"{name} must be a probability in [0, 1), got {value}")
    return float(value)


def check_ids(
    ids: object,
    name: str = "token_ids",
    vocab_size: int | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """Check that token ids are integers, each in `0 .. vocab_size - 1`; return them as a tensor.

    Float ids would be truncated silently by `.long()`, and an id outside the vocabulary
    fails deep inside an embedding or a tokenizer: both are refused here, by name.

    Args:
        ids: what was passed.
        name: the argument's name, for the message.
        vocab_size: the number of ids, if there is a limit.
        device: where they must be (an embedding's device), if anywhere.

    Returns:
        `ids`, a tensor: int32 or int64 as given; a sequence of ints, or another integer
        dtype (uint8, int16, ...), becomes int64.

    Raises:
        TypeError: `ids` is neither an integer tensor (or NumPy array) nor a sequence of ints.
        ValueError: an id outside `0 .. vocab_size - 1`, beyond int64, or on another device.

    Examples:
        >>> check_ids(torch.tensor([1.0, 2.0]))
        Traceback (most recent call last):
        ...
        TypeError: token_ids must be integer ids, got dtype torch.float32
        >>> check_ids(torch.tensor([3, 10]), vocab_size=10)
        Traceback (most recent call last):
        ...
        ValueError: token_ids must be in 0 .. 9 (vocab_size=10), got ids from 3 to 10
    """
    if hasattr(ids, "__array__") and not isinstance(ids, Tensor):  # a NumPy array
        ids = torch.as_tensor(ids)
    if _nested(ids):  # rows of ids, e.g. [[1, 2], [3, 4]]: each checked, then stacked
        assert isinstance(ids, Sequence)
        rows = [check_ids(row, f"{name}[{i}]") for i, row in enumerate(ids)]
        if len({row.shape for row in rows}) > 1:
            lengths = [row.shape[0] for row in rows]
            raise ValueError(
                f"{name} rows must have one length, got {lengths} (pad_prompts pads prompts)"
            )
        ids = torch.stack(rows)
    if not isinstance(ids, Tensor):
        if not (
            isinstance(ids, Sequence | range)
            and not isinstance(ids, str | bytes)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise TypeError(f"{name} must be integer ids (a tensor, or ints), got {ids!r:.40}")
        if any(not -(2**63) <= i < 2**63 for i in ids):
            raise ValueError(f"{name} must fit in int64, got {max(ids, key=abs)}")
        ids = torch.tensor(list(ids), dtype=torch.long)
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be integer ids, got dtype {ids.dtype}")
    if device is not None and ids.device != device:
        raise ValueError(f"{name} must be on {device} (the embedding's device), got {ids.device}")
    if ids.device.type == "meta":
        raise ValueError(f"{name} on the meta device have no values to look up")
    if vocab_size is not None and ids.numel():
        low, high = (int(v) for v in torch.aminmax(ids))  # one pass over the ids
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} must be in 0 .. {vocab_size - 1} (vocab_size={vocab_size}), "
                f"got ids from {low} to {high}"
            )
    if ids.dtype not in (torch.int32, torch.int64):  # uint8, int16 ...: what an embedding takes
        ids = ids.long()
    return ids


def _nested(ids: object) -> bool:
    """Whether `ids` is a non-empty sequence of sequences (rows), not a tensor or text."""
    return (
        isinstance(ids, Sequence)
        and not isinstance(ids, str | bytes)
        and len(ids) > 0
        and all(
            isinstance(row, Sequence | Tensor) and not isinstance(row, str | bytes) for row in ids
        )
    )


def check_padding_mask(
    key_padding_mask: object, batch: int, num_tokens: int, device: torch.device
) -> Tensor:
    """Check a `key_padding_mask`: bool, `(batch, num_tokens)`, on the input's device.

    Examples:
        >>> check_padding_mask(torch.zeros(2, 5), 2, 5, torch.device("cpu"))
        Traceback (most recent call last):
        ...
        TypeError: key_padding_mask must be a bool tensor (True = padding), got dtype torch.float32
    """
    mask = check_tensor("key_padding_mask", key_padding_mask)
    if mask.shape != (batch, num_tokens):
        raise ValueError(
            f"key_padding_mask must have shape (batch, num_tokens) = ({batch}, {num_tokens}), "
            f"got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(
            f"key_padding_mask must be a bool tensor (True = padding), got dtype {mask.dtype}"
        )
    if mask.device != device:
        raise ValueError(
            f"key_padding_mask must be on the input's device {device}, got {mask.device}"
        )
    return mask
