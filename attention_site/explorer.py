r"""The attention explorer: a trained GPT, run in the reader's browser, checked against PyTorch.

[`explorer_html`][attention_site.explorer.explorer_html] ships a
[`GPTModel`][attention.model.gpt.GPTModel] to a page: its weights as one float32 file, and its
configuration and vocabulary as JSON. The site's `docs/javascripts/model.js` holds a forward
pass written for this model (LayerNorm, RoPE or learned positions, grouped heads, the
feed-forward, the vocabulary head), and `docs/javascripts/explorer.js` runs it on whatever the
reader types and draws what it computed. Every head computes

$$
\alpha = \operatorname{softmax}\!\left(\frac{Q K^\top}{\tau \sqrt{d_h}} + M\right),
$$

with the temperature $\tau$ and the mask $M$ the reader picks
([`Settings`][attention_site.explorer.Settings]: causal, a window, a window with sinks, or two
documents), and heads may be knocked out.
[`reference`][attention_site.explorer.reference] is the same computation by the package's own
modules: the site's build runs the browser's forward in headless Chromium on sequences it
chose and on random ones, and fails unless logits and weights agree within `TOLERANCE` of its
float32 answer and `EXACT` of its float64 one.

Examples:
    >>> _ = torch.manual_seed(0)
    >>> cfg = {"vocab_size": 10, "context_length": 8, "emb_dim": 16,
    ...        "n_heads": 2, "n_layers": 2, "drop_rate": 0.0,
    ...        "qkv_bias": False, "rope_base": 10000.0}
    >>> model = GPTModel(cfg).eval()
    >>> meta, blob = export_model(model, [f"t{i}" for i in range(10)])
    >>> meta["n_layers"], meta["n_heads"], meta["rope_base"]
    (2, 2, 10000.0)
    >>> len(blob) == 4 * meta["floats"]  # float32s
    True
    >>> meta["tensors"]["tok_emb.weight"]  # [offset, shape] in float32s
    [0, [10, 16]]
    >>> idx = torch.tensor([[1, 2, 3, 1, 2, 3]])  # (1, T)
    >>> window = Settings(mask="window", window=2)
    >>> logits, weights = reference(model, idx, window)
    >>> logits.shape, weights.shape  # (T, V), (n_layers, n_heads, T, T)
    (torch.Size([6, 10]), torch.Size([2, 2, 6, 6]))
    >>> float(weights[0, 0, 5, :4].sum())  # a window of 2: keys 4 and 5 only
    0.0
"""

from __future__ import annotations

import hashlib
import html
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from attention.checks import check_ids, check_size
from attention.lab.heads import ablate_head, model_weights
from attention.layer.masks import Mask, from_flags
from attention.model.gpt import GPTModel

__all__ = [
    "EXACT",
    "MASKS",
    "TOLERANCE",
    "Published",
    "Settings",
    "check_cases",
    "explorer_html",
    "export_model",
    "published",
    "reference",
    "repeat_accuracy",
    "showcase",
]

TOLERANCE = 1e-4
"""The most the browser's weights may differ from PyTorch's float32 ones, and its logits
relative to their size (at least 1): the browser computes in float64, PyTorch in float32."""

EXACT = 1e-9
"""The most the browser's logits and weights may differ from PyTorch's in float64 (the same
float32 weights, turned into float64): only the order of the additions differs."""

MASKS = ("causal", "window", "sinks", "documents")
"""The masks the explorer offers: causal; a window; a window and its sinks; two documents."""

_FALLBACK = (
    "The attention explorer needs JavaScript, which is turned off or did not load: the model "
    "runs in the browser."
)


