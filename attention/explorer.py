r"""The attention explorer: a GPT's scores, computed at build time, softmaxed in the browser.

[`explorer_data`][attention.explorer.explorer_data] runs a
[`GPTModel`][attention.gpt.GPTModel] on a few named sentences and keeps, for every layer and
head, the scaled scores $S = QK^\top/\sqrt{d_h}$ *before* the mask and the softmax
([`model_scores`][attention.heads.model_scores]), rounded to `decimals` places.
[`explorer_html`][attention.explorer.explorer_html] embeds them in a page as JSON, and the
site's `docs/javascripts/explorer.js` draws them. The browser computes one step only,

$$
\alpha = \operatorname{softmax}\!\left(\frac{S}{\tau} + M\right),
$$

at the temperature $\tau$ the reader picks, with the causal mask $M$ ($-\infty$ above the
diagonal, and beyond the window if the model has one) or without it.
[`explorer_weights`][attention.explorer.explorer_weights] is that step in Python: at
$\tau = 1$ with the mask it gives back
[`model_weights`][attention.heads.model_weights], to the rounding.

Examples:
    >>> from attention.heads import model_weights
    >>> _ = torch.manual_seed(0)
    >>> cfg = {"vocab_size": 10, "context_length": 8, "emb_dim": 16, "n_heads": 2,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
    >>> model = GPTModel(cfg).eval()
    >>> idx = torch.tensor([[1, 2, 3, 1, 2, 3]])  # (1, T)
    >>> data = explorer_data(model, {"one two three, twice": idx}, lambda ids: ids.tolist())
    >>> data["n_layers"], data["n_heads"], data["causal"], data["sentences"][0]["tokens"]
    (2, 2, True, ['1', '2', '3', '1', '2', '3'])
    >>> browser = explorer_weights(data, "one two three, twice")  # (n_layers, n_heads, T, T)
    >>> exact = model_weights(model, idx)[:, 0]  # (n_layers, n_heads, T, T)
    >>> bool((browser - exact).abs().max() < 1e-3)  # equal to the rounding of the scores
    True
    >>> explorer_html(data).startswith('<div class="attention-explorer" data-attention-explorer')
    True
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from attention.checks import check_flag, check_ids, check_size
from attention.gpt import GPTModel
from attention.heads import model_scores
from attention.multihead import MultiHeadAttention

__all__ = ["MAX_TOKENS", "explorer_data", "explorer_html", "explorer_weights"]

MAX_TOKENS = 48
"""The longest sentence the explorer takes: its heatmap draws one cell per query and key."""

_FALLBACK = (
    "The attention explorer needs JavaScript, which is turned off or did not load: "
    "its controls and heatmap are drawn in the browser."
)

Labels = Callable[[Tensor], Sequence[Any]] | Mapping[str, Sequence[Any]]


def explorer_data(
    model: GPTModel,
    sentences: Mapping[str, Tensor],
    labels: Labels,
    *,
    decimals: int = 3,
) -> dict[str, Any]:
    """The scores of every layer and head of `model` on each sentence, as JSON-ready data.

    Args:
        model: a `GPTModel`; its causal mask (and window) is what the explorer's mask
            checkbox applies.
        sentences: named token ids, each `(1, num_tokens)` with `2 <= num_tokens <=`
            [`MAX_TOKENS`][attention.explorer.MAX_TOKENS] and at most the model's
            `context_length`; shown in this order.
        labels: each token's text: a function from a sentence's 1-d ids to one label per
            token (e.g. `InductionRun.labels`), or a mapping from each name to its labels.
            Labels are converted with `str`.
        decimals: the scores are rounded to this many decimal places (1 to 6); with the
            default 3, each is within 0.0005 of the model's, and each weight at temperature 1
            within about 0.001 of the exact one.

    Returns:
        A dict of plain lists, numbers and strings (`json.dumps` takes it as it is):
        `n_layers`, `n_heads`, `causal` (whether the model masks the future: every
        `GPTModel` does), `window` (its sliding window, or None), `decimals`, and
        `sentences`, a list of `{"name", "tokens", "scores"}` with `tokens` the
        `num_tokens` labels and `scores` nested lists `(n_layers, n_heads, num_tokens,
        num_tokens)`: entry `[l][h][i][j]` is query `i`'s scaled score for key `j`, unmasked.

    Raises:
        TypeError: `model` is not a `GPTModel`, `sentences` not a mapping of str to tensors,
            `labels` neither callable nor a mapping, a label list not a sequence, or
            `decimals` not an int.
        ValueError: no sentences, an empty name, ids not `(1, num_tokens)` of the model's
            vocabulary, too few or too many tokens, a label count that is not `num_tokens`, a
            name missing from `labels`, or `decimals` outside 1 to 6.
    """
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a GPTModel, got {type(model).__name__}")
    if not isinstance(sentences, Mapping):
        raise TypeError(
            f"sentences must be a mapping of names to token ids, got {type(sentences).__name__}"
        )
    if not sentences:
        raise ValueError("sentences must hold at least one named sentence, got none")
    if not (callable(labels) or isinstance(labels, Mapping)):
        raise TypeError(
            "labels must be a function of the ids or a mapping of names to labels, "
            f"got {type(labels).__name__}"
        )
    check_size("decimals", decimals)
    if decimals > 6:
        raise ValueError(f"decimals must be in 1 .. 6, got {decimals}")
    atts = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]  # one per layer
    causal, window = bool(atts[0].causal), atts[0].window
    if any(att.rule != atts[0].rule for att in atts):
        raise ValueError("every layer of model must have the same causal mask and window")
    out: list[dict[str, Any]] = []
    for name, idx in sentences.items():
        tokens = _labels(name, _ids(model, name, idx), labels)
        scores = model_scores(model, idx)[:, 0]  # (n_layers, n_heads, T, T)
        rounded = torch.round(scores.double(), decimals=decimals) + 0.0  # + 0.0: no -0.0
        hidden = atts[0].mask(len(tokens))  # (T, T), the layers' one rule: True = hidden
        rows = ["".join("1" if h else "0" for h in row) for row in hidden.tolist()]
        out.append({"name": name, "tokens": tokens, "scores": rounded.tolist(), "hidden": rows})
    return {
        "n_layers": len(atts),
        "n_heads": atts[0].num_heads,
        "causal": causal,
        "window": window,
        "decimals": decimals,
        "sentences": out,
    }


def _ids(model: GPTModel, name: object, idx: object) -> Tensor:
    """Check one sentence's name and ids: `(1, T)` ids of `model`'s vocabulary, 2 <= T <= cap."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"each sentence name must be a non-empty str, got {name!r}")
    if not isinstance(idx, Tensor):
        raise TypeError(f"sentences[{name!r}] must be a torch.Tensor, got {type(idx).__name__}")
    check_ids(idx, f"sentences[{name!r}]", model.vocab_size, device=model.tok_emb.weight.device)
    if idx.ndim != 2 or idx.shape[0] != 1:
        raise ValueError(
            f"sentences[{name!r}] must be ids of shape (1, num_tokens), got {tuple(idx.shape)}"
        )
    limit = min(MAX_TOKENS, model.context_length)
    if not 2 <= idx.shape[1] <= limit:
        raise ValueError(
            f"sentences[{name!r}] must have 2 to {limit} tokens (the explorer draws a "
            f"(num_tokens, num_tokens) heatmap; MAX_TOKENS={MAX_TOKENS}, the model's "
            f"context_length={model.context_length}), got {idx.shape[1]}"
        )
    return idx


