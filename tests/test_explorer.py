"""The attention explorer's data: the scores a page embeds, and the one step the browser runs.

The browser computes softmax(scores / temperature + mask) from the rounded scores; done here in
Python, that must give back the model's own attention weights, to the rounding.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from attention.explorer import MAX_TOKENS, explorer_data, explorer_html, explorer_weights
from attention.gpt import GPTModel
from attention.heads import model_scores, model_weights

CFG = {"vocab_size": 12, "context_length": 64, "emb_dim": 16, "n_heads": 2, "n_layers": 3,
       "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip


def names(ids: torch.Tensor) -> list[str]:
    return [f"t{i}" for i in ids.tolist()]


@pytest.fixture(params=[{}, {"window": 3}, {"rope_base": 10_000.0, "n_kv_heads": 1}])
def model(request: pytest.FixtureRequest) -> GPTModel:
    torch.manual_seed(1)
    return GPTModel({**CFG, **request.param}).eval()


@pytest.fixture
def sentences() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "short": torch.randint(12, (1, 5), generator=g),
        "long": torch.randint(12, (1, 20), generator=g),
    }


def masked_softmax(scores: torch.Tensor, window: int | None, temperature: float) -> torch.Tensor:
    """softmax(S / tau) with -inf where key j is after query i or window or more before it."""
    T = scores.shape[-1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = (j > i) | ((i - j >= window) if window is not None else torch.zeros(T, T).bool())
    return torch.softmax((scores / temperature).masked_fill(hidden, float("-inf")), dim=-1)


def test_the_data_has_every_layer_head_and_token(
    model: GPTModel, sentences: dict[str, torch.Tensor]
) -> None:
    data = explorer_data(model, sentences, names)
    assert (data["n_layers"], data["n_heads"], data["causal"]) == (3, 2, True)
    assert data["window"] == model.trf_blocks[0].att.window
    assert [s["name"] for s in data["sentences"]] == ["short", "long"]  # in the given order
    for entry, idx in zip(data["sentences"], sentences.values(), strict=True):
        T = idx.shape[1]
        assert entry["tokens"] == names(idx[0])  # one label per token
        assert torch.tensor(entry["scores"]).shape == (3, 2, T, T)


def test_the_scores_are_the_models_rounded(
    model: GPTModel, sentences: dict[str, torch.Tensor]
) -> None:
    for decimals in (2, 4):
        data = explorer_data(model, sentences, names, decimals=decimals)
        exact = model_scores(model, sentences["long"])[:, 0]  # (L, H, T, T)
        kept = torch.tensor(data["sentences"][1]["scores"], dtype=torch.float64)
        error = (kept - exact.double()).abs().max()
        assert 0 < error <= 0.5 * 10**-decimals + 1e-7  # rounded, and to that precision
        text = json.dumps(data["sentences"][1]["scores"])
        assert max(len(n.split(".")[1]) for n in re.findall(r"-?\d+\.\d+", text)) <= decimals


def test_the_browsers_softmax_gives_back_the_models_weights(
    model: GPTModel, sentences: dict[str, torch.Tensor]
) -> None:
    data = explorer_data(model, sentences, names)  # 3 decimals
    window = data["window"]
    for k, idx in enumerate(sentences.values()):
        exact = model_weights(model, idx)[:, 0]  # (L, H, T, T)
        scores = torch.tensor(data["sentences"][k]["scores"], dtype=torch.float64)
        in_python = masked_softmax(scores, window, temperature=1.0)
        assert_close(in_python, exact.double(), atol=1.5e-3, rtol=0)
        assert_close(explorer_weights(data, k), in_python, atol=1e-12, rtol=0)
        assert float(exact.double().sub(in_python).abs().max()) > 0  # the rounding shows


def test_temperature_and_the_mask_switch(
    model: GPTModel, sentences: dict[str, torch.Tensor]
) -> None:
    data = explorer_data(model, sentences, names)
    scores = torch.tensor(data["sentences"][0]["scores"], dtype=torch.float64)
    hot = explorer_weights(data, "short", temperature=4.0)
    assert_close(hot, masked_softmax(scores, data["window"], 4.0))
    unmasked = explorer_weights(data, "short", causal=False)
    assert_close(unmasked, torch.softmax(scores, dim=-1))
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)  # (T, T): key after query
    assert float(unmasked[..., future].min()) > 0  # the future gets weight without the mask
    assert float(explorer_weights(data, "short")[..., future].max()) == 0.0
    # a lower temperature sharpens every row: its largest weight grows
    cold = explorer_weights(data, "short", temperature=0.25, causal=False)
    assert bool((cold.amax(-1) >= unmasked.amax(-1) - 1e-12).all())
    assert_close(cold.sum(-1), torch.ones(cold.shape[:-1], dtype=torch.float64))


def test_labels_from_a_mapping_are_strings(model: GPTModel) -> None:
    idx = torch.tensor([[1, 2, 3]])
    data = explorer_data(model, {"abc": idx}, {"abc": ["a", 2, None]})
    assert data["sentences"][0]["tokens"] == ["a", "2", "None"]


def test_the_json_round_trips_and_the_html_embeds_it(model: GPTModel) -> None:
    idx = torch.tensor([[1, 2, 3, 4]])
    tricky = ["</script><b>", "&amp;", '"q"', "\n"]  # a token could be any text
    data = explorer_data(model, {"x < y": idx}, {"x < y": tricky})
    assert json.loads(json.dumps(data)) == data
    page = explorer_html(data, label="Heads & scores")
    assert page.startswith('<div class="attention-explorer" data-attention-explorer ')
    assert 'aria-label="Heads &amp; scores"' in page
    assert page.count("</script>") == 1  # no label closes the data early
    embedded = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', page, re.S)
    assert embedded is not None
    assert json.loads(embedded.group(1)) == data
    assert 'class="attention-explorer__fallback"' in page
    assert page.endswith("</p></div>")


def test_the_embedded_scores_are_compact(model: GPTModel) -> None:
    # The page ships every score of every layer, head and sentence: at 3 decimals, with no
    # whitespace, each costs a few bytes (sign, digits, comma), so a page with a full-size
    # explorer stays small. The heads page: 4 sentences of up to 32 tokens, 2 x 4 heads.
    g = torch.Generator().manual_seed(0)
    sentences = {f"s{k}": torch.randint(12, (1, MAX_TOKENS), generator=g) for k in range(2)}
    data = explorer_data(model, sentences, names)
    payload = explorer_html(data)
    count = sum(len(s["scores"]) * data["n_heads"] * len(s["tokens"]) ** 2
                for s in data["sentences"])  # fmt: skip
    assert " " not in payload.split('class="attention-explorer__data">')[1].split("</script>")[0]
    assert len(payload) < 8 * count  # under 8 bytes a score, the mask and labels included


def test_max_tokens_is_the_cap(model: GPTModel) -> None:
    idx = torch.zeros(1, MAX_TOKENS, dtype=torch.long)
    data = explorer_data(model, {"cap": idx}, names)
    assert len(data["sentences"][0]["tokens"]) == MAX_TOKENS
    with pytest.raises(ValueError, match=r"must have 2 to 48 tokens .* got 49"):
        explorer_data(model, {"long": torch.zeros(1, MAX_TOKENS + 1, dtype=torch.long)}, names)


BAD_CALLS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"model": torch.nn.Linear(2, 2)}, TypeError, "model must be a GPTModel, got Linear"),
    ({"sentences": [torch.tensor([[1, 2]])]}, TypeError, "sentences must be a mapping"),
    ({"sentences": {}}, ValueError, "at least one named sentence"),
    ({"sentences": {"": torch.tensor([[1, 2]])}}, ValueError, "non-empty str, got ''"),
    ({"sentences": {"a": [[1, 2]]}}, TypeError, r"sentences\['a'\] must be a torch.Tensor"),
    ({"sentences": {"a": torch.tensor([1, 2, 3])}}, ValueError, r"\(1, num_tokens\), got \(3,\)"),
    ({"sentences": {"a": torch.ones(2, 3).long()}}, ValueError, r"got \(2, 3\)"),
    ({"sentences": {"a": torch.tensor([[1]])}}, ValueError, "2 to 48 tokens .* got 1"),
    ({"sentences": {"a": torch.tensor([[1, 12]])}}, ValueError, r"must be in 0 \.\. 11"),
    ({"sentences": {"a": torch.tensor([[1.0, 2.0]])}}, TypeError, "integer ids"),
    ({"labels": ["a", "b"]}, TypeError, "labels must be a function of the ids or a mapping"),
    ({"labels": {"other": ["a", "b"]}}, ValueError, "labels has no entry for sentence 'a'"),
    ({"labels": lambda ids: "ab"}, TypeError, "must be a sequence of token strings"),
    ({"labels": lambda ids: ["a"]}, ValueError, r"one per token \(2\), got 1"),
    ({"decimals": 0}, ValueError, "decimals must be >= 1, got 0"),
    ({"decimals": 7}, ValueError, r"decimals must be in 1 \.\. 6, got 7"),
    ({"decimals": 2.0}, TypeError, "decimals must be an int"),
]


@pytest.mark.parametrize(("change", "error", "message"), BAD_CALLS)
def test_bad_arguments_are_named(
    model: GPTModel, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    args: dict[str, Any] = {"model": model, "sentences": {"a": torch.tensor([[1, 2]])},
                            "labels": names, **change}  # fmt: skip
    with pytest.raises(error, match=message):
        explorer_data(**args)


def test_a_sentence_longer_than_the_context_is_refused() -> None:
    model = GPTModel({**CFG, "context_length": 8})
    with pytest.raises(ValueError, match="context_length=8"):
        explorer_data(model, {"a": torch.zeros(1, 9, dtype=torch.long)}, names)


def test_bad_data_and_options_are_named(model: GPTModel) -> None:
    data = explorer_data(model, {"a": torch.tensor([[1, 2, 3]])}, names)
    with pytest.raises(ValueError, match="data must be explorer_data's dict"):
        explorer_html({"sentences": []})
    broken = {**data, "sentences": [{**data["sentences"][0], "tokens": ["t1"]}]}
    with pytest.raises(ValueError, match=r"'scores' \(n_layers=3, n_heads=2, T, T\)"):
        explorer_html(broken)
    with pytest.raises(ValueError, match=r"sentence must be a position or one of \['a'\]"):
        explorer_weights(data, "b")
    with pytest.raises(ValueError, match=r"sentence must be in 0 \.\. 0, got 1"):
        explorer_weights(data, 1)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be > 0 and finite"):
            explorer_weights(data, temperature=bad)
    with pytest.raises(TypeError, match="temperature must be a real number"):
        explorer_weights(data, temperature="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="causal must be True or False"):
        explorer_weights(data, causal="False")  # type: ignore[arg-type]