@dataclass(frozen=True)
class Settings:
    """What the reader chose: the mask, the temperature, and the heads knocked out.

    Args:
        mask: one of [`MASKS`][attention_site.explorer.MASKS].
        window: with `"window"` and `"sinks"`, the keys a query sees: its last `window`.
        sinks: with `"sinks"`, the first `sinks` positions, always visible.
        split: with `"documents"`, where the second document starts (tokens before it are
            the first document; none sees the other's).
        temperature: $\\tau > 0$, dividing every head's scores.
        ablate: the `(layer, head)` pairs knocked out: their context vectors are zeroed.

    Raises:
        ValueError: an unknown mask, a size below 1 (`sinks`, `split`: below 0), a
            temperature that is not a finite number above 0, or `ablate` not distinct pairs
            of ints >= 0.
    """

    mask: str = "causal"
    window: int = 4
    sinks: int = 1
    split: int = 0
    temperature: float = 1.0
    ablate: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.mask not in MASKS:
            raise ValueError(f"mask must be one of {MASKS}, got {self.mask!r}")
        check_size("window", self.window)
        check_size("sinks", self.sinks, minimum=0)
        check_size("split", self.split, minimum=0)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
            raise ValueError(f"temperature must be a finite number > 0, got {t!r}")
        object.__setattr__(self, "ablate", _pairs(self.ablate))  # a list becomes a tuple

    def rule(self) -> Mask:
        """The layers' visibility rule under this mask (documents: causal, plus the ids)."""
        window = self.window if self.mask in ("window", "sinks") else None
        return from_flags(True, window, self.sinks * (self.mask == "sinks"))

    def document_ids(self, num_tokens: int) -> Tensor | None:
        """`(1, num_tokens)`: 0 before `split`, 1 from it; None unless the mask is documents."""
        if self.mask != "documents":
            return None
        return (torch.arange(num_tokens) >= self.split).long()[None]


def _pairs(ablate: object) -> tuple[tuple[int, int], ...]:
    """`ablate` as a tuple of distinct `(layer, head)` pairs of ints >= 0, or a clear error."""
    bad = ValueError(f"ablate must be distinct (layer, head) pairs of ints >= 0, got {ablate!r}")
    if isinstance(ablate, str) or not isinstance(ablate, tuple | list):
        raise bad
    pairs = tuple(tuple(pair) if isinstance(pair, tuple | list) else () for pair in ablate)
    for pair in pairs:
        if len(pair) != 2 or not all(type(v) is int and v >= 0 for v in pair):
            raise bad
    if len(set(pairs)) != len(pairs):
        raise bad
    return pairs


def export_model(model: GPTModel, vocab: Sequence[str]) -> tuple[dict[str, Any], bytes]:
    """The model's configuration and its weights, as the browser's forward reads them.

    Args:
        model: a `GPTModel` in float32 or float64 (sent as float32): learned or rotary
            positions, any heads and key/value heads, any bias; no learned sink logits.
        vocab: the text of each token id, `vocab_size` strings.

    Returns:
        `(meta, blob)`: `meta` a JSON-ready dict (`n_layers`, `n_heads`, `n_kv_heads`,
        `head_dim`, `emb_dim`, `vocab_size`, `context_length`, `rope_base` or None, `eps`,
        `vocab`, `floats`, and `tensors`: each state-dict name's `[offset, shape]` in
        float32s); `blob` the tensors, float32 little-endian, one after another.

    Raises:
        TypeError: `model` is not a `GPTModel`, `vocab` not a list or tuple of strings.
        ValueError: `vocab` of the wrong length, with repeats or an empty string, or a model
            the browser cannot run.
    """
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a GPTModel, got {type(model).__name__}")
    if not isinstance(vocab, list | tuple) or not all(isinstance(v, str) for v in vocab):
        raise TypeError(f"vocab must be a list or tuple of token strings, got {vocab!r:.60}")
    if len(vocab) != model.vocab_size:
        raise ValueError(f"vocab must hold vocab_size={model.vocab_size} strings, got {len(vocab)}")
    if len(set(vocab)) != len(vocab) or "" in vocab:
        raise ValueError("vocab must hold distinct, non-empty strings: the browser reads text")
    att = model.blocks[0].att
    for i, block in enumerate(model.blocks):  # the browser's forward: its spec or nothing
        unsupported = block.att.spec.unsupported(allow=("mask", "rope", "num_kv_heads"))
        if unsupported or block.att.rule != att.rule:
            found = unsupported or [f"mask={block.att.rule!r} (block 0: {att.rule!r})"]
            raise ValueError(f"the browser runs blocks of one mask and no more; block {i} "
                             f"has {', '.join(found)}")  # fmt: skip
    tensors, chunks, offset = {}, [], 0
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().to("cpu", torch.float32).contiguous().flatten()
        tensors[name] = [offset, list(tensor.shape)]
        chunks.append(flat.numpy().astype("<f4").tobytes())
        offset += flat.numel()
    meta = {
        "n_layers": len(model.blocks), "n_heads": att.num_heads,
        "n_kv_heads": att.num_kv_heads, "head_dim": att.head_dim,
        "emb_dim": model.tok_emb.embedding_dim, "vocab_size": model.vocab_size,
        "context_length": model.context_length,
        "rope_base": None if att.rotary is None else float(att.rotary.base),
        "eps": model.final_norm.eps, "vocab": list(vocab), "floats": offset, "tensors": tensors,
    }  # fmt: skip
    return meta, b"".join(chunks)


