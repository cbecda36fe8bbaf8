r"""The Llama block beside GPT-2's, and the model that stacks it.

What changed from the book's GPT-2 block ([`TransformerBlock`][attention.model.gpt.TransformerBlock])
in the Llama family (Llama 2 and 3, Mistral, Qwen, Gemma, OLMo, SmolLM):

| | GPT-2 | Llama family |
|---|---|---|
| norm | LayerNorm: $(x - \mu)/\sigma \cdot \gamma + \beta$ | RMSNorm: $x / \operatorname{rms}(x) \cdot g$ |
| feed-forward | $W_2\, \operatorname{GELU}(W_1 x)$, $4d$ wide | SwiGLU: $W_d\,(\operatorname{SiLU}(W_g x) \odot W_u x)$ |
| biases | everywhere | none |
| positions | a learned table added once | RoPE in every attention layer (or none: NoPE) |
| attention | $h$ heads of keys and values | grouped-query; QK-norm; windows per layer |

The block is pre-norm by default (Llama: a norm before each branch), and takes the two
other placements of the family:

$$
\begin{aligned}
\text{pre:}\quad & x \leftarrow x + f(\operatorname{N}(x)), \\
\text{sandwich:}\quad & x \leftarrow x + \operatorname{N}'(f(\operatorname{N}(x))), \\
\text{post:}\quad & x \leftarrow x + \operatorname{N}'(f(x)),
\end{aligned}
$$

for each branch $f$, the attention and the feed-forward: pre in Llama, Qwen and Mistral,
sandwich in Gemma 2 and 3, post in OLMo 2. Gemma also multiplies the token
embeddings by $\sqrt{d}$ and may soft-cap the logits, $c \tanh(z / c)$.

[`LlamaModel`][attention.model.llama_block.LlamaModel] is a
[`GPTModel`][attention.model.gpt.GPTModel]: the same forward, checks, caches and
[`generate`][attention.model.generation.generate]; only its blocks, its embedding and its
head differ, and each layer's attention is given on its own (a window here, no RoPE there).
[`from_hf`][attention.model.from_hf.from_hf] builds one from transformers' models.

A layer may also be linear attention: a [`GatedDeltaNet`][attention.layer.gated_delta.GatedDeltaNet]
(Qwen3-Next's, three layers in four), whose cache is its state, of a fixed size
([`GatedDeltaState`][attention.layer.gated_delta.GatedDeltaState]); with softmax layers that
gate their output (`output_gate=True`), this is Qwen3-Next's model with a dense feed-forward.

Examples:
    >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "hidden_dim": 48,
    ...        "n_layers": 2, "layers": [{"num_heads": 4, "num_kv_heads": 2, "rope": True}] * 2}
    >>> _ = torch.manual_seed(0)
    >>> model = LlamaModel(cfg).eval()
    >>> model.blocks[0].ff.extra_repr()
    '32 -> 48 -> 32, act=silu'
    >>> caches = model.init_caches(batch_size=1)
    >>> logits = model(torch.tensor([[1, 2, 3]]), caches)
    >>> step = model(torch.tensor([[4]]), caches)
    >>> torch.allclose(step[0, -1], model(torch.tensor([[1, 2, 3, 4]]))[0, -1], atol=1e-5)
    True
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.checks import check_config, check_flag, check_positive, check_size
from attention.layer.cache import KVCache
from attention.layer.gated_delta import GatedDeltaNet, GatedDeltaState
from attention.layer.latent import MultiHeadLatentAttention
from attention.layer.multihead import MultiHeadAttention
from attention.layer.positions import RotaryTable
from attention.layer.qk_norm import RMSNorm
from attention.model.experts import MixtureOfExperts
from attention.model.gpt import GPTModel

__all__ = ["ACTIVATIONS", "NORMS", "LlamaBlock", "LlamaModel", "SwiGLU"]


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,  # Llama, Qwen, Mistral, OLMo, SmolLM
    "gelu_pytorch_tanh": _gelu_tanh,  # Gemma (GeGLU)
    "gelu_tanh": _gelu_tanh,
    "gelu": F.gelu,
}
"""The gate's activation, by transformers' names (`hidden_act`, `hidden_activation`)."""

NORMS = ("pre", "sandwich", "post")
"""Where a block's norms sit: before each branch, before and after, after only."""

_REQUIRED = ("vocab_size", "context_length", "emb_dim", "hidden_dim", "n_layers", "layers")
_OPTIONAL = (
    "act",
    "norm_eps",
    "norms",
    "tie_embeddings",
    "embed_scale",
    "final_softcap",
    "experts",
)
_ROUTING = ("scoring", "groups", "topk_group", "scale", "choice_bias")
_EXPERT_KEYS = (
    "num_experts",
    "top_k",
    "hidden_dim",
    "normalize",
    "shared_dim",
    "shared_gate",
    "scale_input",
    *_ROUTING,
)


