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

A block mask is built from the mask's **data**: with the batch always (a mask may read `b`,
as Hugging Face's always get it), the heads where a mask is not one of the built-ins of
positions, and kept for reuse (at most [`KEEP`][attention.layer.flex.KEEP]) only where reuse
is provably right: a built-in mask of positions (its key says everything it computes), over
the very position and document tensors it was built from, unchanged since (their version
counters). A user's mask, or `documents(ids)`, may close over tensors this module cannot see
change: its block mask is built for each call.

FlexAttention compiles on CUDA. [`use`][attention.layer.flex.use] turns it on for another
device type too: compiled FlexAttention runs on the CPU and skips tiles there as on CUDA,
which is how the tests check tile skipping without a GPU.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from attention.layer.masks import Mask
from attention.layer.score_mods import ScoreMod
from attention.layer.tokens import Tokens

__all__ = ["DEVICES", "KEEP", "attend", "block_mask", "usable", "use"]

DEVICES = frozenset({"cuda"})
"""The device types on which the planner uses FlexAttention, compiled, by default."""

KEEP = 32
"""Block masks kept at once (the oldest is dropped first)."""

ON: set[str] = set(DEVICES)
"""Where the planner uses it now: `DEVICES`, and what `use` adds."""
_COMPILED: set[str] = set(DEVICES)  # where it runs compiled
_BLOCK_MASKS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_KERNELS: dict[str, Callable[..., Any]] = {}


@contextmanager
def use(device_type: str, compiled: bool = True) -> Iterator[None]:
    """Within it, the planner sends calls on `device_type` to FlexAttention too: compiled (as
    on CUDA: tiles skipped), or unfused (the scores materialised: float64 against the oracle).

    Examples:
        >>> with use("cpu"):  # compiled FlexAttention on the CPU (each mask compiles once)
        ...     usable(torch.device("cpu"), 0.0)
        True
        >>> usable(torch.device("cpu"), 0.0)
        False
    """
    added, compiling = device_type not in ON, device_type not in _COMPILED and compiled
    ON.add(device_type)
    if compiling:
        _COMPILED.add(device_type)
    try:
        yield
    finally:
        if added:
            ON.discard(device_type)
        if compiling:
            _COMPILED.discard(device_type)


def usable(device: torch.device, dropout_p: float, sink: bool = False) -> bool:
    """Whether a call on `device` goes to FlexAttention: one of the devices in use (`DEVICES`,
    or added by `use`), no dropout (the kernel has none), and a torch that has it. A learned
    sink needs the log-sum-exp, which compiled FlexAttention returns on CUDA only (torch
    2.13 on the CPU: "`return_lse` is not supported yet")."""
    if sink and device.type != "cuda" and device.type in _COMPILED:
        return False
    return device.type in ON and dropout_p == 0.0 and _flex() is not None


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


def _compiled(device: torch.device) -> bool:
    return device.type in _COMPILED


def _kernel(device: torch.device) -> Callable[..., Any]:
    """FlexAttention compiled once per device type where it is in use; unfused elsewhere."""
    if not _compiled(device):
        return _unfused
    if device.type not in _KERNELS:  # one graph per shape (dynamic shapes fail to compile
        # on the CPU, torch 2.13); past dynamo's recompile limit an error, never a silent
        # fall back to the unfused kernel (the scores materialised)
        compiled = torch.compile(_flex().flex_attention, dynamic=False)

        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                return compiled(*args, **kwargs)  # type: ignore[no-untyped-call]

        _KERNELS[device.type] = kernel
    return _KERNELS[device.type]