def _labels(name: str, idx: Tensor, labels: Labels) -> list[str]:
    """The labels of one sentence, as strings, one per token."""
    if isinstance(labels, Mapping):
        if name not in labels:
            raise ValueError(f"labels has no entry for sentence {name!r}")
        found = labels[name]
    else:
        found = labels(idx[0])
    if isinstance(found, str | bytes) or not isinstance(found, Sequence):
        raise TypeError(
            f"the labels of {name!r} must be a sequence of token strings, got {found!r:.40}"
        )
    if len(found) != idx.shape[1]:
        raise ValueError(
            f"the labels of {name!r} must be one per token ({idx.shape[1]}), got {len(found)}"
        )
    return [str(label) for label in found]


def explorer_weights(
    data: Mapping[str, Any],
    sentence: int | str = 0,
    *,
    temperature: float = 1.0,
    causal: bool | None = None,
) -> Tensor:
    r"""What the browser computes from `data`: $\operatorname{softmax}(S/\tau + M)$, in Python.

    Args:
        data: from [`explorer_data`][attention.explorer.explorer_data].
        sentence: the sentence's position or name.
        temperature: $\tau > 0$; below 1 sharpens each row, above 1 flattens it.
        causal: apply the model's mask; default `data["causal"]`, as the page starts.

    Returns:
        `(n_layers, n_heads, num_tokens, num_tokens)` float64 weights; each row sums to 1.

    Raises:
        TypeError: `temperature` is not a real number, `causal` not a bool.
        ValueError: `temperature` not positive and finite, or no such sentence.
    """
    _check_data(data)
    names = [s["name"] for s in data["sentences"]]
    if isinstance(sentence, str) and sentence in names:
        sentence = names.index(sentence)
    if isinstance(sentence, bool) or not isinstance(sentence, int):
        raise ValueError(f"sentence must be a position or one of {names}, got {sentence!r}")
    if not 0 <= sentence < len(names):
        raise ValueError(f"sentence must be in 0 .. {len(names) - 1}, got {sentence}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise TypeError(f"temperature must be a real number, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be > 0 and finite, got {temperature}")
    causal = data["causal"] if causal is None else check_flag("causal", causal)
    scores = torch.tensor(data["sentences"][sentence]["scores"], dtype=torch.float64)
    scores = scores / temperature  # (L, H, T, T)
    if causal:  # the model's own mask, as the page holds it: "1" = hidden
        rows = data["sentences"][sentence]["hidden"]
        mask = torch.tensor([[c == "1" for c in row] for row in rows])  # (T, T)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def _check_data(data: object) -> None:
    """`data` has the keys and the shape `explorer_data` gives it."""
    keys = ("n_layers", "n_heads", "causal", "window", "decimals", "sentences")
    if not isinstance(data, Mapping) or any(key not in data for key in keys):
        got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise ValueError(f"data must be explorer_data's dict with keys {keys}, got {got}")
    sentences = data["sentences"]
    if not isinstance(sentences, list) or not sentences:
        raise ValueError("data['sentences'] must be a non-empty list")
    for s in sentences:
        n = len(s.get("tokens", ())) if isinstance(s, Mapping) else -1
        scores = s.get("scores") if isinstance(s, Mapping) else None
        if not (
            isinstance(scores, list)
            and len(scores) == data["n_layers"]
            and all(len(layer) == data["n_heads"] for layer in scores)
            and all(len(rows) == n and all(len(r) == n for r in rows) for l in scores for rows in l)
        ):
            raise ValueError(
                "each of data['sentences'] must have 'tokens' (T labels) and 'scores' "
                f"(n_layers={data['n_layers']}, n_heads={data['n_heads']}, T, T)"
            )


def explorer_html(
    data: Mapping[str, Any],
    *,
    label: str = "Attention explorer",
    fallback: str = _FALLBACK,
) -> str:
    """The explorer's element: `data` as embedded JSON, drawn by `docs/javascripts/explorer.js`.

    The script replaces the fallback message with the controls, the heatmap and the token
    strip; the page fetches nothing.

    Args:
        data: from [`explorer_data`][attention.explorer.explorer_data].
        label: the explorer's accessible name (`aria-label`).
        fallback: the text shown where the script does not run.

    Returns:
        One `<div class="attention-explorer" data-attention-explorer>` holding a
        `<script type="application/json">` (with `<`, `>` and `&` escaped, so no label can
        close it) and the fallback paragraph.

    Raises:
        ValueError: `data` is not shaped as `explorer_data` returns it.
    """
    _check_data(data)
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        payload = payload.replace(char, escaped)
    return (
        f'<div class="attention-explorer" data-attention-explorer role="group" '
        f'aria-label="{html.escape(label)}">'
        f'<script type="application/json" class="attention-explorer__data">{payload}</script>'
        f'<p class="attention-explorer__fallback">{html.escape(fallback)}</p></div>'
    )
