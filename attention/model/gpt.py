r"""The book's GPT (its chapter 4; this site's chapter 13) on this package's attention.

`GPTModel(cfg)` keeps the book's names, configuration keys and creation order, so under the
same seed it holds the book's weights and prints the book's numbers. Each
`TransformerBlock` is

$$
\begin{aligned}
x &\leftarrow x + \operatorname{drop}(\operatorname{Attention}(\operatorname{LN}_1(x))), \\
x &\leftarrow x + \operatorname{drop}(\operatorname{FeedForward}(\operatorname{LN}_2(x))),
\end{aligned}
$$

and its attention is the production
[`MultiHeadAttention`][attention.layer.multihead.MultiHeadAttention]. Three optional keys make a
current model of it: `n_kv_heads` (grouped-query attention), `rope_base` (rotary positions
instead of the learned position embedding) and `window` (a sliding window).

[`attention.model.generation`][attention.model.generation] writes text with it, through a
key/value cache per block ([`attention.layer.cache`][attention.layer.cache]); a batch of prompts
of different lengths runs with an `attention_mask` (1 = token, 0 = padding), and positions count
each row's own tokens.

Examples:
    >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
    >>> _ = torch.manual_seed(0)
    >>> model = GPTModel(cfg).eval()
    >>> prompt = torch.tensor([[1, 2, 3]])  # (batch, num_tokens)
    >>> model(prompt).shape  # (batch, num_tokens, vocab_size): a score for every next token
    torch.Size([1, 3, 50])
    >>> caches = model.init_caches(batch_size=1)  # one key/value cache per block
    >>> logits = model(prompt, caches)  # the prompt once (prefill) ...
    >>> step = model(torch.tensor([[4]]), caches)  # ... then one token at a time (decode)
    >>> torch.allclose(step[0, -1], model(torch.tensor([[1, 2, 3, 4]]))[0, -1], atol=1e-5)
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Size, Tensor, nn

from attention.checks import (
    check_config,
    check_dropout,
    check_flag,
    check_ids,
    check_size,
    check_tensor,
)
from attention.layer.arguments import check_documents
from attention.layer.cache import KVCache
from attention.layer.gated_delta import GatedDeltaState
from attention.layer.linear import LinearCache
from attention.layer.multihead import MultiHeadAttention
from attention.layer.tokens import Tokens, queries

__all__ = [
    "GELU",
    "GPT_CONFIG_124M",
    "FeedForward",
    "GPTModel",
    "LayerNorm",
    "TransformerBlock",
    "check_attention_mask",
]

GPT_CONFIG_124M: dict[str, Any] = {
    "vocab_size": 50257,  # the GPT-2 tokenizer's vocabulary
    "context_length": 1024,  # the longest sequence
    "emb_dim": 768,  # d_model
    "n_heads": 12,
    "n_layers": 12,
    "drop_rate": 0.1,
    "qkv_bias": False,
}
"""The book's configuration of the smallest GPT-2 (163 million parameters, untied output)."""

_REQUIRED = (
    "vocab_size",
    "context_length",
    "emb_dim",
    "n_heads",
    "n_layers",
    "drop_rate",
    "qkv_bias",
)
_OPTIONAL = ("n_kv_heads", "rope_base", "window", "sinks")


def _check_config(cfg: Mapping[str, Any]) -> None:
    check_config(cfg, _REQUIRED, _OPTIONAL, "a dict of the book's keys")
    for key in ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"):
        check_size(key, cfg[key])
    check_dropout(cfg["drop_rate"], "drop_rate")
    check_flag("qkv_bias", cfg["qkv_bias"])


class LayerNorm(nn.Module):
    r"""Layer normalisation over the last dimension, as in the book:
    $\text{scale} \cdot (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \text{shift}$.

    Args:
        emb_dim: the width normalised.
    """

    def __init__(self, emb_dim: int) -> None:
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x: Tensor) -> Tensor:
        # the formula above in one fused kernel (the book writes mean, var, sqrt out: the same
        # numbers to rounding, five kernels and their temporaries); torch.layer_norm is what
        # F.layer_norm calls, one Python call less on every decode step
        return torch.layer_norm(x, x.shape[-1:], self.scale, self.shift, self.eps)


