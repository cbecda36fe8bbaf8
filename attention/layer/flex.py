r"""FlexAttention: any mask and score modifier in one kernel that skips what the mask hides.

PyTorch's FlexAttention (`torch.nn.attention.flex_attention`) takes exactly this package's
functions: a mask's `fn(b, h, q_idx, kv_idx)` and a score modifier's
`fn(score, b, h, q_idx, kv_idx)`. From the mask it builds a *block mask* (which tiles of
(query, key) pairs hold a visible pair at all) and, compiled, runs one kernel over the visible
tiles only: a window's cost grows with $T w$, not $T^2$, and documents, a prefix-LM or a soft
cap need no $T \times S$ tensor.

The planner ([`plan`][attention.layer.fused.plan]) sends a call here on the device types in
[`DEVICES`][attention.layer.flex.DEVICES] (CUDA) when SDPA's own kernels cannot take it
without a mask: windows, documents, padding after a cache, a user's mask, score modifiers.
No mask and `is_causal` stay on SDPA's flash kernel. On the CPU FlexAttention runs unfused
unless compiled, and SDPA with a mask is faster there, so the CPU never takes this path; the
tests call it there, unfused in float64, against the oracle written from the definitions.

Three things FlexAttention does not do by itself, done here:

- **positions**: a chunk's queries sit at `start ...`, a ring cache's keys at their own
  positions: the functions see positions, looked up from `q_idx` and `kv_idx`;
- **a query that sees nothing** gets zeros (its log-sum-exp is $-\infty$), as on every path;
- **a learned sink logit** $z_h$ (gpt-oss): with $\ell$ the row's log-sum-exp, the weights
  $e^{s_j} / (e^{z_h} + \sum_{j'} e^{s_{j'}})$ are the kernel's times
  $\sigma(\ell - z_h)$, so the output is scaled by it.

Block masks are kept (at most [`KEEP`][attention.layer.flex.KEEP]) per mask, shape, start and
device, so every layer and step of one shape builds it once; a mask of tensors (positions,
segments) is kept while those very tensors are passed again (one model call's layers).
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from attention.layer.masks import Mask
from attention.layer.score_mods import ScoreMod

__all__ = ["DEVICES", "KEEP", "attend", "block_mask", "usable"]

DEVICES = frozenset({"cuda"})
"""The device types on which the planner uses FlexAttention."""

KEEP = 32
"""Block masks kept at once (the oldest is dropped first)."""

_BLOCK_MASKS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_KERNELS: dict[str, Callable[..., Any]] = {}


def usable(device: torch.device, dropout_p: float) -> bool:
    """Whether a call on `device` goes to FlexAttention: one of `DEVICES`, no dropout (the
    kernel has none), and a torch that has it."""
    return device.type in DEVICES and dropout_p == 0.0 and _flex() is not None


def _flex() -> Any:
    try:
        from torch.nn.attention import flex_attention
    except ImportError:  # torch < 2.5
        return None
    return flex_attention


def _unfused(*args: Any, **kwargs: Any) -> Any:
    """FlexAttention without compiling: the scores materialised (the CPU's tests)."""
    with warnings.catch_warnings():  # "called without torch.compile()": on purpose here
        warnings.simplefilter("ignore", UserWarning)
        return _flex().flex_attention(*args, **kwargs)


def _kernel(device: torch.device) -> Callable[..., Any]:
    """FlexAttention compiled once per device type (CUDA); unfused (eager) elsewhere."""
    if device.type != "cuda":
        return _unfused
    flex = _flex().flex_attention
    if "cuda" not in _KERNELS:
        _KERNELS["cuda"] = torch.compile(flex, dynamic=False)
    return _KERNELS["cuda"]


def _lookup(pos: Tensor | None, start: int) -> Callable[[Tensor, Tensor], Tensor]:
    """`idx` -> the position it stands for: `start + idx`, or `pos[idx]` (`pos[b, idx]`)."""
    if pos is None:
        return lambda b, idx: idx + start
    if pos.ndim == 1:
        return lambda b, idx: pos[idx]
    return lambda b, idx: pos[b, idx]


def _mask_mod(
    rule: Mask, q_at: Callable[..., Tensor], k_at: Callable[..., Tensor],
    q_seg: Tensor | None, k_seg: Tensor | None,
) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:  # fmt: skip
    """FlexAttention's `mask_mod` over indices: the rule at positions, segments, no empties."""

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        q, kv = q_at(b, q_idx), k_at(b, kv_idx)  # positions; below 0: an empty slot
        seen: Tensor = rule.fn(b, h, q.clamp(min=0), kv.clamp(min=0)) & (kv >= 0) & (q >= 0)
        if q_seg is not None and k_seg is not None:  # documents, padding: -1
            seen = seen & (q_seg[b, q_idx] == k_seg[b, kv_idx]) & (k_seg[b, kv_idx] >= 0)
        return seen

    return mask_mod


def _positional(key: object) -> bool:
    """Whether a mask's key is a built-in of positions only (same for every row and head)."""
    if isinstance(key, str):
        return True
    return (isinstance(key, tuple) and len(key) == 3 and key[0] in ("&", "|")
            and _positional(key[1]) and _positional(key[2]))  # fmt: skip


def block_mask(
    rule: Mask,
    shape: tuple[int, int, int, int],
    device: torch.device,
    *,
    start: int = 0,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    q_seg: Tensor | None = None,
    k_seg: Tensor | None = None,
) -> Any:
    """FlexAttention's `BlockMask` for `rule` on `shape` = `(b, h, T, S)`, kept for reuse.

    Examples:
        >>> from attention.layer.masks import causal, window
        >>> bm = block_mask(causal() & window(128), (1, 1, 1024, 1024), torch.device("cpu"))
        >>> bm.shape, round(bm.sparsity())  # percent of the tiles skipped
        ((1, 1, 1024, 1024), 77)
    """
    b, h, num_tokens, num_keys = shape
    tensors = tuple(t for t in (q_pos, k_pos, q_seg, k_seg) if t is not None)
    same_everywhere = _positional(rule.key) and q_seg is None and all(
        t.ndim == 1 for t in tensors)  # fmt: skip
    batch, heads = (None, None) if same_everywhere else (b, h)
    key = (rule.key, start, num_tokens, num_keys, batch, heads, str(device),
           tuple((id(t), t._version) for t in tensors))  # fmt: skip
    kept = _BLOCK_MASKS.get(key)
    if kept is not None and all(ref() is t for ref, t in zip(kept[0], tensors, strict=True)):
        _BLOCK_MASKS.move_to_end(key)
        return kept[1]
    mod = _mask_mod(rule, _lookup(q_pos, start), _lookup(k_pos, 0), q_seg, k_seg)
    made = _flex().create_block_mask(
        mod, batch, heads, num_tokens, num_keys, device=device, _compile=device.type == "cuda"
    )  # long: not T x S at once
    _BLOCK_MASKS[key] = (tuple(weakref.ref(t) for t in tensors), made)
    while len(_BLOCK_MASKS) > KEEP:
        _BLOCK_MASKS.popitem(last=False)
    return made


def _score_mod(
    score_mods: Sequence[ScoreMod], q_at: Callable[..., Tensor], k_at: Callable[..., Tensor]
) -> Callable[..., Tensor] | None:
    """The modifiers in list order, as one FlexAttention `score_mod` over indices."""
    if not score_mods:
        return None

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        q, kv = q_at(b, q_idx).clamp(min=0), k_at(b, kv_idx).clamp(min=0)
        for mod in score_mods:
            score = mod.fn(score, b, h, q, kv)
        return score

    return score_mod


def attend(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    *,
    start: int = 0,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
    q_seg: Tensor | None = None,
    k_seg: Tensor | None = None,
    scale: float | None = None,
    sink_logits: Tensor | None = None,
    score_mods: Sequence[ScoreMod] = (),
) -> Tensor:
    r"""Attention of `(b, h, T, d)` queries over `(b, h_kv, S, d)` keys on FlexAttention.

    Arguments as [`fused_attention`][attention.layer.fused.fused_attention]'s (no padding to
    compact, no dropout). Returns `(b, h, T, d_v)`, zeros where a query sees nothing.

    Examples:
        >>> from attention.layer.masks import causal, window
        >>> q, k, v = torch.randn(3, 1, 2, 8, 4, dtype=torch.float64).unbind(0)
        >>> out = attend(q, k, v, causal() & window(3))
        >>> i = torch.arange(8)
        >>> seen = (i[:, None] >= i) & (i[:, None] - i < 3)  # the same window, as a tensor
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen)
        >>> torch.allclose(out, sdpa)
        True
    """
    b, h, num_tokens, _ = queries.shape
    shape, device = (b, h, num_tokens, keys.shape[2]), queries.device
    mask = block_mask(rule, shape, device, start=start, q_pos=q_pos, k_pos=k_pos,
                      q_seg=q_seg, k_seg=k_seg)  # fmt: skip
    score_mod = _score_mod(score_mods, _lookup(q_pos, start), _lookup(k_pos, 0))
    out, aux = _kernel(device)(
        queries, keys, values, score_mod=score_mod, block_mask=mask, scale=scale,
        enable_gqa=h != keys.shape[1], return_aux=_flex().AuxRequest(lse=True),
    )  # fmt: skip
    lse: Tensor = aux.lse[..., None]  # (b, h, T, 1): the log of each row's denominator
    context_vec: Tensor = out
    if sink_logits is not None:  # one more term e^z in each denominator: scale by sigma(l - z)
        sink = torch.sigmoid(lse - sink_logits.view(1, -1, 1, 1).to(lse.dtype))
        context_vec = context_vec * sink.to(context_vec.dtype)
    return context_vec.masked_fill(lse.isneginf(), 0.0)  # a query that sees nothing: zeros
