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