class GELU(nn.Module):
    r"""GELU, in GPT-2's tanh approximation:
    $\tfrac12 x \left(1 + \tanh\!\left(\sqrt{2/\pi}\,(x + 0.044715\, x^3)\right)\right)$."""

    def forward(self, x: Tensor) -> Tensor:
        # the formula above, as torch's one kernel computes it (approximate="tanh")
        return F.gelu(x, approximate="tanh")


class FeedForward(nn.Module):
    """`emb_dim -> 4 emb_dim -> GELU -> emb_dim`, applied to each token on its own."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(cfg["emb_dim"], 4 * cfg["emb_dim"]),
            GELU(),
            nn.Linear(4 * cfg["emb_dim"], cfg["emb_dim"]),
        )

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.layers(x)
        return out


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward, each with a shortcut (residual) connection.

    The block calls its attention module, so a hook on `att` (or on any of its projections)
    fires inside a `GPTModel` too; the attention's own checks read only shapes, never values.

    Attributes:
        att: the block's `MultiHeadAttention` (causal; the config's heads, window and RoPE).
        ff: its `FeedForward`.
        norm1: `LayerNorm` before the attention.
        norm2: `LayerNorm` before the feed-forward.
        drop_shortcut: dropout on each branch before it is added back.
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        rope_base = cfg.get("rope_base")
        self.att = MultiHeadAttention(
            d_in=cfg["emb_dim"],
            d_out=cfg["emb_dim"],
            context_length=cfg["context_length"],
            num_heads=cfg["n_heads"],
            dropout=cfg["drop_rate"],
            qkv_bias=cfg["qkv_bias"],
            num_kv_heads=cfg.get("n_kv_heads"),
            window=cfg.get("window"),
            rope=rope_base is not None,
            rope_base=10000.0 if rope_base is None else rope_base,
            sinks=cfg.get("sinks", 0),
        )
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])
        self.record: list[Tensor] | None = None  # set: each forward appends its weights

    def forward(
        self,
        x: Tensor,
        cache: KVCache | None = None,
        *,
        padded: Tensor | None = None,
        documents: Tensor | None = None,
        positions: Tensor | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """`(b, T, emb_dim)` -> `(b, T, emb_dim)`; the model checked its inputs.

        `padded` (`(b, T)`, True = padding), `documents` (each token's document) and
        `positions` (each row's own, padding excluded) are given for a padded or packed
        batch, and `angles` (RoPE's cos and sin, made once by the model), as
        `MultiHeadAttention.forward` takes them.
        """
        shortcut = x
        record = self.record  # GPTModel.attention_weights: the explicit path, weights kept
        if record is None:
            x = self.att(
                self.norm1(x),
                padded,
                cache=cache,
                document_ids=documents,
                positions=positions,
                angles=angles,
            )
        else:
            x, weights = self.att(
                self.norm1(x),
                padded,
                True,
                cache=cache,
                document_ids=documents,
                positions=positions,
                angles=angles,
            )
            record.append(weights)  # (b, h, T, S)
        if self.training:  # dropout is the identity in eval: a decode step skips the call
            x = self.drop_shortcut(x)
        x = x + shortcut
        shortcut = x
        x = self.ff(self.norm2(x))  # (b, T, emb_dim)
        if self.training:
            x = self.drop_shortcut(x)
        return x + shortcut


class GPTModel(nn.Module):
    """The book's GPT: embeddings, `n_layers` transformer blocks, a final norm, the vocabulary head.

    Args:
        cfg: the book's keys (see [`GPT_CONFIG_124M`][attention.model.gpt.GPT_CONFIG_124M]), and
            optionally `n_kv_heads`, `rope_base` (a float: RoPE in every block instead of
            `pos_emb`, which is then not created) and `window`.

    Attributes:
        tok_emb: `nn.Embedding(vocab_size, emb_dim)`, created first.
        pos_emb: `nn.Embedding(context_length, emb_dim)`, or None with `rope_base`.
        drop_emb: dropout on the embeddings.
        trf_blocks: `nn.Sequential` of `n_layers` `TransformerBlock`s.
        final_norm: the last `LayerNorm`.
        out_head: `nn.Linear(emb_dim, vocab_size, bias=False)`, created last.

    Raises:
        TypeError: `cfg` is not a mapping, or a value of the wrong type.
        ValueError: a missing or unknown key, or a value out of range.
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        _check_config(cfg)
        self.context_length = cfg["context_length"]
        self.vocab_size = cfg["vocab_size"]
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = (
            None
            if cfg.get("rope_base") is not None
            else nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        )
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                _store_transposed(module)
        self.rotary = self.blocks[0].att.rotary  # RoPE: one table for every block
        for block in self.blocks:
            block.att.rotary = self.rotary

    @property
    def blocks(self) -> list[TransformerBlock]:
        """`trf_blocks` as a typed list: block 0 first."""
        return list(self.trf_blocks)  # type: ignore[arg-type]

    def forward(
        self,
        in_idx: Tensor,
        caches: list[KVCache] | None = None,
        *,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Logits for the token after each position: `(batch, num_tokens, vocab_size)`.

        Checks the ids, the caches and the mask, then runs
        [`logits`][attention.model.gpt.GPTModel.logits].

        Args:
            in_idx: token ids, `(batch, num_tokens)` (a tensor of any integer dtype, a NumPy
                array or nested lists).
            caches: one [`KVCache`][attention.layer.cache.KVCache] per block, from
                [`init_caches`][attention.model.gpt.GPTModel.init_caches]: `in_idx` continues the
                sequences they hold (positions continue from their length).
            attention_mask: `(batch, num_tokens)`, 1 (or True) for a token, 0 for padding
                (Hugging Face's convention): no query attends to padding, and each row's
                positions count its tokens only. A padded position's logits mean nothing.
            document_ids: `(batch, num_tokens)` non-negative ints: several documents packed in
                one row, each attending only within itself (not with caches or a mask).

        Raises:
            TypeError: ids or a mask of the wrong type, a cache that is not a `KVCache`.
            ValueError: a bad shape, an id outside the vocabulary, too many tokens, or caches
                that do not fit.
        """
        in_idx = check_ids(in_idx, "in_idx", self.vocab_size, device=self.tok_emb.weight.device)
        if in_idx.ndim != 2:
            raise ValueError(f"in_idx must be (batch, num_tokens), got {tuple(in_idx.shape)}")
        self._check_caches(caches, in_idx.shape[1])
        if caches is not None and caches[0].batch_size != in_idx.shape[0]:
            raise ValueError(
                f"caches were made for batch_size={caches[0].batch_size}, got a "
                f"batch of {in_idx.shape[0]}"
            )
        if attention_mask is not None:
            attention_mask = check_attention_mask(attention_mask, in_idx.shape, in_idx.device)
        if document_ids is not None:
            if caches is not None or attention_mask is not None:
                raise ValueError("document_ids: give them without caches and attention_mask")
            batch, num_tokens = in_idx.shape
            check_documents(document_ids, batch, num_tokens, in_idx.device)
        return self.logits(in_idx, caches, attention_mask=attention_mask, document_ids=document_ids)

    def attention_weights(
        self,
        in_idx: Tensor,
        *,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> Tensor:
        """Every layer's attention weights, from this model's own forward (no gradients).

        Each block runs its attention's explicit path (`need_weights`), so the weights are
        exactly what it computes: its mask, score modifiers, sinks, padding and documents.

        Returns:
            `(n_layers, batch, n_heads, num_tokens, num_tokens)`.
        """
        blocks, weights, training = self.blocks, list[Tensor](), self.training
        for block in blocks:
            block.record = weights
        try:
            with torch.no_grad():  # in eval mode: no dropout on the weights
                self.eval()(in_idx, attention_mask=attention_mask, document_ids=document_ids)
        finally:
            self.train(training)
            for block in blocks:
                block.record = None
        return torch.stack(weights)  # (L, b, h, T, T)

    def _check_caches(self, caches: list[KVCache] | None, num_tokens: int) -> None:
        if caches is None:
            if num_tokens > self.context_length:
                raise ValueError(
                    f"0 cached + {num_tokens} new tokens is longer than "
                    f"context_length={self.context_length}"
                )
            return
        blocks = self.blocks
        if not isinstance(caches, list | tuple) or len(caches) != len(blocks):
            raise ValueError(
                f"caches must be a list of one KVCache per block ({len(blocks)}), "
                f"got {caches!r:.60}"
            )
        if not all(isinstance(cache, KVCache | GatedDeltaState | LinearCache) for cache in caches):
            kinds = [type(cache).__name__ for cache in caches]
            raise TypeError(
                "caches must hold one cache per block (a KVCache, or a linear layer's "
                f"state, GatedDeltaState or LinearCache; from init_caches), got {kinds}"
            )
        if len({id(cache) for cache in caches}) != len(caches):
            raise ValueError(
                "caches must be distinct KVCache objects, one per block (from "
                "init_caches); got the same cache for several blocks"
            )
        for block, cache in zip(blocks, caches, strict=True):
            block.att.check_cache(cache, caches[0].batch_size, num_tokens)
        start = caches[0].length
        if any(cache.length != start for cache in caches):
            raise ValueError(
                "caches must hold the same tokens: one sequence per row, every "
                f"block; got lengths {[c.length for c in caches]}"
            )
        if not self.unbounded and start + num_tokens > self.context_length:
            raise ValueError(
                f"{start} cached + {num_tokens} new tokens is longer than "
                f"context_length={self.context_length}"
            )

    def embed(self, in_idx: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """Token embeddings, plus the position embeddings of `start ...` (without RoPE).

        Args:
            in_idx: token ids, `(batch, num_tokens)`.
            start: the first token's position.
            positions: or `(batch, num_tokens)`, each row's own (negative: padding, taken as 0).
        """
        x: Tensor = self.tok_emb(in_idx)  # (b, T, emb_dim)
        if self.pos_emb is not None and positions is not None:  # each row's own positions
            x = x + self.pos_emb(positions.clamp(min=0))
        elif self.pos_emb is not None:  # positions start..start+T-1 (after the cached tokens)
            num_tokens = in_idx.shape[1]
            x = x + self.pos_emb.weight[start : start + num_tokens]
        if self.training:  # dropout is the identity in eval: a decode step skips the call
            x = self.drop_emb(x)
        return x

    def logits(
        self,
        in_idx: Tensor,
        caches: list[KVCache] | None = None,
        *,
        last_only: bool = False,
        attention_mask: Tensor | None = None,
        document_ids: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """The forward's computation, without its checks (for `generate`, and compiling).

        Args:
            in_idx: token ids, `(batch, num_tokens)`.
            caches: one cache per block, or None.
            last_only: the vocabulary head at the last position only, `(batch, 1,
                vocab_size)`: all a prefill needs of its logits.
            attention_mask: `(batch, num_tokens)`, 1 for a token, 0 for padding, or None.
            document_ids: `(batch, num_tokens)` packed documents' ids, or None.
            positions: `(batch, num_tokens)` each row's positions, kept on the device by a
                static decode step ([`StaticDecode`][attention.model.decode.StaticDecode]);
                default: counted from the caches and the mask.
        """
        pad = None if attention_mask is None else attention_mask == 0  # (b, T): True = padding
        tokens = self.positions(in_idx, caches, pad, positions)  # once, for every block
        x = self.embed(in_idx, tokens.start or 0, None if tokens.start is not None else tokens.pos)
        angles = None  # RoPE's cos and sin at these positions: once, for every block
        if self.rotary is not None:
            angles = self.rotary.of(tokens, x.dtype)
        for i, block in enumerate(self.trf_blocks):
            x = block(
                x,
                None if caches is None else caches[i],
                padded=pad,
                documents=document_ids,
                positions=positions,
                angles=angles,
            )
        if last_only:
            x = x[:, -1:]  # (b, 1, emb_dim)
        logits: Tensor = self.out_head(self.final_norm(x))  # (b, T, vocab_size)
        return logits

    def positions(
        self,
        in_idx: Tensor,
        caches: list[KVCache] | None,
        padded: Tensor | None,
        positions: Tensor | None = None,
    ) -> Tokens:
        """The tokens' positions, as every block's attention counts them
        ([`queries`][attention.layer.tokens.queries]): `positions` if given, else each row's
        real tokens (`padded` True = padding) after what the caches hold: the first key/value
        cache's count, which knows each row's (a linear layer's state counts only tokens read)."""
        b, num_tokens = in_idx.shape
        cache = None if caches is None else caches[0]
        if cache is not None and not isinstance(cache, KVCache):  # a linear layer's state
            cache = next((c for c in caches if isinstance(c, KVCache)), cache)
        return queries(b, num_tokens, padded, positions, None, in_idx.device, cache)

    def init_caches(self, batch_size: int, max_tokens: int | None = None) -> list[KVCache]:
        """One empty key/value cache per block, for `batch_size` sequences of `max_tokens`.

        A block with a window gets a ring buffer of its window (and sinks), whatever
        `max_tokens`; the others a linear cache of `max_tokens` (default `context_length`).
        """
        if max_tokens is not None:
            check_size("max_tokens", max_tokens)
        blocks = self.blocks
        return [
            block.att.init_cache(batch_size, None if block.att.window is not None else max_tokens)
            for block in blocks
        ]

    @property
    def unbounded(self) -> bool:
        """Whether it can generate forever: RoPE and a window in every block (ring buffers)."""
        blocks = self.blocks
        return self.pos_emb is None and all(block.att.window is not None for block in blocks)


def _store_transposed(linear: nn.Linear) -> None:
    """Keep `linear.weight`'s values, shape and name, but lay it out `(in, out)` in memory.

    A batch-1 decode step multiplies each weight by one vector; over the `(out, in)` layout
    `nn.Linear` allocates, that product streams memory at about half the rate it reaches over
    `(in, out)` (GPT-2's own `Conv1D` layout; measured on the Performance page). The
    parameter stays an `(out, in)` tensor (a transposed view), so the `state_dict`, the
    book's seeded values, `load_state_dict` and `.to()` are unchanged.
    """
    weight = linear.weight
    linear.weight = nn.Parameter(weight.detach().t().contiguous().t(), weight.requires_grad)


def check_attention_mask(mask: object, shape: Size, device: torch.device) -> Tensor:
    """Check an `attention_mask` (1 or True for a token, 0 for padding) of the ids' shape.

    Examples:
        >>> check_attention_mask(torch.tensor([[0, 2]]), torch.Size([1, 2]), torch.device("cpu"))
        Traceback (most recent call last):
        ...
        ValueError: attention_mask must hold only 0 (padding) and 1 (a token), got 2
    """
    mask = check_tensor("attention_mask", mask)
    if mask.shape != shape:
        raise ValueError(
            f"attention_mask must have the ids' shape {tuple(shape)}, got {tuple(mask.shape)}"
        )
    if mask.is_floating_point() or mask.is_complex():
        raise TypeError(
            f"attention_mask must be bool or integer (1 = token, 0 = padding), "
            f"got dtype {mask.dtype}"
        )
    if mask.device != device:
        raise ValueError(f"attention_mask must be on the ids' device {device}, got {mask.device}")
    if mask.dtype != torch.bool and mask.numel():
        low, high = (int(v) for v in torch.aminmax(mask))
        if low < 0 or high > 1:
            raise ValueError(
                "attention_mask must hold only 0 (padding) and 1 (a token), got "
                f"{low if low < 0 else high}"
            )
    return mask