@contextmanager
def _settings(model: GPTModel, settings: Settings) -> Iterator[None]:
    """Inside: every layer masks by `settings`' rule, its queries scaled by 1 / temperature
    (RoPE is linear: the scores divide by it), and the ablated heads write nothing."""
    temperature = settings.temperature
    with ExitStack() as stack:  # whatever raises below, the model is given back
        for block in model.blocks:
            stack.callback(block.att.replace, mask=block.att.rule)  # the spec, swapped whole
            block.att.replace(mask=settings.rule())
            scale = block.att.W_query.register_forward_hook(lambda m, a, q: q / temperature)
            stack.callback(scale.remove)
        for layer, head in settings.ablate:
            stack.enter_context(ablate_head(model, layer, head))
        yield


def reference(
    model: GPTModel, idx: Tensor, settings: Settings | None = None
) -> tuple[Tensor, Tensor]:
    """What the browser must compute for `idx` under `settings`, by the package's modules.

    Args:
        model: a `GPTModel` (its own rule is set aside for the duration: `settings` decides).
        idx: `(1, num_tokens)` token ids.
        settings: the reader's choices; default `Settings()` (causal, temperature 1).

    Returns:
        `(logits, weights)`: `(num_tokens, vocab_size)` and `(n_layers, n_heads, num_tokens,
        num_tokens)`, in the model's dtype.

    Raises:
        TypeError: `model` not a `GPTModel`, `settings` not `Settings`, `idx` not ids.
        ValueError: `model` in training mode (dropout would make the answer random), `idx`
            not `(1, num_tokens)` ids of the vocabulary with `num_tokens >= 1`, or an ablated
            head the model does not have.
    """
    settings = Settings() if settings is None else settings
    if not isinstance(settings, Settings):
        raise TypeError(f"settings must be a Settings, got {type(settings).__name__}")
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a GPTModel, got {type(model).__name__}")
    if model.training:
        raise ValueError("model must be in eval mode (model.eval()): dropout is random")
    idx = check_ids(idx, "idx", model.vocab_size, device=model.tok_emb.weight.device)
    if idx.ndim != 2 or idx.shape[0] != 1 or idx.shape[1] < 1:
        raise ValueError(f"idx must be (1, num_tokens), num_tokens >= 1, got {tuple(idx.shape)}")
    docs = settings.document_ids(idx.shape[1])
    with _settings(model, settings), torch.no_grad():
        logits = model(idx, document_ids=docs)[0]  # (T, V)
        weights = model_weights(model, idx, docs)[:, 0]  # (L, H, T, T)
    return logits, weights


