r"""The fused path: which mask each case needs, and the kernel calls that need the least.

`torch.nn.functional.scaled_dot_product_attention` (SDPA) never materialises the
$T \times T$ weights, but it takes `is_causal=True` *or* a mask, not both, and a mask costs
a tensor of its size and the kernel's skipping of the blocks above the diagonal. So:

| case | what reaches the kernel |
| --- | --- |
| no padding | `is_causal` (or nothing) |
| causal, right padding (real tokens, then padding) | `is_causal` alone: each padded key comes after every real query |
| causal, left padding (one run of real tokens) | the same, after [`rotate_tokens`][attention.fused.rotate_tokens] moves the run to the front |
| not causal, padding | a `(b, 1, 1, T)` key mask, broadcast by the kernel |
| causal, padding with holes | one bool `(b, 1, T, T)` mask |
| a sliding window | blocks of queries, [`sliding_window_attention`][attention.fused.sliding_window_attention] |

Grouped key/value heads reach the kernel as they are (`enable_gqa`). A padded query's context
vector is zero on every path.
"""  # noqa: E501

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.checks import check_size, check_tensor
from attention.core import causal_mask, padding_to_attn_mask

__all__ = [
    "attention_mask",
    "fused_attention",
    "right_padded",
    "rotate_tokens",
    "shift_to_right_padding",
    "sliding_window_attention",
]


def attention_mask(
    num_tokens: int,
    *,
    causal: bool,
    window: int | None = None,
    key_padding_mask: Tensor | None = None,
    device: torch.device | str | None = None,
) -> Tensor | None:
    """The explicit path's bool mask (True = masked), or None when nothing is masked.

    Future keys (if causal), keys beyond the window, padded keys, and every key of a padded
    query: its row is fully masked, so `explicit_attention` gives it zero weights.

    Returns:
        None, `(T, T)`, or `(b, 1, T, T)` with padding.

    Examples:
        >>> attention_mask(3, causal=True, key_padding_mask=torch.tensor([[False, False, True]]))
        tensor([[[[False,  True,  True],
                  [False, False,  True],
                  [ True,  True,  True]]]])
    """
    _check_window(causal, window)
    mask = causal_mask(num_tokens, device=device, window=window) if causal else None
    if key_padding_mask is None:
        return mask
    padding = padding_to_attn_mask(key_padding_mask) | key_padding_mask[:, None, :, None]
    return padding if mask is None else mask | padding  # (b, 1, T, T)


def fused_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    causal: bool,
    window: int | None = None,
    key_padding_mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """Attention on the fused kernel with the least mask each case needs (table above).

    Args:
        queries: `(b, h, T, d_h)`.
        keys: `(b, h_kv, T, d_h)`, `h` a multiple of `h_kv`.
        values: `(b, h_kv, T, d_v)`.
        causal: hide future keys.
        window: with `causal`, the tokens each query sees, itself included.
        key_padding_mask: bool `(b, T)`, True = padding; the inputs at padded positions
            must already be harmless (zero), as `MultiHeadAttention` makes them.
        dropout_p: dropout on the weights.

    Returns:
        `(b, h, T, d_v)`; zero at padded queries.
    """
    _check_window(causal, window)
    gqa = _check_heads(queries, keys, values)
    if key_padding_mask is not None:
        check_tensor("key_padding_mask", key_padding_mask, ndim=2)
        if key_padding_mask.shape != (queries.shape[0], queries.shape[2]):
            raise ValueError(
                "key_padding_mask must be (batch, num_tokens) = "
                f"{(queries.shape[0], queries.shape[2])}, got {tuple(key_padding_mask.shape)}"
            )
    if key_padding_mask is None or (
        causal and _can_read(key_padding_mask) and right_padded(key_padding_mask)
    ):
        if causal and window is not None:
            context_vec = sliding_window_attention(
                queries, keys, values, window, dropout_p=dropout_p
            )
        else:  # the kernel applies the causal mask itself, block by block
            context_vec = F.scaled_dot_product_attention(
                queries, keys, values, dropout_p=dropout_p, is_causal=causal, enable_gqa=gqa
            )
    else:
        if causal:
            num_tokens = queries.shape[-2]
            masked = causal_mask(num_tokens, device=queries.device, window=window)  # (T, T)
            masked = masked | padding_to_attn_mask(key_padding_mask)  # (b, 1, T, T)
            # A padded query may have no key left (under left padding), and
            # softmax(-inf, ..., -inf) is NaN: let it attend anywhere; it is zeroed below.
            masked &= ~key_padding_mask[:, None, :, None]
        else:
            # Only an all-padding row has no key left: let its queries attend to all.
            all_padding = key_padding_mask.all(dim=-1, keepdim=True)  # (b, 1)
            masked = padding_to_attn_mask(key_padding_mask & ~all_padding)  # (b, 1, 1, T)
        # SDPA's bool masks say True = may attend: the opposite of ours.
        context_vec = F.scaled_dot_product_attention(
            queries,
            keys,
            values,
            attn_mask=masked.logical_not_(),
            dropout_p=dropout_p,
            enable_gqa=gqa,
        )  # (b, h, T, d_v)
    if key_padding_mask is None:
        return context_vec
    return context_vec.masked_fill(key_padding_mask[:, None, :, None], 0.0)


