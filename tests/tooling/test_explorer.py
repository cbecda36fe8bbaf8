"""The attention explorer: the model a page ships to the browser, and PyTorch's answer for it.

The browser's forward itself (docs/javascripts/model.js) is checked against `reference` by the
site's build, in headless Chromium (docs/hooks/explorer.py); here, `reference` is checked
against the package's own modules, setting by setting, and the exported weights against the
model's.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from attention.lab.heads import ablate_head, model_weights
from attention.layer.masks import causal
from attention.model.gpt import GPTModel
from attention_site.explorer import (
    MASKS,
    Settings,
    check_cases,
    explorer_html,
    export_model,
    published,
    reference,
    repeat_accuracy,
    showcase,
)

CFG = {"vocab_size": 12, "context_length": 16, "emb_dim": 16, "n_heads": 4, "n_layers": 2,
       "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
VOCAB = [f"t{i}" for i in range(12)]


@pytest.fixture(
    params=[{}, {"rope_base": 10_000.0, "n_kv_heads": 2}, {"qkv_bias": True, "rope_base": 500.0}]
)
def cfg(request: pytest.FixtureRequest) -> dict[str, object]:
    return {**CFG, **request.param}


@pytest.fixture
def model(cfg: dict[str, object]) -> GPTModel:
    torch.manual_seed(1)
    return GPTModel(cfg).eval()


IDX = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1]])


def test_the_exported_floats_are_the_state_dict(model: GPTModel) -> None:
    meta, blob = export_model(model, VOCAB)
    floats = np.frombuffer(blob, dtype="<f4")
    assert len(floats) == meta["floats"] == sum(p.numel() for p in model.state_dict().values())
    for name, tensor in model.state_dict().items():
        offset, shape = meta["tensors"][name]
        got = torch.from_numpy(floats[offset : offset + tensor.numel()].copy()).view(shape)
        assert torch.equal(got, tensor)  # float32 to float32: exact
    assert (meta["n_kv_heads"], meta["vocab"]) == (model.trf_blocks[0].att.num_kv_heads, VOCAB)
    json.dumps(meta, allow_nan=False)  # JSON as it is


def test_the_default_settings_give_the_models_own_answer(model: GPTModel) -> None:
    logits, weights = reference(model, IDX)
    with torch.no_grad():
        assert_close(logits, model(IDX)[0])
    assert_close(weights, model_weights(model, IDX)[:, 0])


def test_a_window_and_sinks_are_the_models_with_that_window(
    model: GPTModel, cfg: dict[str, object]
) -> None:
    settings = Settings(mask="sinks", window=3, sinks=1)
    windowed = GPTModel({**cfg, "window": 3, "sinks": 1}).eval()
    windowed.load_state_dict(model.state_dict())
    logits, weights = reference(model, IDX, settings)
    with torch.no_grad():
        assert_close(logits, windowed(IDX)[0])
    assert_close(weights, model_weights(windowed, IDX)[:, 0])
    assert bool((weights[..., 6, 1:4] == 0).all()) and bool((weights[..., 6, 0] > 0).all())


def test_two_documents_are_two_sequences(model: GPTModel) -> None:
    logits, weights = reference(model, IDX, Settings(mask="documents", split=5))
    with torch.no_grad():
        first, second = model(IDX[:, :5])[0], model(IDX[:, 5:])[0]
    if model.pos_emb is None:  # RoPE: relative, so the second document is itself anywhere
        assert_close(logits, torch.cat([first, second]), atol=2e-5, rtol=1e-4)
    else:
        assert_close(logits[:5], first)
    assert bool((weights[..., 5:, :5] == 0).all())  # no weight across the split


def test_temperature_divides_the_scores_and_ablation_is_ablate_head(model: GPTModel) -> None:
    _, plain = reference(model, IDX)
    _, cold = reference(model, IDX, Settings(temperature=0.5))
    first = model.trf_blocks[0]
    assert_close(cold[0], torch.softmax(2 * torch.log(plain[0]), dim=-1), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(cold[1], plain[1])  # layer 1 reads what layer 0 wrote
    logits, _ = reference(model, IDX, Settings(ablate=((0, 1), (1, 3))))
    with ablate_head(model, 0, 1), ablate_head(model, 1, 3), torch.no_grad():
        assert_close(logits, model(IDX)[0])
    assert first.att.rule == causal()  # restored
    again, _ = reference(model, IDX)
    with torch.no_grad():
        assert_close(again, model(IDX)[0], atol=0, rtol=0)  # weights restored exactly


def test_the_check_cases_cover_every_mask_and_the_context() -> None:
    torch.manual_seed(0)
    model = GPTModel({**CFG, "rope_base": 10_000.0}).eval()
    cases = check_cases(model, {"a": IDX}, num_random=40, seed=3)
    assert {s.mask for _, s in cases} == set(MASKS)
    assert max(idx.shape[1] for idx, _ in cases) == CFG["context_length"]
    assert any(s.ablate for _, s in cases) and any(s.temperature != 1 for _, s in cases)
    for idx, settings in cases:  # every case is one the reference takes
        assert reference(model, idx, settings)[0].shape == (idx.shape[1], CFG["vocab_size"])


def test_the_html_embeds_the_meta_and_publishes_the_weights(model: GPTModel) -> None:
    published().clear()
    out = explorer_html(model, VOCAB, {"pi": IDX, "<b>&": IDX[:, :4]}, name="m", label="L")
    data = json.loads(re.search(r'<script type="application/json"[^>]*>(.*?)</script>', out)[1])
    assert data["model"].startswith("explorer/m-") and data["model"].endswith(".bin")
    assert [p["name"] for p in data["presets"]] == ["pi", "<b>&"]
    assert "<b>" not in out.split("</script>")[0].split(">", 2)[2]  # escaped inside the script
    (entry,) = published()
    assert entry.path == data["model"] and entry.data == export_model(model, VOCAB)[1]
    published().clear()


def test_the_html_says_what_the_model_can_do(model: GPTModel) -> None:
    published().clear()

    def data_of(out: str) -> dict[str, object]:
        found = re.search(r'<script type="application/json"[^>]*>(.*?)</script>', out)
        assert found is not None
        return json.loads(found[1])  # type: ignore[no-any-return]

    plain = data_of(explorer_html(model, VOCAB, {"pi": IDX}))
    assert (plain["view"], plain["repeat"], plain["max_tokens"]) == (
        {"layer": 0, "head": 0}, None, CFG["context_length"])  # fmt: skip
    chosen = data_of(explorer_html(model, VOCAB, {"pi": IDX}, view=(1, 3), repeat=(2, 5),
                                   max_tokens=12))  # fmt: skip
    assert (chosen["view"], chosen["repeat"], chosen["max_tokens"]) == (
        {"layer": 1, "head": 3}, [2, 5], 12)  # fmt: skip
    published().clear()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"view": (2, 0)}, r"view must be a \(layer, head\) pair of the model's, layer < 2"),
        ({"view": (0, 4)}, "view must be"),
        ({"view": [0, 1]}, "view must be"),
        ({"repeat": (3, 9)}, r"twice longest <= 16 tokens"),
        ({"repeat": (5, 4)}, "repeat must be"),
        ({"repeat": (0, 4)}, "repeat must be"),
        ({"max_tokens": 17}, "max_tokens must be at most the context, 16"),
        ({"max_tokens": 0}, "max_tokens must be"),
        ({"max_tokens": 8}, r"presets\['pi'\] must be \(1, num_tokens\) with num_tokens <= 8"),
        ({"max_tokens": 10, "repeat": (2, 6)}, r"twice longest <= 10"),
    ],
)
def test_bad_options_are_named(model: GPTModel, options: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        explorer_html(model, VOCAB, {"pi": IDX}, **options)  # type: ignore[arg-type]
    assert not published()  # nothing published for a refused explorer


def _copying(model: GPTModel, monkeypatch: pytest.MonkeyPatch, key: int = 3) -> None:
    """Make `model` predict, after any sequence, its token at `key`, with the last query's
    weights all on `key` in every head (a model that copies, made by hand)."""
    import attention_site.explorer as explorer

    def forward(idx: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return 10.0 * torch.nn.functional.one_hot(idx[:, key], 12).float()[:, None].expand(
            -1, idx.shape[1], -1)  # fmt: skip

    def weights(model: GPTModel, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        w = torch.eye(T).expand(2, idx.shape[0], 4, T, T).clone()
        w[..., -1, :] = 0.0
        w[..., -1, key] = 1.0
        return w

    monkeypatch.setattr(model, "forward", forward)
    monkeypatch.setattr(explorer, "model_weights", weights)


def test_showcase_opens_on_the_first_sequence_whose_copy_is_found(
    model: GPTModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    _copying(model, monkeypatch, key=3)  # the last query reads key 3 and predicts its token
    found = torch.tensor([[5, 6, 7, 5, 6, 7]])  # token 7: after its copy (2) came key 3
    no_copy = torch.tensor([[5, 6, 7, 1, 2, 3]])  # 3 never occurred before
    elsewhere = torch.tensor([[7, 5, 6, 1, 2, 7]])  # 7's copy is followed by key 1, not 3
    candidates = {"no copy": no_copy, "elsewhere": elsewhere, "found": found, "again": found}
    assert showcase(model, candidates, layer=1, head=2) == "found"
    with pytest.raises(ValueError, match="on none of the 2 candidates"):
        showcase(model, {"no copy": no_copy, "elsewhere": elsewhere}, layer=0, head=0)
    with pytest.raises(ValueError, match="layer 2, head 0 is not a head of the model"):
        showcase(model, candidates, layer=2, head=0)


def test_repeat_accuracy_counts_the_first_token_predicted_again(
    model: GPTModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    _copying(model, monkeypatch, key=0)  # always predicts the sequence's first token
    assert repeat_accuracy(model, [2, 5, 8], vocab_size=12, count=7) == {2: 1.0, 5: 1.0, 8: 1.0}
    monkeypatch.undo()
    shares = repeat_accuracy(model, [1, 3], vocab_size=12, count=50, seed=1)
    assert list(shares) == [1, 3] and all(0.0 <= v <= 1.0 for v in shares.values())
    assert shares == repeat_accuracy(model, [1, 3], vocab_size=12, count=50, seed=1)
    with pytest.raises(ValueError, match="9 typed twice is longer than the context, 16"):
        repeat_accuracy(model, [9], vocab_size=12)
    with pytest.raises(ValueError, match="count must be"):
        repeat_accuracy(model, [2], vocab_size=12, count=0)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Settings(mask="diagonal"), ValueError, "mask must be one of"),
        (lambda: Settings(window=0), ValueError, "window must be"),
        (lambda: Settings(temperature=0.0), ValueError, "temperature must be a finite number > 0"),
        (lambda: Settings(temperature=float("nan")), ValueError, "temperature must be"),
        (lambda: Settings(split=-1), ValueError, "split must be"),
        (lambda: Settings(ablate=(0, 1)), ValueError, r"ablate must be distinct \(layer, head\)"),
        (lambda: Settings(ablate=((0, 1), (0, 1))), ValueError, "ablate must be distinct"),
        (lambda: Settings(ablate=((0.0, 1),)), ValueError, "ablate must be distinct"),
        (lambda: Settings(ablate=((True, 0),)), ValueError, "ablate must be distinct"),
        (lambda: Settings(ablate=((-1, 0),)), ValueError, "ablate must be distinct"),
        (lambda: Settings(ablate="ab"), ValueError, "ablate must be distinct"),
    ],
)
def test_bad_settings_are_named(make: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()  # type: ignore[operator]


def test_bad_models_vocabularies_and_presets_are_named(model: GPTModel) -> None:
    with pytest.raises(TypeError, match="model must be a GPTModel"):
        export_model(torch.nn.Linear(2, 2), VOCAB)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"vocab must hold vocab_size=12 strings, got 3"):
        export_model(model, VOCAB[:3])
    with pytest.raises(ValueError, match="presets must hold at least one"):
        explorer_html(model, VOCAB, {})
    with pytest.raises(ValueError, match=r"presets\['long'\] must be \(1, num_tokens\)"):
        explorer_html(model, VOCAB, {"long": torch.zeros(1, 17, dtype=torch.long)})
    with pytest.raises(ValueError, match="idx must be"):
        reference(model, IDX[0])


def test_a_bad_head_to_knock_out_leaves_the_model_as_it_was(model: GPTModel) -> None:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rules = [block.att.rule for block in model.trf_blocks]
    settings = Settings(mask="window", window=2, temperature=2.0, ablate=[(0, 1), (5, 0)])
    assert settings.ablate == ((0, 1), (5, 0))  # a list becomes a tuple: hashable
    with pytest.raises(ValueError, match=r"layer must be < 2 and head < 4"):
        reference(model, IDX, settings)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name  # W_query no longer divided by 2
    assert [block.att.rule for block in model.trf_blocks] == rules


def test_reference_refuses_what_would_make_its_answer_wrong(model: GPTModel) -> None:
    with pytest.raises(ValueError, match=r"eval mode"):
        reference(model.train(), IDX)  # dropout: a random answer
    model.eval()
    with pytest.raises(TypeError, match="settings must be a Settings"):
        reference(model, IDX, {"mask": "causal"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_tokens >= 1"):
        reference(model, IDX[:, :0])
    logits, _ = reference(model, IDX.tolist())  # nested lists are ids too
    assert logits.shape == (IDX.shape[1], CFG["vocab_size"])
    with pytest.raises(ValueError, match="distinct, non-empty strings"):
        export_model(model, ["a"] * 12)
    with pytest.raises(TypeError, match="list or tuple of token strings"):
        export_model(model, (f"t{i}" for i in range(12)))  # type: ignore[arg-type]