def check_cases(
    model: GPTModel, sequences: Mapping[str, Tensor], num_random: int = 12, seed: int = 0
) -> list[tuple[Tensor, Settings]]:
    """The sequences the build checks the browser on: each named one under every mask, and
    `num_random` random ones (random lengths up to the context, the first as long as it,
    random masks, temperatures and ablated heads)."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for idx in sequences.values():
        split = idx.shape[1] // 2
        for mask in MASKS:
            cases.append((idx, Settings(mask=mask, window=3, sinks=1, split=split)))
    n_layers, n_heads = len(model.blocks), model.blocks[0].att.num_heads
    for k in range(num_random):  # the first as long as the context
        T = int(torch.randint(2, model.context_length + 1, (1,), generator=g))
        T = model.context_length if k == 0 else T
        pick = torch.randint(1 << 16, (6,), generator=g).tolist()
        heads = torch.randperm(n_layers * n_heads, generator=g).tolist()
        settings = Settings(
            mask=MASKS[pick[0] % len(MASKS)],
            window=1 + pick[1] % T,
            sinks=pick[2] % 3,
            split=pick[3] % (T + 1),
            temperature=0.25 * (1 + pick[4] % 12),
            ablate=tuple(divmod(k, n_heads) for k in heads[: pick[5] % 3]),  # 0 to 2 heads
        )
        cases.append((torch.randint(model.vocab_size, (1, T), generator=g), settings))
    return cases


def _reads_the_copy(model: GPTModel, idx: Tensor, layer: int, head: int) -> bool:
    """At the last token of `idx` `(1, T)`: the head's largest weight is on a key that followed
    an earlier copy of that token, and the model predicts that key's token, with a
    probability of at least 1/2."""
    with torch.no_grad():
        probabilities = model(idx)[0, -1].softmax(-1)  # (V,)
    weights = model_weights(model, idx)[layer, 0, head, -1]  # (T,): the last query's row
    key, ids = int(weights.argmax()), idx[0].tolist()
    if not (0 < key < len(ids) and ids[key - 1] == ids[-1]):
        return False
    return int(probabilities.argmax()) == ids[key] and float(probabilities.max()) >= 0.5


def showcase(model: GPTModel, candidates: Mapping[str, Tensor], layer: int, head: int) -> str:
    """The first candidate on which one head visibly does induction: the sequence to open on.

    The explorer pins the last token of a sequence. On the candidate returned, the head's
    largest weight from that token is on the token that followed an earlier copy of it, and
    the model predicts that token (with a probability of at least 1/2), so what the reader
    sees first is the mechanism working.

    Args:
        model: a `GPTModel` in eval mode.
        candidates: named `(1, num_tokens)` sequences, tried in order.
        layer: the head's layer.
        head: the head.

    Returns:
        The first such candidate's name.

    Raises:
        ValueError: no candidate works (the message says how many were tried), or `layer` or
            `head` is not the model's.
    """
    if layer >= len(model.blocks) or head >= model.blocks[0].att.num_heads:
        raise ValueError(f"layer {layer}, head {head} is not a head of the model")
    for name, idx in candidates.items():
        if _reads_the_copy(model, idx, layer, head):
            return name
    raise ValueError(f"layer {layer}, head {head} reads the copy and the model predicts it on "
                     f"none of the {len(candidates)} candidates")  # fmt: skip


def repeat_accuracy(
    model: GPTModel, lengths: Sequence[int], vocab_size: int, count: int = 100, seed: int = 0
) -> dict[int, float]:
    """How often the model continues a repeat as the explorer's reader sees it, by its length.

    For each length `n`: `count` sequences of `n` random tokens typed twice (`2n` tokens, as
    the explorer's Repeat button makes them); the share after which the model's top prediction
    is the first token again (the token that followed the earlier copy of the last one).

    Args:
        model: a `GPTModel` in eval mode, with a context of at least `2 * max(lengths)`.
        lengths: the typed lengths `n` to try, each at least 1.
        vocab_size: tokens are drawn from `0 .. vocab_size - 1`.
        count: sequences per length.
        seed: seeds the draws.

    Returns:
        `{n: share}`, each share in `[0, 1]`.
    """
    check_size("count", count)
    check_size("vocab_size", vocab_size, minimum=2)
    g = torch.Generator().manual_seed(seed)
    shares = {}
    for n in lengths:
        check_size("lengths", n)
        if 2 * n > model.context_length:
            raise ValueError(f"lengths: {n} typed twice is longer than the context, "
                             f"{model.context_length}")  # fmt: skip
        typed = torch.randint(vocab_size, (count, n), generator=g)  # (count, n)
        with torch.no_grad():
            last = model(torch.cat([typed, typed], dim=1))[:, -1]  # (count, V)
        shares[n] = float((last.argmax(-1) == typed[:, 0]).float().mean())
    return shares


@dataclass
class Published:
    """One explorer's weights file, waiting for the site's build to write and check it."""

    path: str
    """Where the file goes, from the site's root."""
    data: bytes
    meta: dict[str, Any]
    """`export_model`'s meta: what the browser needs besides the weights."""
    model: GPTModel
    cases: list[tuple[Tensor, Settings]]


_PUBLISHED: list[Published] = []


def _options(model: GPTModel, view: object, repeat: object, max_tokens: object) -> int:
    """Check `explorer_html`'s `view`, `repeat` and `max_tokens`; return the longest sequence."""
    limit = check_size("max_tokens", model.context_length if max_tokens is None else max_tokens)
    if limit > model.context_length:
        raise ValueError(f"max_tokens must be at most the context, {model.context_length}, "
                         f"got {limit}")  # fmt: skip
    layers, heads = len(model.blocks), model.blocks[0].att.num_heads
    if (not isinstance(view, tuple) or len(view) != 2
            or not all(type(v) is int for v in view)
            or not (0 <= view[0] < layers and 0 <= view[1] < heads)):  # fmt: skip
        raise ValueError(f"view must be a (layer, head) pair of the model's, layer < {layers} "
                         f"and head < {heads}, got {view!r}")  # fmt: skip
    if repeat is not None and (
        not isinstance(repeat, tuple) or len(repeat) != 2
        or not all(type(v) is int for v in repeat)
        or not 1 <= repeat[0] <= repeat[1] or 2 * repeat[1] > limit
    ):  # fmt: skip
        raise ValueError(f"repeat must be (shortest, longest) with 1 <= shortest <= longest "
                         f"and twice longest <= {limit} tokens, got {repeat!r}")  # fmt: skip
    return limit


def published() -> list[Published]:
    """The files `explorer_html` asked the build to write (the build hook empties the list)."""
    return _PUBLISHED


def explorer_html(
    model: GPTModel,
    vocab: Sequence[str],
    presets: Mapping[str, Tensor],
    *,
    name: str = "model",
    label: str = "Attention explorer",
    view: tuple[int, int] = (0, 0),
    repeat: tuple[int, int] | None = None,
    max_tokens: int | None = None,
) -> str:
    """The explorer's element for a page; the model's weights go to a file beside the page.

    Args:
        model: the trained `GPTModel`, in eval mode.
        vocab: the text of each token id.
        presets: named `(1, num_tokens)` sequences the reader can start from (the first is
            shown first); the build also checks the browser on them.
        name: the weights file's name, before its hash: `explorer/{name}-{hash}.bin`.
        label: the explorer's accessible name.
        view: the `(layer, head)` shown first.
        repeat: `(shortest, longest)`: the explorer offers to repeat what the reader typed,
            for a sequence of `shortest` to `longest` tokens only (the periods the model
            learned to repeat); None, no such button.
        max_tokens: the longest sequence the explorer takes (the length the model was
            trained on, say); default the model's context.

    Returns:
        A `<div class="attention-explorer" data-attention-explorer>` holding the JSON of
        `export_model`'s meta (the weights file's path in `model`), the presets and the
        options above, and the text shown where the script does not run.

    Raises:
        ValueError: no presets, a preset not `(1, num_tokens)` ids that fit `max_tokens`, a
            model in training mode, a `view` the model does not have, or a `repeat` range
            whose repeat does not fit `max_tokens`.
    """
    if not presets:
        raise ValueError("presets must hold at least one named sequence, got none")
    if not isinstance(model, GPTModel) or model.training:
        raise ValueError("model must be a GPTModel in eval mode (model.eval())")
    limit = _options(model, view, repeat, max_tokens)
    for key, idx in presets.items():
        check_ids(idx, f"presets[{key!r}]", model.vocab_size)
        if idx.ndim != 2 or idx.shape[0] != 1 or not 1 <= idx.shape[1] <= limit:
            raise ValueError(f"presets[{key!r}] must be (1, num_tokens) with num_tokens <= "
                             f"{limit}, got {tuple(idx.shape)}")  # fmt: skip
    meta, blob = export_model(model, vocab)
    path = f"explorer/{name}-{hashlib.sha256(blob).hexdigest()[:12]}.bin"
    _PUBLISHED.append(Published(path, blob, meta, model, check_cases(model, presets)))
    data = {
        **meta, "model": path, "masks": list(MASKS), "defaults": asdict(Settings()),
        "presets": [{"name": k, "ids": v[0].tolist()} for k, v in presets.items()],
        "view": {"layer": view[0], "head": view[1]}, "max_tokens": limit,
        "repeat": None if repeat is None else list(repeat),
    }  # fmt: skip
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        payload = payload.replace(char, escaped)
    return (
        f'<div class="attention-explorer" data-attention-explorer role="group" '
        f'aria-label="{html.escape(label)}">'
        f'<script type="application/json" class="attention-explorer__data">{payload}</script>'
        f'<p class="attention-explorer__fallback">{html.escape(_FALLBACK)}</p></div>'
    )