def _check_window(causal: bool, window: int | None) -> None:
    if window is not None:
        check_size("window", window)
        if not causal:
            raise ValueError(f"a sliding window needs causal=True, got window={window}")


def _check_heads(queries: Tensor, keys: Tensor, values: Tensor) -> bool:
    """Check `(b, h, T, d)` queries against `(b, h_kv, T, d)` keys and values; whether h_kv < h."""
    for name, t in (("queries", queries), ("keys", keys), ("values", values)):
        check_tensor(name, t, ndim=4)
    h, h_kv = queries.shape[1], keys.shape[1]
    if values.shape[1] != h_kv or h % h_kv:
        raise ValueError(
            "queries need a multiple of the key/value heads, and keys and values the same "
            f"heads (dimension 1): got queries {tuple(queries.shape)}, keys "
            f"{tuple(keys.shape)}, values {tuple(values.shape)}"
        )
    return h != h_kv


def _can_read(key_padding_mask: Tensor) -> bool:
    """Whether the mask's values may steer the computation: not while exporting (one program
    for every mask), not on the meta device (no values), not for zero tokens (nothing to do)."""
    return (
        not torch.compiler.is_exporting()
        and key_padding_mask.device.type != "meta"
        and key_padding_mask.shape[1] > 0
    )


def _check_mask(key_padding_mask: Tensor) -> None:
    check_tensor("key_padding_mask", key_padding_mask, ndim=2)
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(f"key_padding_mask must be bool, got dtype {key_padding_mask.dtype}")


def right_padded(key_padding_mask: Tensor) -> bool:
    """Whether every row is real tokens, then padding (`[F, ..., F, T, ..., T]`): O(b T).

    Examples:
        >>> right_padded(torch.tensor([[False, True], [False, False]]))
        True
        >>> right_padded(torch.tensor([[True, False]]))
        False
    """
    _check_mask(key_padding_mask)
    return bool((key_padding_mask[:, :-1] <= key_padding_mask[:, 1:]).all())


def shift_to_right_padding(key_padding_mask: Tensor) -> Tensor | None:
    """How far to rotate each row so that its real tokens come first, or None.

    None when every row already starts with its real tokens (no rotation needed), when some
    row's real tokens are not one contiguous run (no rotation makes it right-padded), or when
    the mask's values cannot be read (while exporting, on `meta`).
    Otherwise the first real position of each row (0 for an all-padding row): O(b T).

    Examples:
        >>> left = torch.tensor([[True, True, False], [False, False, False]])
        >>> shift_to_right_padding(left)  # rotate row 0 left by 2, row 1 not at all
        tensor([2, 0])
        >>> rotate_tokens(left, shift_to_right_padding(left))  # now right-padded
        tensor([[False,  True,  True],
                [False, False, False]])
    """
    _check_mask(key_padding_mask)
    if not _can_read(key_padding_mask):
        return None
    real = ~key_padding_mask  # (b, T)
    first = real.int().argmax(dim=1)  # (b,): the first real token (0 if there is none)
    if not bool(first.any()):
        return None
    positions = torch.arange(real.shape[1], device=real.device)  # (T,)
    last = first + real.sum(dim=1)  # (b,): one past the last real token
    run = (positions >= first[:, None]) & (positions < last[:, None])  # (b, T)
    return first if bool((run == real).all()) else None


