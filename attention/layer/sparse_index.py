r"""DeepSeek sparse attention (DeepSeek-V3.2): a small "lightning indexer" chooses each query's
top-$k$ keys, and latent attention reads only those.

A sliding window fixes which keys a query reads (its last $w$). DeepSeek sparse attention learns
it: for query $t$ and every key $s$ it may see, a cheap score $I_{t,s}$, from $H_I$ indexer
heads (`index_n_heads`) of width $d_I$ (`index_head_dim`):

$$
\begin{aligned}
I_{t,s} &= \sum_{j=1}^{H_I} w_{t,j}\,
  \operatorname{ReLU}\bigl(\tau_I\, q^{I}_{t,j} \cdot k^{I}_s\bigr), \\
w_{t,j} &= (W_w\, x_t)_j \,/ \sqrt{H_I}, \qquad \tau_I = 1 / \sqrt{d_I}, \\
q^{I}_{t,j} &= \operatorname{RoPE}_t\bigl((W^{I}_{Q}\, c^{Q}_t)_j\bigr), \\
c^{Q}_t &= \operatorname{RMSNorm}(W_{DQ}\, x_t), \\
k^{I}_s &= \operatorname{RoPE}_s\bigl(\operatorname{LayerNorm}(W^{I}_{K}\, x_s)\bigr),
\end{aligned}
$$

$c^{Q}_t$ being the main queries' low-rank input and $k^{I}_s$ one key per token, shared by the
indexer's heads; RoPE turns the first $d_R$ = `qk_rope_head_dim` dimensions in halves (not in
the main attention's interleaved pairs). Query $t$ keeps $\mathcal{S}_t$, its $k$ visible keys
of the largest $I_{t,s}$; its mask is

$$
M_{ts} = \bigl(s \le t\bigr) \wedge \bigl(s \in \mathcal{S}_t\bigr).
$$

The layer is [`MultiHeadLatentAttention`][attention.layer.latent.MultiHeadLatentAttention]
with that mask: the same planner and kernels, a mask that reads a `(batch, T, S)` tensor per row
([`topk_mask`][attention.layer.sparse_index.topk_mask]), as
[`documents`][attention.layer.masks.documents] reads its ids. A query with at most $k$ visible
keys keeps them all, so for $k \ge T$ the layer is the dense causal one. Each query reads $k$
keys instead of up to $T$; the indexer itself still scores every visible key, with $H_I$ small
heads and one key per token.

transformers' `DeepseekV32Indexer` (5.24) is this computation, without the reference code's
Hadamard rotation (orthogonal: it changes no dot product) and fp8 scoring. It computes the
scores in float32 (here: in the input's dtype) and without gradients, as here
(`torch.no_grad`): DeepSeek trains the indexer by its own loss, not through the main attention.
Parameter names are transformers' (`indexer.wq_b`, `indexer.wk`, `indexer.k_norm`,
`indexer.weights_proj`), so a state dict loads as it is
([`from_hf_sparse`][attention.layer.sparse_index.from_hf_sparse]).

Examples:
    >>> _ = torch.manual_seed(0)
    >>> dsa = SparseLatentAttention(
    ...     32, num_heads=4, context_length=16, kv_lora_rank=8, q_lora_rank=12,
    ...     qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
    ...     index_topk=3, index_n_heads=2, index_head_dim=8)
    >>> x = torch.randn(1, 6, 32)
    >>> dsa(x).shape
    torch.Size([1, 6, 32])
    >>> chosen = dsa.last_chosen  # (b, T, S) bool: the keys each query read
    >>> chosen.sum(-1)  # all it sees while it sees at most 3, then 3
    tensor([[1, 2, 3, 3, 3, 3]])
    >>> future = ~torch.ones(6, 6, dtype=torch.bool).tril()
    >>> bool((chosen & future).any())  # never a key of the future
    False
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from attention.checks import check_size, check_tensor
from attention.layer.cache import KVCache
from attention.layer.latent import MultiHeadLatentAttention, hf_latent_settings
from attention.layer.masks import Bounds, Mask
from attention.layer.positions import rotate_with
from attention.layer.tokens import Tokens, visible

__all__ = [
    "IndexedCache",
    "LightningIndexer",
    "SparseLatentAttention",
    "from_hf_sparse",
    "topk_chosen",
    "topk_mask",
]


class LightningIndexer(nn.Module):
    r"""The indexer's scores $I_{t,s}$ (see [`attention.layer.sparse_index`][attention.layer.sparse_index]).

    Args:
        d_in: the input's width (transformers' `hidden_size`).
        q_lora_rank: the width of $c^Q_t$, the main queries' normalised low-rank input.
        n_heads: $H_I$ (`index_n_heads`).
        head_dim: $d_I$ (`index_head_dim`).
        rope_dim: $d_R$, the leading dimensions RoPE turns (even, at most `head_dim`).

    Attributes:
        wq_b: `nn.Linear(q_lora_rank, H_I d_I)`, no bias: $W^I_Q$.
        wk: `nn.Linear(d_in, d_I)`, no bias: $W^I_K$.
        k_norm: `nn.LayerNorm(d_I, eps=1e-6)`.
        weights_proj: `nn.Linear(d_in, H_I)`, no bias: $W_w$, the heads' weights per query.
    """  # noqa: E501

    def __init__(
        self, d_in: int, q_lora_rank: int, n_heads: int, head_dim: int, rope_dim: int
    ) -> None:
        super().__init__()
        self.n_heads = check_size("index_n_heads", n_heads)
        self.head_dim = check_size("index_head_dim", head_dim)
        self.rope_dim = check_size("qk_rope_head_dim", rope_dim)
        if rope_dim > head_dim:
            raise ValueError(
                f"index_head_dim must be at least qk_rope_head_dim={rope_dim} "
                f"(RoPE turns its first dimensions), got {head_dim}"
            )
        self.wq_b = nn.Linear(
            check_size("q_lora_rank", q_lora_rank), n_heads * head_dim, bias=False
        )
        self.wk = nn.Linear(check_size("d_in", d_in), head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(d_in, n_heads, bias=False)

    def _rotate(self, x: Tensor, angles: tuple[Tensor, Tensor]) -> Tensor:
        """RoPE (halves) on the first `rope_dim` dimensions of `x` `(b, ., T, d_I)`."""
        turned, kept = x.split((self.rope_dim, self.head_dim - self.rope_dim), dim=-1)
        return torch.cat((rotate_with(turned, angles), kept), dim=-1)

    def keys(self, x: Tensor, angles: tuple[Tensor, Tensor]) -> Tensor:
        r"""$k^I_s = \operatorname{RoPE}_s(\operatorname{LayerNorm}(W^I_K x_s))$: `(b, T, d_I)`."""
        k = self.k_norm(self.wk(x))[:, None]  # (b, 1, T, d_I): one key for every head
        k = self._rotate(k, angles)[:, 0]
        assert k.shape == (*x.shape[:2], self.head_dim)
        return k

    def forward(
        self, x: Tensor, q_low: Tensor, keys: Tensor, angles: tuple[Tensor, Tensor]
    ) -> Tensor:
        r"""$I_{t,s}$ for the queries of `x` against `keys`.

        Args:
            x: `(b, T, d_in)`, the queries' inputs.
            q_low: `(b, T, q_lora_rank)`, $c^Q_t$.
            keys: `(b, S, d_I)`, from [`keys`][attention.layer.sparse_index.LightningIndexer.keys].
            angles: RoPE's `(cos, sin)` at the queries' positions, width `rope_dim`.

        Returns:
            `(b, T, S)`, every pair scored (the caller masks what a query cannot see).
        """
        b, t, _ = x.shape
        q = self.wq_b(q_low).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        q = self._rotate(q, angles)  # q^I_{t,j}: (b, H_I, T, d_I)
        # ReLU(tau_I q^I_{t,j} . k^I_s): (b, H_I, T, S)
        per_head = torch.relu(q @ keys[:, None].transpose(-1, -2) / math.sqrt(self.head_dim))
        w = self.weights_proj(x) / math.sqrt(self.n_heads)  # w_{t,j}: (b, T, H_I)
        scores = torch.einsum("btj,bjts->bts", w, per_head)  # sum_j w_{t,j} ReLU(...)
        assert scores.shape == (b, t, keys.shape[1])
        return scores


def topk_chosen(scores: Tensor, topk: int, seen: Tensor | None = None) -> Tensor:
    """Each query's `topk` keys of the largest scores among those it sees, `(b, T, S)` bool.

    A query that sees at most `topk` keys keeps every one it sees (and no other). Among
    exactly equal scores (the indexer's ReLU makes zeros) `torch.topk` chooses, as in
    transformers' DeepSeek-V3.2, whose logits this then equals; it may choose otherwise for
    a query alone (a decode step) than beside others (a prefill), there as here.

    Args:
        scores: `(b, T, S)` floating point, the indexer's scores.
        topk: $k$, from 1 to `S`.
        seen: `(b or 1, T, S)` bool, True where the query may see the key; None: every key.

    Raises:
        TypeError: `scores` not floating point, `seen` not bool, `topk` not an int.
        ValueError: a wrong shape, or `topk` outside `1 ... S`.

    Examples:
        >>> scores = torch.tensor([[[0.1, 0.9, 0.5, 0.3]]])
        >>> topk_chosen(scores, 2).int()
        tensor([[[0, 1, 1, 0]]], dtype=torch.int32)
    """
    scores = check_tensor("scores", scores, ndim=3, floating=True)
    check_size("topk", topk)
    if topk > scores.shape[-1]:
        raise ValueError(
            f"topk must be at most the number of keys S={scores.shape[-1]} of "
            f"scores (batch, T, S) = {tuple(scores.shape)}, got {topk}"
        )
    if seen is not None:
        seen = check_tensor("seen", seen, ndim=3)
        if (
            seen.dtype != torch.bool
            or seen.shape[1:] != scores.shape[1:]
            or seen.shape[0] not in (1, scores.shape[0])
        ):
            raise ValueError(
                f"seen must be bool of shape (batch or 1, T, S) = "
                f"({scores.shape[0]} or 1, {scores.shape[1]}, {scores.shape[2]}), got "
                f"{seen.dtype} {tuple(seen.shape)}"
            )
        scores = scores.masked_fill(~seen, -math.inf)  # what a query cannot see ranks last
    # torch.topk, as transformers' DeepSeek-V3.2: equal scores choose the same keys as there
    # (a stable sort, self-consistent, made a tiny random model's logits differ from its)
    top = scores.topk(topk, dim=-1).indices  # (b, T, k)
    chosen = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    chosen = chosen.scatter(-1, top, True)
    return chosen if seen is None else chosen & seen


def _read_chosen(chosen: Tensor, start: int, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
    """`chosen[b, q - start, kv]`, False outside the tensor (a probe's positions, say)."""
    rows, t, s = chosen.shape
    row = b if rows > 1 else torch.zeros_like(b)
    inside = (q >= start) & (q < start + t) & (kv < s)
    return chosen[row, (q - start).clamp(0, t - 1), kv.clamp(max=s - 1)] & inside


def topk_mask(chosen: Tensor, start: int = 0) -> Mask:
    """A [`Mask`][attention.layer.masks.Mask] that reads the keys each query chose.

    Its `mask_mod(b, h, q_idx, kv_idx)` is `chosen[b, q_idx - start, kv_idx]`: query positions
    `start ... start + T - 1` (a chunk after `start` cached tokens), key positions `0 ... S - 1`;
    anything outside is hidden. It certifies nothing (`Bounds()`): combine it with `causal()`.

    Args:
        chosen: `(b or 1, T, S)` bool, from [`topk_chosen`][attention.layer.sparse_index.topk_chosen].
        start: the position of the first query.

    Raises:
        TypeError: `chosen` not bool, `start` not an int.
        ValueError: `chosen` not 3-d, `start` below 0.

    Examples:
        >>> from attention.layer.masks import causal
        >>> chosen = topk_chosen(torch.tensor([[[0.1, 0.9, 0.5, 0.3]]]), 2)
        >>> mask = causal() & topk_mask(chosen, start=3)
        >>> mask.grid(torch.tensor([3]), torch.arange(4)).int()
        tensor([[0, 1, 1, 0]], dtype=torch.int32)
    """  # noqa: E501
    chosen = check_tensor("chosen", chosen, ndim=3)
    if chosen.dtype != torch.bool:
        raise TypeError(f"chosen must be a bool tensor (True = read), got {chosen.dtype}")
    check_size("start", start, minimum=0)
    return Mask(partial(_read_chosen, chosen, start), "topk(chosen)", Bounds())


class IndexedCache(KVCache):
    """A latent cache that also keeps the indexer's key of every token, `(b, slots, d_I)`, so a
    decoding step chooses among all cached keys.

    Made by [`SparseLatentAttention.init_cache`][attention.layer.sparse_index.SparseLatentAttention.init_cache];
    the other arguments are [`KVCache`][attention.layer.cache.KVCache]'s.
    """  # noqa: E501

    def __init__(self, *args: Any, index_head_dim: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        shape = (self._k.shape[0], self._slots, check_size("index_head_dim", index_head_dim))
        self.index_keys = torch.zeros(shape, device=self._k.device, dtype=self._k.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the latents, RoPE keys and indexer keys it holds when full."""
        return super().nbytes + self.index_keys.numel() * self.index_keys.element_size()

    def update_index(self, start: int, keys: Tensor) -> Tensor:
        """Write the indexer's keys `(b, T, d_I)` of positions `start ...`; return all `(b, S, d_I)`."""  # noqa: E501
        self.index_keys[:, start : start + keys.shape[1]] = keys.to(self.index_keys.dtype)
        return self.index_keys[:, : start + keys.shape[1]]

    def reset(self) -> None:
        super().reset()
        self.index_keys = self.index_keys.detach().zero_()


class SparseLatentAttention(MultiHeadLatentAttention):
    r"""DeepSeek-V3.2's attention: latent attention over each query's top-$k$ keys.

    [`MultiHeadLatentAttention`][attention.layer.latent.MultiHeadLatentAttention] (causal, with
    `q_lora_rank`) plus a [`LightningIndexer`][attention.layer.sparse_index.LightningIndexer]
    as `indexer`. Each call scores the keys, keeps each query's `index_topk` (all it sees when
    it sees fewer) and runs the latent layer with the mask `causal() & topk_mask(chosen)`.

    Args:
        d_in: the input's width, as `MultiHeadLatentAttention`'s.
        num_heads: $h$, the attention's query heads.
        context_length: the longest sequence one call takes.
        kv_lora_rank: $r$, the latent's width.
        qk_nope_head_dim: $d_N$.
        qk_rope_head_dim: $d_R$ (also the indexer's rotated width).
        v_head_dim: $d_V$.
        q_lora_rank: the queries' low-rank width (required: the indexer's queries start
            from it).
        index_topk: $k$, the most keys a query reads (transformers' `index_topk`).
        index_n_heads: $H_I$.
        index_head_dim: $d_I$.
        **options: `MultiHeadLatentAttention`'s `dropout`, `qkv_bias`, `rope_base`,
            `softmax_factor`, `norm_eps`, `absorb` (no mask arguments: the mask is causal
            and the indexer's).

    Attributes:
        indexer: the `LightningIndexer`.
        last_chosen: `(b, T, S)` bool, the keys each query read at the last call.

    Raises:
        TypeError: as `MultiHeadLatentAttention`, and a size of the indexer not an int.
        ValueError: as `MultiHeadLatentAttention`, an indexer's size below 1 or an
            `index_head_dim` below `qk_rope_head_dim`; at a call, `key_padding_mask`,
            `document_ids` or `positions` (not taken here) or a cache of another kind.
    """

    def __init__(
        self,
        d_in: int,
        num_heads: int,
        context_length: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int,
        index_topk: int,
        index_n_heads: int,
        index_head_dim: int,
        **options: Any,
    ) -> None:
        super().__init__(
            d_in,
            num_heads,
            context_length,
            kv_lora_rank=kv_lora_rank,
            qk_nope_head_dim=qk_nope_head_dim,
            qk_rope_head_dim=qk_rope_head_dim,
            v_head_dim=v_head_dim,
            q_lora_rank=q_lora_rank,
            causal=True,
            **options,
        )
        self.index_topk = check_size("index_topk", index_topk)
        self.indexer = LightningIndexer(
            d_in, q_lora_rank, index_n_heads, index_head_dim, qk_rope_head_dim
        )
        self.last_chosen: Tensor | None = None

    def init_cache(self, batch_size: int, max_tokens: int | None = None) -> IndexedCache:
        """An empty [`IndexedCache`][attention.layer.sparse_index.IndexedCache]: per token the
        latent, the RoPE key and the indexer's key.

        Args:
            batch_size: sequences generated together.
            max_tokens: the most tokens it takes; default `context_length`.

        Raises:
            ValueError: `max_tokens` beyond `context_length`.
        """
        plain = super().init_cache(batch_size, max_tokens)
        heads, d_k, d_v = self.cache_widths
        cache = IndexedCache(
            batch_size,
            plain.max_tokens,
            heads,
            d_k,
            value_dim=d_v,
            index_head_dim=self.indexer.head_dim,
            device=plain.keys.device,
            dtype=plain.keys.dtype,
        )
        cache.layout = plain.layout
        return cache

    def choose(
        self,
        x: Tensor,
        q: Tokens,
        cache: KVCache | None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """The keys each query of `x` reads, `(b, T, S)` bool; writes the indexer's keys into
        `cache` (an `IndexedCache`) at the chunk's positions.

        Args:
            x: `(b, T, d_in)`.
            q: the queries' positions (`q.start` known: no padding, no given positions).
            cache: the layer's cache, or None.
            angles: RoPE's `(cos, sin)` at those positions; default the layer's.
        """
        assert self.q_a_proj is not None and self.q_a_layernorm is not None
        assert q.start is not None
        if angles is None:
            angles = self.rotary.of(q, x.dtype)
        with torch.no_grad():  # DeepSeek trains the indexer by its own loss
            keys = self.indexer.keys(x, angles)  # k^I_s: (b, T, d_I)
            if isinstance(cache, IndexedCache):  # every cached key, then this chunk's
                keys = cache.update_index(q.start, keys)  # (b, S, d_I)
            q_low = self.q_a_layernorm(self.q_a_proj(x))  # c^Q_t: (b, T, q_lora_rank)
            scores = self.indexer(x, q_low, keys, angles)  # I_{t,s}: (b, T, S)
            k = Tokens(x.shape[0], keys.shape[1], x.device, start=0)
            seen = visible(self._spec.mask, q, k)[:, 0]  # causal: (1, T, S)
            topk = min(self.index_topk, keys.shape[1])
            return topk_chosen(scores, topk, seen.expand_as(scores))

    def _attend(
        self,
        x: Tensor,
        q: Tokens,
        cache: KVCache | None,
        angles: tuple[Tensor, Tensor] | None,
        need_weights: bool,
        mask: Mask | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Choose the keys, then latent attention under the layer's mask (`causal()`, or
        `mask`) `& topk_mask(chosen)`."""
        if q.start is None or (cache is not None and not isinstance(cache, IndexedCache)):
            got = "them" if cache is None else f"a {type(cache).__name__}"
            raise ValueError(
                "SparseLatentAttention takes no key_padding_mask, document_ids or positions, "
                f"and a cache from its own init_cache; got {got}"
            )
        chosen = self.choose(x, q, cache, angles)
        self.last_chosen = chosen
        rule = (self._spec.mask if mask is None else mask) & topk_mask(chosen, q.start)
        return super()._attend(x, q, cache, angles, need_weights, rule)  # for this call only

    def extra_repr(self) -> str:
        index = (
            f"index_topk={self.index_topk}, index_n_heads={self.indexer.n_heads}, "
            f"index_head_dim={self.indexer.head_dim}"
        )
        return f"{super().extra_repr()}, {index}"


def from_hf_sparse(module: nn.Module) -> SparseLatentAttention:
    """transformers' DeepSeek-V3.2 attention module (`DeepseekV32Attention`, a layer's
    `self_attn`) as a [`SparseLatentAttention`][attention.layer.sparse_index.SparseLatentAttention]
    with the same weights (copies), dtype, device and mode.

    Raises:
        TypeError: `module` is not a transformers attention module with an `indexer`.
        ValueError: a RoPE scaling other than none or YaRN's softmax factor (YaRN's angles
            are a model's: the layer takes them as `angles`).
    """
    config: Any = getattr(module, "config", None)
    if not isinstance(module, nn.Module) or not hasattr(module, "indexer") or config is None:
        raise TypeError(
            f"module must be transformers' DeepSeek-V3.2 attention (a module with "
            f"a config and an indexer), got {type(module).__name__}"
        )
    weight: Tensor = getattr(module, "q_a_proj").weight  # noqa: B009
    layer = SparseLatentAttention(
        **hf_latent_settings(module),
        index_topk=config.index_topk,
        index_n_heads=config.index_n_heads,
        index_head_dim=config.index_head_dim,
    ).to(device=weight.device, dtype=weight.dtype)
    layer.load_state_dict(module.state_dict(), strict=True)
    return layer.train(module.training)