def _lookup(line: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """`idx` -> the position it stands for: `line[idx]`, or `line[b, idx]` per row."""
    if line.ndim == 1:
        return lambda b, idx: line[idx]
    return lambda b, idx: line[b, idx]


def _mask_mod(
    rule: Mask, q: Tokens, k: Tokens
) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """FlexAttention's `mask_mod` over indices: the rule at positions, documents, no empties."""
    q_at, k_at = _lookup(q.line), _lookup(k.line)
    q_docs, k_docs = q.docs, k.docs
    if (q_docs is None) != (k_docs is None):  # one side in one document: id 0
        q_docs = q.pos.new_zeros(q.batch, q.n) if q_docs is None else q_docs
        k_docs = k.pos.new_zeros(k.batch, k.n) if k_docs is None else k_docs

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qp, kp = q_at(b, q_idx), k_at(b, kv_idx)  # positions; below 0: no token
        seen: Tensor = rule.fn(b, h, qp.clamp(min=0), kp.clamp(min=0)) & (kp >= 0) & (qp >= 0)
        if q_docs is not None and k_docs is not None:
            seen = seen & (q_docs[b, q_idx] == k_docs[b, kv_idx])
        return seen

    return mask_mod


def _positional(key: object) -> bool:
    """Whether a mask's key is a built-in of positions only (same for every row and head)."""
    if isinstance(key, str):
        return True
    return (
        isinstance(key, tuple)
        and len(key) == 3
        and key[0] in ("&", "|")
        and _positional(key[1])
        and _positional(key[2])
    )


def block_mask(rule: Mask, q: Tokens, k: Tokens, num_heads: int) -> Any:
    """FlexAttention's `BlockMask` for `rule` between `q` and `k`, kept where provably reusable.

    Examples:
        >>> from attention.layer.masks import causal, window
        >>> line = Tokens(1, 1024, torch.device("cpu"), start=0)
        >>> bm = block_mask(causal() & window(128), line, line, num_heads=1)
        >>> bm.shape, round(bm.sparsity())  # percent of the tiles skipped
        ((1, 1, 1024, 1024), 77)
    """
    positional = _positional(rule.key)
    heads = None if positional else num_heads
    tensors = tuple(t for t in (q.given, k.given, q.docs, k.docs) if t is not None)
    key = (
        rule.key,
        q.start,
        k.start,
        q.n,
        k.n,
        q.batch,
        heads,
        str(q.device),
        tuple((id(t), t._version) for t in tensors),
    )
    kept = _BLOCK_MASKS.get(key) if positional else None
    if kept is not None and all(ref() is t for ref, t in zip(kept[0], tensors, strict=True)):
        _BLOCK_MASKS.move_to_end(key)
        return kept[1]
    made = _flex().create_block_mask(
        _mask_mod(rule, q, k),
        q.batch,
        heads,
        q.n,
        k.n,
        device=q.device,
        _compile=_compiled(q.device),
    )
    if positional:
        _BLOCK_MASKS[key] = (tuple(weakref.ref(t) for t in tensors), made)
        while len(_BLOCK_MASKS) > KEEP:
            _BLOCK_MASKS.popitem(last=False)
    return made


def _score_mod(
    score_mods: Sequence[ScoreMod], q: Tokens, k: Tokens
) -> Callable[..., Tensor] | None:
    """The modifiers in list order, as one FlexAttention `score_mod` over indices."""
    if not score_mods:
        return None
    q_at, k_at = _lookup(q.line), _lookup(k.line)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qp, kp = q_at(b, q_idx).clamp(min=0), k_at(b, kv_idx).clamp(min=0)
        for mod in score_mods:
            score = mod.fn(score, b, h, qp, kp)
        return score

    return score_mod


def attend(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    rule: Mask,
    q: Tokens,
    k: Tokens,
    *,
    scale: float | None = None,
    sink_logits: Tensor | None = None,
    score_mods: Sequence[ScoreMod] = (),
) -> Tensor:
    r"""Attention of `(b, h, T, d)` queries over `(b, h_kv, S, d)` keys on FlexAttention.

    Args:
        queries: `(b, h, T, d)`.
        keys: `(b, h_kv, S, d)`.
        values: `(b, h_kv, S, d_v)`.
        rule: the mask, evaluated at the tokens' positions.
        q: the queries' positions (and documents).
        k: the keys'.
        scale: what $q \cdot k$ is multiplied by; None for $1 / \sqrt{d}$.
        sink_logits: `(h,)` learned sink logits, or None.
        score_mods: score modifiers, any.

    Returns:
        `(b, h, T, d_v)`, zeros where a query sees nothing.

    Examples:
        >>> from attention.layer.masks import causal, window
        >>> q, k, v = torch.randn(3, 1, 2, 8, 4, dtype=torch.float64).unbind(0)
        >>> line = Tokens(1, 8, torch.device("cpu"), start=0)
        >>> out = attend(q, k, v, causal() & window(3), line, line)
        >>> i = torch.arange(8)
        >>> seen = (i[:, None] >= i) & (i[:, None] - i < 3)  # the same window, as a tensor
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen)
        >>> torch.allclose(out, sdpa)
        True
    """
    h = queries.shape[1]
    mask = block_mask(rule, q, k, h)
    aux = None if sink_logits is None else _flex().AuxRequest(lse=True)  # only a sink needs it
    out = _kernel(queries.device)(
        queries,
        keys,
        values,
        score_mod=_score_mod(score_mods, q, k),
        block_mask=mask,
        scale=scale,
        enable_gqa=h != keys.shape[1],
        return_aux=aux,
    )
    if sink_logits is None:  # a query that sees nothing: FlexAttention's output is zeros
        context_vec: Tensor = out
        return context_vec
    context_vec, lse = out[0], out[1].lse[..., None]  # (b, h, T, 1): log of each denominator
    sink = torch.sigmoid(lse - sink_logits.view(1, -1, 1, 1).to(lse.dtype))  # one more term e^z
    context_vec = context_vec * sink.to(context_vec.dtype)
    return context_vec.masked_fill(lse.isneginf(), 0.0)