def rotate_tokens(t: Tensor, shift: Tensor) -> Tensor:
    """Row `i` of `t` (`(b, T, ...)`) rotated left by `shift[i]` tokens: `t[i, (j + s) % T]`.

    `rotate_tokens(rotate_tokens(t, shift), -shift)` is `t`.
    """
    check_tensor("t", t)
    check_tensor("shift", shift, ndim=1)
    if t.ndim < 2 or shift.shape[0] != t.shape[0] or shift.is_floating_point():
        raise ValueError(
            "shift must hold one integer per row of t (batch,): got shift "
            f"{shift.dtype} {tuple(shift.shape)} for t of shape {tuple(t.shape)}"
        )
    num_tokens = t.shape[1]
    positions = torch.arange(num_tokens, device=t.device)  # (T,)
    index = (positions + shift[:, None]) % num_tokens  # (b, T)
    index = index.view(*index.shape, *([1] * (t.ndim - 2))).expand_as(t)
    return t.gather(1, index)


def sliding_window_attention(
    queries: Tensor, keys: Tensor, values: Tensor, window: int, *, dropout_p: float = 0.0
) -> Tensor:
    r"""Causal attention in which query $i$ sees keys $i - w < j \le i$, in $O(T w)$, not $O(T^2)$.

    The queries are cut into blocks of $w$; block $n$ (queries $nw \dots nw + w - 1$) can only
    see keys $nw - w \dots nw + w - 1$, so each block meets $2w$ keys under one $(w, 2w)$
    boolean mask, and the fused kernel runs all blocks as one batch. Nothing
    $T \times T$ is built; the masks take $2 T w$ bytes. Grouped key/value heads
    (fewer than the queries') go to the kernel as they are (`enable_gqa`).

    Args:
        queries: `(b, h, T, d_h)`.
        keys: `(b, h_kv, T, d_h)`, `h` a multiple of `h_kv`.
        values: `(b, h_kv, T, d_v)`.
        window: $w \ge 1$, the tokens each query sees, itself included.
        dropout_p: dropout on the weights (the kernel's own).

    Returns:
        The context vectors, `(b, h, T, d_v)`.

    Examples:
        >>> from attention.core import explicit_attention
        >>> q, k, v = torch.randn(3, 1, 2, 10, 4).unbind(0)  # (b, h, T, d_h) each
        >>> fused = sliding_window_attention(q, k, v, window=3)
        >>> explicit, _ = explicit_attention(q, k, v, mask=causal_mask(10, window=3))
        >>> torch.allclose(fused, explicit, atol=1e-6)
        True
    """
    check_size("window", window)
    gqa = _check_heads(queries, keys, values)
    b, h, num_tokens, _ = queries.shape
    w = window
    if num_tokens <= w or b == 0:  # every query sees everything before it: plain causal attention
        return F.scaled_dot_product_attention(
            queries, keys, values, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa
        )
    num_blocks = -(-num_tokens // w)
    pad = num_blocks * w - num_tokens  # queries padded to whole blocks, dropped at the end

    def key_blocks(t: Tensor) -> Tensor:  # (b, h_kv, T, d) -> (b * nb, h_kv, 2w, d)
        t = F.pad(t, (0, 0, w, pad))  # w zero keys before position 0: (b, h_kv, (nb+1)w, d)
        t = t.unfold(2, 2 * w, w)  # block n: keys nw - w ... nw + w - 1: (b, h_kv, nb, d, 2w)
        return t.permute(0, 2, 1, 4, 3).reshape(b * num_blocks, t.shape[1], 2 * w, t.shape[3])

    q = F.pad(queries, (0, 0, 0, pad)).view(b, h, num_blocks, w, -1)  # (b, h, nb, w, d)
    q = q.transpose(1, 2).reshape(b * num_blocks, h, w, -1)  # (b * nb, h, w, d)
    r = torch.arange(w, device=queries.device)[:, None]  # query i = nw + r
    c = torch.arange(2 * w, device=queries.device)[None, :]  # key j = nw - w + c
    allowed = ((c > r) & (c <= r + w)).expand(num_blocks, w, 2 * w).clone()  # i-w < j <= i
    allowed[0] &= c >= w  # block 0's first w keys are the zero padding before position 0
    mask = allowed.repeat(b, 1, 1)[:, None]  # (b * nb, 1, w, 2w)
    out = F.scaled_dot_product_attention(
        q,
        key_blocks(keys),
        key_blocks(values),
        attn_mask=mask,
        dropout_p=dropout_p,
        enable_gqa=gqa,
    )  # (b * nb, h, w, d_v)
    out = out.view(b, num_blocks, h, w, -1).transpose(1, 2)  # (b, h, nb, w, d_v)
    return out.reshape(b, h, num_blocks * w, -1)[:, :, :num_tokens]  # (b, h, T, d_v)
