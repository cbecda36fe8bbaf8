"""How the layer is checked: a float64 oracle, PyTorch's module, a kernel spy, padding masks,
the bytes a backward keeps.

For the package's tests, its pages and your own: each helper has one home here, so a page
demonstrates with the same code that a test asserts with, and a user checks a variant of
their own against the same oracle. Nothing here is needed to run the layer.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.layer.masks import from_flags
from attention.layer.multihead import MultiHeadAttention

__all__ = [
    "KernelCall",
    "padding_mask",
    "reference_attention",
    "saved_bytes",
    "sdpa_calls",
    "to_torch_mha",
]


def padding_mask(
    lengths: Sequence[int] | Tensor,
    num_tokens: int,
    *,
    side: Literal["right", "left"] = "right",
    device: torch.device | str | None = None,
) -> Tensor:
    """A `key_padding_mask` for sequences of the given lengths: True marks padding.

    Args:
        lengths: real tokens in each sequence, each in `0 .. num_tokens`.
        num_tokens: the padded length $T$.
        side: where the padding goes: after the real tokens (`"right"`) or before (`"left"`).
        device: where to build the mask.

    Returns:
        Bool tensor of shape `(len(lengths), num_tokens)`.

    Raises:
        TypeError: `lengths` is not a sequence of ints.
        ValueError: a length outside `0 .. num_tokens`, or `side` not "right" or "left".

    Examples:
        >>> padding_mask([3, 1], 3)
        tensor([[False, False, False],
                [False,  True,  True]])
        >>> padding_mask([3, 1], 3, side="left")
        tensor([[False, False, False],
                [ True,  True, False]])
    """
    if isinstance(lengths, Tensor):
        lengths = lengths.tolist()
    if (
        isinstance(lengths, str)
        or not isinstance(lengths, Sequence)
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths)
    ):
        raise TypeError(
            f"lengths must be a sequence of ints, one per sequence, got {lengths!r:.40}"
        )
    n = torch.tensor(lengths, dtype=torch.long, device=device)[:, None]  # (b, 1)
    if n.numel() and not bool(((n >= 0) & (n <= num_tokens)).all()):
        raise ValueError(f"lengths must be in 0 .. num_tokens={num_tokens}, got {n[:, 0].tolist()}")
    positions = torch.arange(num_tokens, device=device)[None, :]  # (1, T)
    if side == "right":
        return positions >= n
    if side == "left":
        return positions < num_tokens - n
    raise ValueError(f'side must be "right" or "left", got {side!r}')


def to_torch_mha(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """`torch.nn.MultiheadAttention` holding `mha`'s weights: the same function, PyTorch's layout.

    PyTorch stacks the three input projections into one `in_proj_weight` of shape
    `(3 * d_out, d_in)`, queries then keys then values, with one `in_proj_bias`; `out_proj` is
    a `Linear` like ours. It projects queries from its `embed_dim`, so `d_in` must equal
    `d_out`. Causality is not a property of PyTorch's module: pass
    `attn_mask=~causal_mask(T)` to its calls (its bool `attn_mask` is True where a key is
    hidden, the opposite of this package's masks). A module with `kdim` or `vdim` (cross-attention)
    becomes one with the same `kdim` and `vdim`, whose three projections are separate.

    Args:
        mha: the module to copy.

    Returns:
        A `batch_first=True` `nn.MultiheadAttention` on `mha`'s device and dtype, in its mode.

    Raises:
        TypeError: `mha` is not a `MultiHeadAttention`.
        ValueError: `mha.d_in != mha.d_out`, or its spec computes what PyTorch's module does
            not: a mask other than causal or full (a window, a prefix-LM, yours), grouped
            heads, RoPE, a sink logit, a scale of its own or a score modifier, each named.

    Examples:
        >>> from attention import causal_mask
        >>> mha = MultiHeadAttention(4, 4, context_length=5, dropout=0.0, num_heads=2)
        >>> theirs = to_torch_mha(mha)
        >>> x = torch.randn(2, 5, 4)
        >>> out, _ = theirs(x, x, x, attn_mask=~causal_mask(5), need_weights=False)
        >>> torch.allclose(out, mha(x), atol=1e-6)
        True
    """
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"mha must be a MultiHeadAttention, got {type(mha).__name__}")
    unsupported = mha.spec.unsupported()  # what the spec computes beyond plain attention
    if unsupported:
        named = ", ".join(unsupported)
        raise ValueError(
            "nn.MultiheadAttention computes plain causal or full attention (the "
            f"mask passed to each call): it has no {named}"
        )
    if mha.d_in != mha.d_out or mha.out_features != mha.d_out:
        raise ValueError(
            "nn.MultiheadAttention needs d_in == d_out == out_features (its embed_dim), "
            f"got d_in={mha.d_in}, d_out={mha.d_out}, out_features={mha.out_features}"
        )
    weight = mha.W_query.weight
    theirs = nn.MultiheadAttention(
        mha.d_out,
        mha.num_heads,
        dropout=mha.dropout.p,
        bias=True,
        batch_first=True,
        kdim=mha.kdim,
        vdim=mha.vdim,
    ).to(device=weight.device, dtype=weight.dtype)
    projections = (mha.W_query, mha.W_key, mha.W_value)
    with torch.no_grad():
        weights: list[Tensor] = [p.weight for p in projections]
        if theirs.in_proj_weight is not None:  # stacked: (3 * d_out, d_in)
            theirs.in_proj_weight.copy_(torch.cat(weights))
        else:  # kdim or vdim differ from embed_dim (cross-attention, chapter 14): one each
            for name, w in zip(("q", "k", "v"), weights, strict=True):
                getattr(theirs, f"{name}_proj_weight").copy_(w)
        biases: list[Tensor] = [
            p.bias if p.bias is not None else torch.zeros_like(p.weight[:, 0]) for p in projections
        ]
        assert theirs.in_proj_bias is not None
        theirs.in_proj_bias.copy_(torch.cat(biases))
        theirs.out_proj.weight.copy_(mha.out_proj.weight)
        theirs.out_proj.bias.copy_(mha.out_proj.bias)
    return theirs.train(mha.training)


@dataclass(frozen=True)
class KernelCall:
    """What one call of `scaled_dot_product_attention` was given (besides Q, K, V)."""

    is_causal: bool
    mask_dtype: torch.dtype | None
    mask_shape: tuple[int, ...] | None
    num_keys: int = 0  # the keys it was given (their dimension -2)

    def __str__(self) -> str:
        mask = "None" if self.mask_shape is None else f"{self.mask_dtype} {self.mask_shape}"
        return f"is_causal={self.is_causal}, attn_mask={mask}"


@contextlib.contextmanager
def sdpa_calls() -> Iterator[list[KernelCall]]:
    """Record every call of `torch.nn.functional.scaled_dot_product_attention` in the block.

    The function is wrapped for the duration of the `with` block and restored after it; the
    calls still run.

    Yields:
        The list that each call's [`KernelCall`][attention.layer.testing.KernelCall] is appended to.

    Examples:
        >>> mha = MultiHeadAttention(4, 4, context_length=5, dropout=0.0, num_heads=2)
        >>> with sdpa_calls() as calls:
        ...     _ = mha(torch.randn(2, 5, 4))
        >>> [str(call) for call in calls]
        ['is_causal=True, attn_mask=None']
    """
    calls: list[KernelCall] = []
    original = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> Tensor:
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        is_causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
        calls.append(
            KernelCall(
                is_causal=bool(is_causal),
                mask_dtype=None if mask is None else mask.dtype,
                mask_shape=None if mask is None else tuple(mask.shape),
                num_keys=(args[1] if len(args) > 1 else kwargs["key"]).shape[-2],
            )
        )
        result: Tensor = original(*args, **kwargs)
        return result

    F.scaled_dot_product_attention = spy
    try:
        yield calls
    finally:
        F.scaled_dot_product_attention = original


def reference_attention(
    mha: MultiHeadAttention,
    x: Tensor,
    key_padding_mask: Tensor | None = None,
    document_ids: Tensor | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """What `mha(x, key_padding_mask, document_ids=..., positions=...)` must compute, written
    from the definition.

    Independent of the package's code paths: one query head and one query at a time. Each
    row's positions count its real tokens (padding excluded). The visibility of each key is
    decided by the rule's own words (in the past, within the window or a sink) for a layer
    made with `causal`, `window`, `sinks`, or else by calling its mask on one pair of
    scalars at a time; then same document, not padding. Score modifiers are called on one
    scalar score at a time. RoPE as complex multiplication, each query head reading
    key/value head `i // group`, the sink logit as one more term of the softmax, the output
    gate as a product before `out_proj`. Slow
    (Python loops over queries): for tests, at a few tokens, in float64.

    Args:
        mha: the module whose weights and configuration it uses.
        x: `(batch, num_tokens, d_in)`.
        key_padding_mask: `(batch, num_tokens)` bool, True = padding, or None.
        document_ids: `(batch, num_tokens)` ints, or None.
        positions: `(batch, num_tokens)` each token's position, or None: each row's real
            tokens counted from 0.

    Returns:
        `(batch, num_tokens, d_out)`.
    """
    b, n, _ = x.shape
    h, h_kv, d = mha.num_heads, mha.num_kv_heads, mha.head_dim
    pad = torch.zeros(b, n, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
    docs = torch.zeros(b, n, dtype=torch.long) if document_ids is None else document_ids
    x = x.masked_fill(pad[..., None], 0.0)  # a padded input is never read
    pos = [[int((~pad[row, :i]).sum()) for i in range(n)] for row in range(b)]  # real before i
    if positions is not None:
        pos = positions.tolist()

    def project(linear: nn.Linear, heads: int) -> Tensor:
        out = x @ linear.weight.T + (0 if linear.bias is None else linear.bias)
        return out.view(b, n, heads, d).transpose(1, 2)  # (b, heads, n, d)

    q, k, v = project(mha.W_query, h), project(mha.W_key, h_kv), project(mha.W_value, h_kv)
    if mha.rope:
        base = float(mha.rope_base or 0.0)  # set with rope
        q, k = _rotate(q, pos, base), _rotate(k, pos, base)
    sees = _definition(mha, pos, pad, docs)

    def modified(score: Tensor, row: int, head: int, i: int, j: int) -> Tensor:
        for mod in mha.score_mods:
            score = mod(score, *(torch.tensor(v) for v in (row, head, pos[row][i], pos[row][j])))
        return score

    context = torch.zeros(b, h, n, d, dtype=x.dtype)
    group = h // h_kv  # query head i reads key/value head i // group
    for row in range(b):
        for head in range(h):
            seen = torch.tensor([[sees(row, head, i, j) for j in range(n)] for i in range(n)])
            seen[pad[row]] = False  # a padded query attends to nothing: zero
            g = head // group
            scale = 1 / math.sqrt(d) if mha.scale is None else mha.scale
            scores = q[row, head] @ k[row, g].T * scale  # (n, n)
            if mha.score_mods:
                pairs = itertools.product(range(n), range(n))  # (i, j) row by row
                cells = [modified(scores[i, j], row, head, i, j) for i, j in pairs]
                scores = torch.stack(cells).view(n, n)
            scores = scores.masked_fill(~seen, -math.inf)
            if mha.sink_logits is not None:  # one more term: a key with the sink's logit, V 0
                sink = mha.sink_logits[head].to(x.dtype).expand(n, 1)
                scores = torch.cat((scores, sink), dim=1)
            weights = torch.softmax(scores, dim=1)[:, :n].nan_to_num(0.0)  # (n, n)
            context[row, head] = weights.masked_fill(~seen, 0.0) @ v[row, g]
    heads = context.transpose(1, 2).reshape(b, n, h * d)  # [Z_0; ...; Z_h-1]
    if mha.W_gate is not None:  # output_gate: times sigma(x W_g + b_g)
        gate = mha.W_gate
        heads = heads * torch.sigmoid(x @ gate.weight.T + (0 if gate.bias is None else gate.bias))
    return heads @ mha.out_proj.weight.T + mha.out_proj.bias


def saved_bytes(fn: Callable[[], Tensor]) -> int:
    """Bytes that autograd keeps for the backward of `fn()`: each distinct storage once.

    A deterministic measure of a backward's memory: every tensor the graph saves passes
    through `torch.autograd.graph.saved_tensors_hooks` as it is saved.

    Examples:
        >>> x = torch.randn(1000, requires_grad=True)  # 4000 bytes
        >>> saved_bytes(lambda: (x.exp() * 2).sum())  # exp saves its result
        4000
    """
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def _rotate(t: Tensor, pos: list[list[int]], base: float) -> Tensor:
    """RoPE by definition: pair (j, j + d/2) as one complex number, turned by e^{i m theta_j}."""
    b, _, n, d = t.shape
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.tensor(pos, dtype=torch.float64)[:, None, :, None]  # (b, 1, n, 1)
    turn = torch.polar(torch.ones(b, 1, n, d // 2, dtype=torch.float64), m * theta)
    z = torch.complex(t[..., : d // 2].double(), t[..., d // 2 :].double()) * turn
    return torch.cat((z.real, z.imag), dim=-1).to(t.dtype)  # in complex128, then back


def _definition(
    mha: MultiHeadAttention, pos: list[list[int]], pad: Tensor, docs: Tensor
) -> Callable[[int, int, int, int], bool]:
    """Whether query `i` of `row` sees key `j` in `head`: the words, or the mask on scalars."""
    words = mha.rule == from_flags(mha.causal, mha.window, mha.sinks)

    def sees(row: int, head: int, i: int, j: int) -> bool:
        p_i, p_j = pos[row][i], pos[row][j]
        if words:
            if mha.causal and p_j > p_i:
                return False  # the future
            if mha.window is not None and p_i - p_j >= mha.window and p_j >= mha.sinks:
                return False  # too far back, and not a sink
        elif not bool(mha.rule(*(torch.tensor(v) for v in (row, head, p_i, p_j)))):
            return False
        return bool(docs[row, i] == docs[row, j]) and not bool(pad[row, j])

    return sees