class SwiGLU(nn.Module):
    r"""$W_d\,(\operatorname{act}(W_g x) \odot W_u x)$: a gated feed-forward, no biases.

    Args:
        emb_dim: $d$.
        hidden_dim: the gate's width.
        act: `silu` (SwiGLU) or a GELU (GeGLU), from `ACTIVATIONS`.
    """

    def __init__(self, emb_dim: int, hidden_dim: int, act: str = "silu") -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
        self.act_name, self.act = act, ACTIVATIONS[act]
        self.gate_proj = nn.Linear(emb_dim, hidden_dim, bias=False)  # W_g
        self.up_proj = nn.Linear(emb_dim, hidden_dim, bias=False)  # W_u
        self.down_proj = nn.Linear(hidden_dim, emb_dim, bias=False)  # W_d

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # (b, T, d)
        return out

    def extra_repr(self) -> str:
        d, hidden = self.gate_proj.in_features, self.gate_proj.out_features
        return f"{d} -> {hidden} -> {d}, act={self.act_name}"


class LlamaBlock(nn.Module):
    """RMSNorm, attention, RMSNorm, SwiGLU, each branch added back (the module's equations).

    Args:
        cfg: the model's config (`emb_dim`, `hidden_dim`, `context_length`, and optionally
            `act`, `norm_eps`, `norms`).
        layer: this layer's attention: a `MultiHeadAttention` (`emb_dim` wide), or its
            keyword arguments (its heads, RoPE, window, QK-norm, ...), to which the block adds
            `d_in`, `d_out`, `context_length`, `dropout=0` and `causal=True`; a
            `MultiHeadLatentAttention` (DeepSeek-V3's); or a `GatedDeltaNet` (`emb_dim`
            wide): linear attention, whose cache is its state.
        experts: this layer's feed-forward as a mixture of experts: `num_experts`, `top_k`,
            `hidden_dim` (each expert's), and optionally `normalize` (True), `shared_dim` (a
            shared expert's width), `shared_gate`, `scale_input` and the router's `scoring`,
            `groups`, `topk_group`, `scale`, `choice_bias`; None: one `SwiGLU` of `cfg`'s
            `hidden_dim`.

    Attributes:
        att: the `MultiHeadAttention`, `MultiHeadLatentAttention` or `GatedDeltaNet`.
        ff: the `SwiGLU`, or the `MixtureOfExperts`.
        norm1: the norm before the attention (None in a post-norm block).
        norm2: the norm before the feed-forward (None in a post-norm block).
        post_att_norm: the norm on the attention's output (sandwich, post), else None.
        post_ff_norm: the norm on the feed-forward's output (sandwich, post), else None.
    """

    def __init__(
        self,
        cfg: Mapping[str, Any],
        layer: MultiHeadAttention | GatedDeltaNet | Mapping[str, Any],
        experts: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        d, eps, norms = cfg["emb_dim"], cfg.get("norm_eps", 1e-6), cfg.get("norms", "pre")
        self.att: MultiHeadAttention | MultiHeadLatentAttention | GatedDeltaNet
        if isinstance(layer, MultiHeadAttention | MultiHeadLatentAttention | GatedDeltaNet):
            projection = (
                layer.o_proj if isinstance(layer, MultiHeadLatentAttention) else (layer.out_proj)
            )
            out = projection.out_features
            if (layer.d_in, out) != (d, d):
                raise ValueError(
                    f"a layer's attention must map emb_dim={d} to {d}, got d_in={layer.d_in}, "
                    f"out_features={out}"
                )
            self.att = layer
        elif isinstance(layer, Mapping):
            self.att = MultiHeadAttention(
                d, d, cfg["context_length"], **{"dropout": 0.0, "causal": True, **layer}
            )
        else:
            raise TypeError(
                "each of cfg's layers must be a MultiHeadAttention, a dict of its keyword "
                "arguments, a MultiHeadLatentAttention or a GatedDeltaNet, got "
                f"{type(layer).__name__}"
            )
        self.ff: SwiGLU | MixtureOfExperts = _feed_forward(cfg, experts)
        pre, post = norms in ("pre", "sandwich"), norms in ("sandwich", "post")
        self.norm1: RMSNorm | None = RMSNorm(d, eps) if pre else None
        self.norm2: RMSNorm | None = RMSNorm(d, eps) if pre else None
        self.post_att_norm: RMSNorm | None = RMSNorm(d, eps) if post else None
        self.post_ff_norm: RMSNorm | None = RMSNorm(d, eps) if post else None
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
        """`(b, T, emb_dim)` -> `(b, T, emb_dim)`; `TransformerBlock.forward`'s arguments.

        Raises:
            NotImplementedError: a linear-attention layer given padding after a token or in a
                later chunk, documents, or asked for its weights (it has no softmax weights).
        """
        h: Tensor = x if self.norm1 is None else self.norm1(x)  # (b, T, emb_dim)
        kwargs = {
            "cache": cache,
            "document_ids": documents,
            "positions": positions,
            "angles": angles,
        }
        if isinstance(self.att, GatedDeltaNet):
            _check_linear(padded, documents, self.record, cache)
            assert cache is None or isinstance(cache, GatedDeltaState)  # checked by the model
            if padded is not None:  # left padding, read as zeros: the state stays empty
                h = h.masked_fill(padded[..., None], 0.0)
            h = self.att(h, state=cache)  # positions: none enter a linear layer
        elif self.record is None:
            h = self.att(h, padded, **kwargs)
        else:  # GPTModel.attention_weights
            h, weights = self.att(h, padded, True, **kwargs)
            self.record.append(weights)  # (b, h, T, S)
        if self.post_att_norm is not None:
            h = self.post_att_norm(h)
        x = x + h  # the attention's branch
        h = self.ff(x if self.norm2 is None else self.norm2(x))  # (b, T, emb_dim)
        if self.post_ff_norm is not None:
            h = self.post_ff_norm(h)
        return x + h  # the feed-forward's branch


def _feed_forward(
    cfg: Mapping[str, Any], experts: Mapping[str, Any] | None
) -> SwiGLU | MixtureOfExperts:
    """A layer's feed-forward: `cfg`'s SwiGLU, or the mixture of experts `experts` names."""
    d, act = cfg["emb_dim"], cfg.get("act", "silu")
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    if experts is None:
        return SwiGLU(d, cfg["hidden_dim"], act)
    unknown = sorted(set(experts) - set(_EXPERT_KEYS))
    if unknown:
        raise ValueError(f"cfg's experts have unknown keys {unknown}; known: {_EXPERT_KEYS}")
    missing = [key for key in ("num_experts", "top_k", "hidden_dim") if key not in experts]
    if missing:
        raise ValueError(f"cfg's experts need {missing}, got the keys {sorted(experts)}")
    shared = experts.get("shared_dim")
    if shared is not None:
        check_size("shared_dim", shared)
    return MixtureOfExperts(
        d,
        experts["hidden_dim"],
        experts["num_experts"],
        experts["top_k"],
        act=ACTIVATIONS[act],
        normalize=experts.get("normalize", True),
        shared_expert=None if shared is None else SwiGLU(d, shared, act),
        shared_gate=experts.get("shared_gate", False),
        scale_input=experts.get("scale_input", False),
        **{key: experts[key] for key in _ROUTING if key in experts},
    )


def _check_linear(
    padded: Tensor | None, documents: Tensor | None, record: object, state: object = None
) -> None:
    """Refuse what a Gated DeltaNet layer here does not take, by name: document ids, weights,
    and padding other than before the first token of a sequence's first chunk. There it is
    exact (transformers' rule): read as zeros, a padded token leaves the empty state empty."""
    if documents is not None:
        raise NotImplementedError(
            "a GatedDeltaNet layer takes no document_ids here: its state reads every token of "
            "a row in order"
        )
    if padded is not None and bool(padded.any()):
        after_a_token = bool((padded[:, 1:] & ~padded[:, :-1]).any())
        continued = isinstance(state, GatedDeltaState) and state.length > 0
        if after_a_token or continued:
            raise NotImplementedError(
                "a GatedDeltaNet layer takes attention_mask padding only on the left of a "
                "sequence's first chunk (its state would fade over padding after a token); "
                f"got padding {'after a token' if after_a_token else 'in a later chunk'}"
            )
    if record is not None:
        raise NotImplementedError("a GatedDeltaNet layer has no softmax weights to return")


def _check_config(cfg: Mapping[str, Any]) -> None:
    check_config(cfg, _REQUIRED, _OPTIONAL)
    for key in ("vocab_size", "context_length", "emb_dim", "hidden_dim", "n_layers"):
        check_size(key, cfg[key])
    layers = cfg["layers"]
    if not isinstance(layers, list | tuple) or len(layers) != cfg["n_layers"]:
        raise ValueError(
            f"cfg's layers must be a list of n_layers={cfg['n_layers']} dicts (each layer's "
            f"attention), got {layers!r:.60}"
        )
    experts = cfg.get("experts")
    if experts is not None and (
        not isinstance(experts, list | tuple)
        or len(experts) != cfg["n_layers"]
        or not all(e is None or isinstance(e, Mapping) for e in experts)
    ):
        raise ValueError(
            f"cfg's experts must be a list of n_layers={cfg['n_layers']} entries, each None "
            f"(a SwiGLU) or a dict of a mixture of experts' settings, got {experts!r:.60}"
        )
    if cfg.get("norms", "pre") not in NORMS:
        raise ValueError(f"cfg's norms must be one of {', '.join(NORMS)}, got {cfg['norms']!r}")
    check_flag("tie_embeddings", cfg.get("tie_embeddings", False))
    for key in ("norm_eps", "embed_scale", "final_softcap"):
        if cfg.get(key) is not None:
            check_positive(key, cfg[key])


class LlamaModel(GPTModel):
    """Embeddings, `n_layers` Llama blocks, a final RMSNorm, the vocabulary head: a `GPTModel`.

    Args:
        cfg: `vocab_size`, `context_length`, `emb_dim`, `hidden_dim` (the feed-forward's
            width), `n_layers`, `layers` (one per layer: its `MultiHeadAttention`,
            or a dict of its keyword arguments), and optionally `act` (default `silu`),
            `norm_eps` (1e-6), `norms` (`pre`, `sandwich` or `post`), `tie_embeddings`
            (the head is the embedding),
            `embed_scale` (Gemma's $\\sqrt{d}$), `final_softcap` (Gemma 2's) and `experts`
            (one per layer: None, or a mixture of experts' settings, as `LlamaBlock` takes).

    Attributes:
        tok_emb: `nn.Embedding(vocab_size, emb_dim)`.
        pos_emb: None (positions are RoPE's, in the attention).
        trf_blocks: `nn.Sequential` of `LlamaBlock`s.
        final_norm: an `RMSNorm`.
        out_head: `nn.Linear(emb_dim, vocab_size, bias=False)`; its weight is `tok_emb`'s with
            `tie_embeddings`.
        rotary: None: each layer keeps its own table, one per distinct RoPE, shared.

    Raises:
        TypeError: `cfg` is not a mapping, or a value of the wrong type.
        ValueError: a missing or unknown key, or a value out of range.
    """

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        nn.Module.__init__(self)
        _check_config(cfg)
        self.context_length, self.vocab_size = cfg["context_length"], cfg["vocab_size"]
        self.embed_scale, self.final_softcap = cfg.get("embed_scale"), cfg.get("final_softcap")
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = None
        self.drop_emb = nn.Dropout(0.0)
        experts = cfg.get("experts") or [None] * cfg["n_layers"]
        pairs = zip(cfg["layers"], experts, strict=True)
        self.trf_blocks = nn.Sequential(*[LlamaBlock(cfg, layer, each) for layer, each in pairs])
        self.final_norm = RMSNorm(cfg["emb_dim"], cfg.get("norm_eps", 1e-6))  # type: ignore[assignment]
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)
        if cfg.get("tie_embeddings", False):
            self.out_head.weight = self.tok_emb.weight
        self.rotary = None
        tables: dict[tuple[object, ...], RotaryTable] = {}
        for block in self.blocks:  # one table per distinct RoPE (Gemma 3: local and global)
            table = block.att.rotary
            if table is not None:
                key = (table.head_dim, table.base, table.scaling)
                block.att.rotary = tables.setdefault(key, table)

    @property
    def blocks(self) -> list[LlamaBlock]:  # type: ignore[override]
        """`trf_blocks` as a typed list: block 0 first."""
        return list(self.trf_blocks)  # type: ignore[arg-type]

    def embed(self, in_idx: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """Token embeddings, times `embed_scale` (Gemma's $\\sqrt{d}$, in the weights' dtype)."""
        x: Tensor = self.tok_emb(in_idx)  # (b, T, emb_dim)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
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
        """`GPTModel.logits` with each layer's own RoPE (or none), and Gemma's soft cap."""
        pad = None if attention_mask is None else attention_mask == 0  # (b, T): True = padding
        linear = [i for i, block in enumerate(self.blocks) if isinstance(block.att, GatedDeltaNet)]
        if linear:  # checked before any cache takes the chunk
            _check_linear(pad, document_ids, None, None if caches is None else caches[linear[0]])
        tokens = self.positions(in_idx, caches, pad, positions)  # once, for every block
        x = self.embed(in_idx)
        made: dict[int, tuple[Tensor, Tensor]] = {}  # each table's cos and sin, made once
        for i, block in enumerate(self.blocks):
            table, angles = block.att.rotary, None
            if table is not None:
                if id(table) not in made:
                    made[id(table)] = table.of(tokens, x.dtype)
                angles = made[id(table)]
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
        if self.final_softcap is not None:  # c tanh(z / c)
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
