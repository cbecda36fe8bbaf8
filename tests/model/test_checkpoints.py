"""Weights in and out (`attention.model.checkpoints`): Hugging Face's GPT-2, the book's layout, Llama.

A loaded model must be the same model: Hugging Face's logits, its greedy and its seeded
sampled tokens; a round trip must give back every tensor bit for bit; a Llama or Mistral
attention layer must compute what `transformers`' own does, with its rotary embedding and its
masks. Tiny random models throughout.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from attention import MultiHeadAttention
from attention.layer.testing import reference_attention
from attention.model.checkpoints import (
    attention_from_llama,
    attention_to_llama,
    gpt2_config,
    gpt2_from_hf,
    gpt2_from_pretrained,
    gpt2_to_hf,
    gpt2_to_params,
    llama_attention_config,
    load_weights_into_gpt,
)
from attention.model.generation import generate
from attention.model.gpt import GPTModel

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 96, 48, 32, 4, 2
SETTINGS = {"n_vocab": VOCAB, "n_ctx": CONTEXT, "n_embd": WIDTH, "n_head": HEADS,
            "n_layer": LAYERS}  # fmt: skip
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-12}


@pytest.fixture
def transformers() -> ModuleType:
    return pytest.importorskip("transformers", minversion="5.24")  # 5.24 names the cache `cache=`


def hf_gpt2(transformers: ModuleType, device: torch.device, dtype: torch.dtype = torch.float64,
            tied: bool = True) -> Any:  # fmt: skip
    """A random `GPT2LMHeadModel`: GPT-2's defaults (gelu_new, eps 1e-5), no dropout."""
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tied,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).to(device=device, dtype=dtype).eval()
    if not tied:  # an untied head of its own values
        with torch.no_grad():
            hf.lm_head.weight.normal_(0.0, 0.02)
    return hf


def load(hf: Any, source: str, tmp_path: Path, device: torch.device) -> GPTModel:
    """Ours from `hf`, through a state dict, a .safetensors or .bin file, or a directory."""
    if source == "state dict":
        return gpt2_from_hf(hf.state_dict(), n_heads=HEADS)
    if source == "bin":
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
        return gpt2_from_hf(tmp_path / "pytorch_model.bin", n_heads=HEADS, device=device)
    hf.save_pretrained(tmp_path)  # model.safetensors (a tied head dropped), config.json
    if source == "safetensors":
        return gpt2_from_hf(str(tmp_path / "model.safetensors"), n_heads=HEADS, device=device)
    return gpt2_from_hf(tmp_path, device=device)  # the heads from config.json


@pytest.mark.parametrize("source", ["state dict", "safetensors", "bin", "directory"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_loaded_gpt2_gives_hugging_faces_logits(
    transformers: ModuleType, device: torch.device, tmp_path: Path, source: str, tied: bool,
    dtype: torch.dtype,
) -> None:  # fmt: skip
    hf = hf_gpt2(transformers, device, dtype, tied)
    model = load(hf, source, tmp_path, device)
    assert model.tok_emb.weight.dtype == dtype and model.tok_emb.weight.device.type == device.type
    assert not model.training
    w = model.trf_blocks[0].att.W_query.weight
    assert w.t().is_contiguous()  # loaded in place: the (in, out) layout GPTModel keeps
    ids = torch.randint(0, VOCAB, (3, 20), device=device)
    tol = TOLERANCE[dtype]
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=tol, rtol=tol)


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
def test_loaded_gpt2_writes_hugging_faces_tokens(
    transformers: ModuleType, device: torch.device, use_cache: bool
) -> None:
    hf = hf_gpt2(transformers, device)
    model = gpt2_from_hf(hf.state_dict(), n_heads=HEADS)
    prompt = torch.randint(0, VOCAB, (2, 6), device=device)
    mask = torch.ones_like(prompt)
    theirs = hf.generate(prompt, attention_mask=mask, do_sample=False, max_new_tokens=20,
                         use_cache=use_cache)  # fmt: skip
    assert torch.equal(generate(model, prompt, 20, None, 0.0, None, None, use_cache), theirs)
    for seed in range(3):  # the same draws: both call torch.multinomial on the global RNG
        torch.manual_seed(seed)
        theirs = hf.generate(prompt, attention_mask=mask, do_sample=True, top_k=10,
                             temperature=0.8, max_new_tokens=20, use_cache=use_cache)  # fmt: skip
        torch.manual_seed(seed)
        ours = generate(model, prompt, 20, None, 0.8, 10, None, use_cache)
        assert torch.equal(ours, theirs), seed


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_hugging_face_round_trip_is_exact(
    transformers: ModuleType, device: torch.device, tied: bool
) -> None:
    hf = hf_gpt2(transformers, device, torch.float32, tied)
    state = hf.state_dict()
    back = gpt2_to_hf(gpt2_from_hf(state, n_heads=HEADS))
    assert list(back) == list(state)  # every key, in Hugging Face's order
    for key, value in state.items():
        assert torch.equal(back[key], value), key
    hf.load_state_dict(back)  # strict: nothing missing, nothing unknown


def test_a_gpt2model_state_dict_with_the_old_mask_buffers(transformers: ModuleType) -> None:
    hf = hf_gpt2(transformers, torch.device("cpu"))
    state = dict(hf.transformer.state_dict())  # GPT2Model: no prefix, no lm_head (tied)
    for i in range(LAYERS):  # what GPT-2's original checkpoints also hold: not weights
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, CONTEXT, CONTEXT).tril()
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    model = gpt2_from_hf(state, n_heads=HEADS)
    assert torch.equal(model.out_head.weight, hf.lm_head.weight)  # tied: the head is wte
    ids = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-12, rtol=1e-12)


def test_ours_saved_as_safetensors_loads_back_exactly(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    model = GPTModel(gpt2_config(SETTINGS)).eval()
    safetensors.save_file(gpt2_to_hf(model), tmp_path / "model.safetensors")  # contiguous
    again = gpt2_from_hf(tmp_path / "model.safetensors", n_heads=HEADS)
    for (name, a), b in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_model_without_qkv_bias_exports_zero_biases(transformers: ModuleType) -> None:
    cfg = {**gpt2_config(SETTINGS), "qkv_bias": False}
    model = GPTModel(cfg).eval()
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=WIDTH,
                                     n_layer=LAYERS, n_head=HEADS, tie_word_embeddings=False)  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.load_state_dict(gpt2_to_hf(model))
    ids = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-5, rtol=1e-5)


def test_a_sharded_directory_and_a_dtype(transformers: ModuleType, tmp_path: Path) -> None:
    hf = hf_gpt2(transformers, torch.device("cpu"))
    hf.save_pretrained(tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    model = gpt2_from_hf(tmp_path, dtype=torch.float32)
    assert model.tok_emb.weight.dtype == torch.float32
    ids = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits.float(), atol=1e-4, rtol=1e-4)


def test_gpt2_from_pretrained_reads_what_the_hub_download_returns(
    transformers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = pytest.importorskip("huggingface_hub")
    hf = hf_gpt2(transformers, torch.device("cpu"))
    hf.save_pretrained(tmp_path)
    asked = []
    monkeypatch.setattr(hub, "snapshot_download",
                        lambda name, **kw: asked.append(name) or str(tmp_path))  # fmt: skip
    model = gpt2_from_pretrained("openai-community/gpt2")
    assert asked == ["openai-community/gpt2"]
    assert torch.equal(model.tok_emb.weight, hf.transformer.wte.weight)


def test_gpt2_from_pretrained_without_huggingface_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match="pip install huggingface_hub"):
        gpt2_from_pretrained()


# --- the book's chapter-5 layout ---


def book_params(tf_variables: dict[str, np.ndarray]) -> dict[str, Any]:
    """The book's `load_gpt2_params_from_tf_ckpt`, on OpenAI's variable names."""
    params: dict[str, Any] = {"blocks": [{} for _ in range(LAYERS)]}
    for name, array in tf_variables.items():
        parts = name.split("/")[1:]
        target = params
        if parts[0].startswith("h"):
            target = params["blocks"][int(parts[0][1:])]
        for key in parts[1:-1]:
            target = target.setdefault(key, {})
        target[parts[-1]] = array
    return params


def tf_variables(hf_state: dict[str, Tensor]) -> dict[str, np.ndarray]:
    """OpenAI's TensorFlow checkpoint's names for Hugging Face's tensors (the same arrays)."""
    out = {}
    for key, value in hf_state.items():
        key = key.removeprefix("transformer.")
        if key == "lm_head.weight":
            continue
        parts = key.split(".")
        leaf = {"weight": "g" if parts[-2].startswith("ln_") else "w", "bias": "b"}[parts[-1]]
        if parts[0] == "h":
            parts = [f"h{parts[1]}", *parts[2:]]
        name = "/".join(["model", *parts[:-1]]) + ("" if parts[0] in ("wte", "wpe") else f"/{leaf}")
        out[name] = value.detach().cpu().numpy()
    return out


def test_the_books_layout_loads_hugging_faces_gpt2(transformers: ModuleType) -> None:
    hf = hf_gpt2(transformers, torch.device("cpu"), torch.float32)
    variables = tf_variables(hf.state_dict())
    assert "model/h0/attn/c_attn/w" in variables and "model/ln_f/g" in variables
    gpt = GPTModel(gpt2_config(SETTINGS)).eval()
    load_weights_into_gpt(gpt, book_params(variables))
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(gpt(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qkv_bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_books_layout_round_trip_is_exact(
    device: torch.device, qkv_bias: bool, dtype: torch.dtype
) -> None:
    cfg = {**gpt2_config(SETTINGS), "qkv_bias": qkv_bias}
    model = GPTModel(cfg).to(device=device, dtype=dtype)
    with torch.no_grad():
        model.out_head.weight.copy_(model.tok_emb.weight)  # the layout ties them
    settings, params = gpt2_to_params(model)
    assert settings == SETTINGS
    assert params["blocks"][1]["mlp"]["c_fc"]["w"].shape == (WIDTH, 4 * WIDTH)
    again = GPTModel(cfg).to(device=device, dtype=dtype)
    load_weights_into_gpt(again, params)
    for (name, a), b in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_the_books_layout_needs_no_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy is not a dependency (the CPU torch wheel does not bring it): writing the book's
    layout neither imports it nor converts to it, and its tensors share no memory with the
    model."""
    model = GPTModel(gpt2_config(SETTINGS)).to(torch.bfloat16)
    with torch.no_grad():
        model.out_head.weight.copy_(model.tok_emb.weight)

    def unavailable(*args: object) -> None:
        raise RuntimeError("Numpy is not available")

    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` raises ImportError
    monkeypatch.setattr(torch.Tensor, "numpy", unavailable)
    _, params = gpt2_to_params(model)
    monkeypatch.undo()
    wte = params["wte"]
    assert isinstance(wte, torch.Tensor) and wte.dtype == torch.float32 and wte.device.type == "cpu"
    assert wte.shape == model.tok_emb.weight.shape and not wte.requires_grad
    wte.zero_()
    assert bool(model.tok_emb.weight.abs().sum() > 0)  # a copy
    as_numpy = {"g": params["g"].numpy(), "b": params["b"].numpy()}  # the book's arrays
    assert isinstance(as_numpy["g"], np.ndarray) and as_numpy["g"].dtype == np.float32


# --- one attention layer of Llama or Mistral ---

LLAMA = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
         "max_position_embeddings": 32, "attn_implementation": "sdpa"}  # fmt: skip
KINDS = {"llama": ({"rope_theta": 500.0}, "LlamaAttention", "create_causal_mask"),
         "mistral": ({"sliding_window": 5}, "MistralAttention",
                     "create_sliding_window_causal_mask")}  # fmt: skip


def hf_attention(transformers: ModuleType, kind: str, extra: dict[str, Any]) -> tuple[Any, Any]:
    """A `LlamaAttention` or `MistralAttention` (random, float64, eval) and its config."""
    config_class = transformers.LlamaConfig if kind == "llama" else transformers.MistralConfig
    config = config_class(**{**LLAMA, **KINDS[kind][0], **extra})
    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    torch.manual_seed(1)
    layer = getattr(module, KINDS[kind][1])(config, layer_idx=0).double().eval()
    return layer, config


def hf_forward(transformers: ModuleType, kind: str, layer: Any, x: Tensor,
               own_rotary: bool = False) -> Tensor:  # fmt: skip
    """`layer(x)` as the model calls it: the model's rotary embedding and causal mask.

    `transformers`' rotary embedding computes its angles in float32 whatever the model's
    dtype; unless `own_rotary`, the same formula is evaluated in float64 instead.
    """
    config = layer.config
    positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
    if own_rotary:
        module = sys.modules[type(layer).__module__]  # modeling_llama, modeling_mistral
        rotary = getattr(module, f"{kind.capitalize()}RotaryEmbedding")(config).to(x.device)
        cos, sin = rotary(x, positions)
    else:
        theta = config.rope_parameters["rope_theta"]
        d = layer.head_dim
        inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
        angles = positions[..., None].double() * inv_freq
        angles = torch.cat((angles, angles), dim=-1)  # (b, T, d_h), as Hugging Face's forward
        cos, sin = angles.cos(), angles.sin()
    make_mask = getattr(transformers.masking_utils, KINDS[kind][2])
    mask = make_mask(config=config, inputs_embeds=x, attention_mask=None, cache=None,
                     position_ids=positions, allow_is_causal_skip=False)  # fmt: skip
    with torch.no_grad():
        out: Tensor = layer(x, position_embeddings=(cos, sin), attention_mask=mask)[0]
    return out


BIAS = [("llama", False), ("llama", True), ("mistral", False)]  # Mistral's has no bias


@pytest.mark.parametrize(("kind", "attention_bias"), BIAS, ids=["llama", "llama-bias", "mistral"])
def test_llama_and_mistral_attention_load_into_ours(
    transformers: ModuleType, device: torch.device, kind: str, attention_bias: bool
) -> None:
    layer, config = hf_attention(transformers, kind, {"attention_bias": attention_bias})
    layer = layer.to(device)
    att = attention_from_llama(layer.state_dict(), config)
    assert (att.num_heads, att.num_kv_heads, att.rope) == (8, 2, True)
    assert att.window == (5 if kind == "mistral" else None)
    x = torch.randn(2, 12, 64, dtype=torch.float64, device=device)  # 12 tokens > the window
    with torch.no_grad():
        ours = att(x)
    torch.testing.assert_close(ours, hf_forward(transformers, kind, layer, x), atol=1e-10, rtol=0)
    # with transformers' own float32 angles: equal to float32's precision
    theirs = hf_forward(transformers, kind, layer, x, own_rotary=True)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("kind", "qkv_bias"), BIAS, ids=["llama", "llama-bias", "mistral"])
def test_ours_loads_into_llama_and_mistral_attention(
    transformers: ModuleType, device: torch.device, kind: str, qkv_bias: bool
) -> None:
    torch.manual_seed(2)
    att = MultiHeadAttention(64, 64, 32, 0.0, num_heads=8, qkv_bias=qkv_bias, num_kv_heads=2,
                             rope=True, rope_base=500.0,
                             window=5 if kind == "mistral" else None)  # fmt: skip
    att = att.to(device=device, dtype=torch.float64).eval()
    if not qkv_bias:
        with torch.no_grad():
            att.out_proj.bias.zero_()  # Hugging Face's o_proj has no bias without attention_bias
    config = llama_attention_config(att)
    extra = {key: config[key] for key in ("head_dim", "rope_parameters", "attention_bias")}
    layer, _ = hf_attention(transformers, kind, extra)
    layer.load_state_dict(attention_to_llama(att))  # strict
    layer = layer.to(device)
    x = torch.randn(2, 12, 64, dtype=torch.float64, device=device)
    with torch.no_grad():
        ours = att(x)
    torch.testing.assert_close(ours, hf_forward(transformers, kind, layer, x), atol=1e-10, rtol=0)


def test_a_whole_models_layer_by_prefix(transformers: ModuleType) -> None:
    config = transformers.LlamaConfig(**LLAMA, num_hidden_layers=2, intermediate_size=32,
                                      vocab_size=40)  # fmt: skip
    model = transformers.LlamaModel(config)
    att = attention_from_llama(model.state_dict(), config, prefix="layers.1.self_attn.",
                               context_length=16)  # fmt: skip
    assert att.context_length == 16
    assert torch.equal(att.W_key.weight, model.layers[1].self_attn.k_proj.weight)


# --- bad input: each error names what it expected and what it got ---


def tiny_state() -> dict[str, Tensor]:
    return gpt2_to_hf(GPTModel(gpt2_config(SETTINGS)))


def test_gpt2_from_hf_names_the_bad_tensor() -> None:
    state = tiny_state()
    state["transformer.h.1.attn.c_attn.weight"] = torch.zeros(WIDTH, 95)
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.attn\.c_attn\.weight: expected "
                                         r"shape \(32, 96\), got \(32, 95\)"):  # fmt: skip
        gpt2_from_hf(state, n_heads=HEADS)
    state = tiny_state()
    del state["transformer.h.0.mlp.c_fc.bias"]
    state["transformer.h.0.mlp.extra"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"unknown keys \['transformer.h.0.mlp.extra'\]; "
                                         r"missing .*'h.0.mlp.c_fc.bias \(128,\)'"):  # fmt: skip
        gpt2_from_hf(state, n_heads=HEADS)
    state = tiny_state()
    state["transformer.ln_f.weight"] = state["transformer.ln_f.weight"].long()
    with pytest.raises(TypeError, match=r"transformer\.ln_f\.weight must be a floating-point"):
        gpt2_from_hf(state, n_heads=HEADS)


@pytest.mark.parametrize(
    ("change", "n_heads", "message"),
    [
        (lambda s: s.pop("transformer.wte.weight"), HEADS, "no wte.weight"),
        (lambda s: [s.pop(k) for k in list(s) if ".h." in k], HEADS, r"no transformer block"),
        (lambda s: None, None, "width 32 is none of GPT-2's .*: pass n_heads"),
    ],
    ids=["no wte", "no blocks", "unknown heads"],
)
def test_gpt2_from_hf_refuses_what_is_not_gpt2(change: Any, n_heads: int | None,
                                               message: str) -> None:  # fmt: skip
    state = tiny_state()
    change(state)
    with pytest.raises(ValueError, match=message):
        gpt2_from_hf(state, n_heads=n_heads)


def test_gpt2_from_hf_refuses_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="source must be a state dict, or the path"):
        gpt2_from_hf(42)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="neither a file nor a directory"):
        gpt2_from_hf(tmp_path / "nothing.safetensors")
    (tmp_path / "weights.npz").write_bytes(b"")
    with pytest.raises(ValueError, match=r"\.safetensors, \.bin, \.pt or \.pth file"):
        gpt2_from_hf(tmp_path / "weights.npz")
    with pytest.raises(ValueError, match=r"neither model\.safetensors nor pytorch_model\.bin"):
        gpt2_from_hf(tmp_path)
    with pytest.raises(ValueError, match="n_heads must divide the width 32"):
        gpt2_from_hf(tiny_state(), n_heads=5)
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype"):
        gpt2_from_hf(tiny_state(), n_heads=HEADS, dtype=torch.int64)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"n_head": 2}, "n_heads=4, but config.json says n_head=2"),
        ({"activation_function": "relu"}, "activation_function='relu'; GPT-2"),
        ({"model_type": "llama"}, "model_type='llama'"),
    ],
)
def test_gpt2_from_hf_checks_config_json(tmp_path: Path, config: dict[str, Any],
                                         message: str) -> None:  # fmt: skip
    torch.save(tiny_state(), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        gpt2_from_hf(tmp_path, n_heads=HEADS)


@pytest.mark.parametrize(
    ("extra", "named"),
    [({"rope_base": 10000.0}, "rotary positions"), ({"n_kv_heads": 2}, "grouped-query"),
     ({"window": 8}, "a sliding window"), ({"window": 8, "sinks": 2}, "attention sinks")],
)  # fmt: skip
def test_only_plain_gpt2_is_exported(extra: dict[str, Any], named: str) -> None:
    model = GPTModel({**gpt2_config(SETTINGS), **extra})
    with pytest.raises(ValueError, match=f"plain GPT-2 configuration only; .*{named}"):
        gpt2_to_hf(model)
    with pytest.raises(ValueError, match=named):
        gpt2_to_params(model)
    with pytest.raises(TypeError, match="model must be a GPTModel, got Linear"):
        gpt2_to_hf(nn.Linear(2, 2))  # type: ignore[arg-type]


def test_the_books_layout_names_the_bad_entry() -> None:
    model = GPTModel(gpt2_config(SETTINGS))
    with pytest.raises(ValueError, match="ties the output head to wte"):
        gpt2_to_params(model)
    with torch.no_grad():
        model.out_head.weight.copy_(model.tok_emb.weight)
    _, params = gpt2_to_params(model)
    params["blocks"][1]["ln_2"]["g"] = np.zeros(WIDTH + 1, dtype=np.float32)
    target = GPTModel(gpt2_config(SETTINGS))
    before = [p.clone() for p in target.parameters()]
    with pytest.raises(ValueError, match=r'params\["blocks"\]\[1\]\["ln_2"\]\["g"\]: expected '
                                         r"shape \(32,\), got \(33,\)"):  # fmt: skip
        load_weights_into_gpt(target, params)
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters(), strict=True))
    _, params = gpt2_to_params(model)
    params["blocks"].append(params["blocks"][0])
    with pytest.raises(ValueError, match=r'params\["blocks"\]\[2\]\["ln_1"\]\["g"\] is not a '
                                         r"weight of this model \(2 blocks; params has 3\)"):  # fmt: skip
        load_weights_into_gpt(GPTModel(gpt2_config(SETTINGS)), params)
    _, params = gpt2_to_params(model)
    del params["g"]
    with pytest.raises(ValueError, match=r'missing .*params\["g"\] \(32,\)'):
        load_weights_into_gpt(GPTModel(gpt2_config(SETTINGS)), params)
    _, params = gpt2_to_params(model)
    params["blocks"][0]["attn"]["c_attn"]["b"][:] = 1.0
    with pytest.raises(ValueError, match=r'c_attn"\]\["b"\] is not zero, .*qkv_bias=True'):
        load_weights_into_gpt(GPTModel({**gpt2_config(SETTINGS), "qkv_bias": False}), params)
    with pytest.raises(ValueError, match=r"settings .* missing \['n_layer'\]"):
        gpt2_config({key: v for key, v in SETTINGS.items() if key != "n_layer"})


def pickled(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def saved(directory: Path, kind: str) -> None:
    """The tiny GPT-2 as `save_pretrained` writes it: config.json, and its weights."""
    config = {"model_type": "gpt2", "n_head": HEADS, "n_layer": LAYERS}
    (directory / "config.json").write_text(json.dumps(config))
    if kind == "safetensors":
        safetensors = pytest.importorskip("safetensors.torch")
        safetensors.save_file(tiny_state(), directory / "model.safetensors")
    else:
        torch.save(tiny_state(), directory / "pytorch_model.bin")


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


INDEX = "pytorch_model.bin.index.json"
NOT_JSON = r"is not a valid JSON file \(truncated or corrupted\): "
NOT_PT = (
    r"pytorch_model\.bin is not a PyTorch checkpoint \(empty, truncated, corrupted or "
    r"another format\): "
)
# (saved as, the file changed, its new content (bytes, a function of the old, None: a
# directory), the source read (. the directory), error, message): each names the file
BAD_FILES = {
    "truncated safetensors": ("safetensors", "model.safetensors", half, ".", ValueError,
                              r"model\.safetensors is not a complete safetensors file \(truncated "
                              r"or corrupted\): .*incomplete metadata, file not fully covered"),
    "empty safetensors": ("safetensors", "model.safetensors", b"", "model.safetensors",
                          ValueError, r"model\.safetensors is not a complete .*header too small"),
    "garbage bin": ("bin", "pytorch_model.bin", b"garbage", ".", ValueError,
                    NOT_PT + "Unsupported operand"),
    "empty bin": ("bin", "pytorch_model.bin", b"", "pytorch_model.bin", ValueError,
                  NOT_PT + "EOFError"),
    "truncated bin": ("bin", "pytorch_model.bin", half, ".", ValueError,
                      NOT_PT + "PytorchStreamReader failed reading zip archive"),
    "a pickled module": ("bin", "pytorch_model.bin", pickled(nn.Linear(2, 2)), ".", ValueError,
                         r"pytorch_model\.bin pickles objects other than tensors \(Unsupported "
                         r"global: GLOBAL torch\.nn\.modules\.linear\.Linear.* state_dict\(\)"),
    "broken config": ("bin", "config.json", b'{"n_head": 4,', ".", ValueError,
                      r"config\.json " + NOT_JSON + "Expecting property name"),
    "empty config": ("bin", "config.json", b"", ".", ValueError,
                     r"config\.json " + NOT_JSON + "Expecting value"),
    "config not utf-8": ("bin", "config.json", b"\xff{}", ".", ValueError,
                         r"config\.json " + NOT_JSON + "'utf-8' codec can't decode byte 0xff"),
    "config a directory": ("bin", "config.json", None, ".", ValueError,
                           r"config\.json is not a file"),
    "broken index": ("bin", INDEX, b"{", ".", ValueError, r"index\.json " + NOT_JSON),
    "index without weight_map": ("bin", INDEX, b"{}", ".", ValueError,
                                 r"index\.json must hold a JSON object whose weight_map maps "
                                 r"tensor names to shard files, got weight_map=None"),
    "weight_map a list": ("bin", INDEX, b'{"weight_map": ["a"]}', ".", ValueError,
                          r"weight_map=\['a'\]"),
    "a shard not a str": ("bin", INDEX, b'{"weight_map": {"a": 3}}', ".", ValueError,
                          r"weight_map=\{'a': 3\}"),
    "no shard": ("bin", INDEX, b'{"weight_map": {}}', ".", ValueError, r"weight_map=\{\}"),
    "a missing shard": ("bin", INDEX, b'{"weight_map": {"a": "nope.bin"}}', ".",
                        FileNotFoundError, r"index\.json names the shard 'nope\.bin', which is "
                                           r"not a file in"),
    "a shard outside": ("bin", INDEX, b'{"weight_map": {"a": "../pytorch_model.bin"}}', ".",
                        ValueError, r"index\.json names a shard outside"),
    "a shard a directory": ("bin", INDEX, b'{"weight_map": {"a": "."}}', ".",
                            FileNotFoundError, r"names the shard '\.', which is not a file"),
}  # fmt: skip


@pytest.mark.parametrize(("kind", "name", "content", "source", "error", "message"),
                         BAD_FILES.values(), ids=BAD_FILES.keys())  # fmt: skip
def test_a_bad_file_is_named_with_what_is_wrong(
    tmp_path: Path, kind: str, name: str, content: Any, source: str, error: type[Exception],
    message: str,
) -> None:  # fmt: skip
    """Not safetensors', torch's or json's own error, which names neither the file nor,
    for a file that is no checkpoint, the fault (torch's blames weights_only)."""
    directory = tmp_path / "gpt2"
    directory.mkdir()
    saved(directory, kind)
    path = directory / name
    if content is None:
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(content(path.read_bytes()) if callable(content) else content)
    with pytest.raises(error, match=message) as info:
        gpt2_from_hf(directory / source, n_heads=HEADS)
    assert str(directory) in str(info.value)


@pytest.mark.parametrize(
    ("config", "message"),
    [({"n_layer": "2"}, r"config\.json's n_layer must be an int, got '2' \(str\)"),
     ({"n_head": "4"}, r"config\.json's n_head must be an int, got '4' \(str\)")],
)  # fmt: skip
def test_config_json_values_of_another_type_are_named(tmp_path: Path, config: dict[str, Any],
                                                      message: str) -> None:  # fmt: skip
    """Not "config.json says n_layer='2', but the weights hold 2", nor n_head='4' against 4."""
    torch.save(tiny_state(), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TypeError, match=message):
        gpt2_from_hf(tmp_path, n_heads=HEADS)


def test_a_bad_file_keeps_the_readers_error_as_its_cause(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"weights\.bin is not a PyTorch checkpoint") as info:
        gpt2_from_hf(tmp_path / "weights.bin", n_heads=HEADS)
    assert type(info.value.__cause__).__name__ == "UnpicklingError"
    saved(tmp_path, "bin")
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"config\.json is not a valid JSON file") as info:
        gpt2_from_hf(tmp_path)
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: gpt2_from_hf(""), ValueError, r"source must be a state dict or a path, got the "
                                               r"empty path ''"),
        (lambda: gpt2_from_hf(tiny_state(), n_heads=HEADS, device="gpu"), ValueError,
         r"device must be a device such as 'cpu', 'cuda' or 'cuda:0', got 'gpu'"),
        (lambda: gpt2_from_hf(tiny_state(), n_heads=HEADS, device=1.5), TypeError,
         r"device must be a torch\.device or a string .*, got 1\.5 \(float\)"),
    ],
    ids=["empty path", "unknown device", "device of another type"],
)  # fmt: skip
def test_gpt2_from_hf_names_a_bad_argument(call: Any, error: type[Exception],
                                           message: str) -> None:  # fmt: skip
    with pytest.raises(error, match=message):
        call()


def book_with(path: tuple[Any, ...], value: object) -> dict[str, Any]:
    """A tied model's `params`, the entry at `path` replaced by `value`."""
    model = GPTModel(gpt2_config(SETTINGS))
    with torch.no_grad():
        model.out_head.weight.copy_(model.tok_emb.weight)
    _, params = gpt2_to_params(model)
    tree: Any = params
    for step in path[:-1]:
        tree = tree[step]
    tree[path[-1]] = value
    return params


def load_book(path: tuple[Any, ...], value: object) -> Any:
    return lambda: load_weights_into_gpt(GPTModel(gpt2_config(SETTINGS)), book_with(path, value))


BOOK_ERRORS = {
    "settings None": (lambda: gpt2_config(None), TypeError,  # type: ignore[arg-type]
                      r"settings must be hparams\.json's dict, got NoneType"),
    "n_embd a str": (lambda: gpt2_config({**SETTINGS, "n_embd": "32"}), TypeError,
                     r"settings' n_embd must be an int, got '32' \(str\)"),
    "drop_rate a str": (lambda: gpt2_config(SETTINGS, drop_rate="0.1"), TypeError,  # type: ignore[arg-type]
                        r"drop_rate must be a float in \[0, 1\), got '0\.1'"),
    "a str leaf": (load_book(("g",), "abc"), TypeError,
                   r'params\["g"\] must be an array of numbers \(NumPy or torch\), got str'),
    "a None leaf": (load_book(("blocks", 0, "ln_1", "b"), None), TypeError,
                    r'params\["blocks"\]\[0\]\["ln_1"\]\["b"\] must be an array of numbers'),
    "an object array": (load_book(("g",), np.ones(WIDTH, dtype=object)), TypeError,
                        r'params\["g"\] must be an array of numbers .*got ndarray'),
    "blocks None": (load_book(("blocks",), None), ValueError,
                    r'params\["blocks"\] is not a weight of this model \(2 blocks; params has '
                    r"no list of them\)"),
    "a hub name None": (lambda: gpt2_from_pretrained(None), TypeError,  # type: ignore[arg-type]
                        r"name must be a Hub repository such as 'openai-community/gpt2', got "
                        r"None"),
    "a revision an int": (lambda: gpt2_from_pretrained(revision=3), TypeError,  # type: ignore[arg-type]
                          r"revision must be a branch, tag or commit \(a str\), got 3"),
}  # fmt: skip


@pytest.mark.parametrize(("call", "error", "message"), BOOK_ERRORS.values(),
                         ids=BOOK_ERRORS.keys())  # fmt: skip
def test_the_books_layout_and_the_hub_name_a_bad_argument(call: Any, error: type[Exception],
                                                          message: str) -> None:  # fmt: skip
    with pytest.raises(error, match=message):
        call()


def llama_state() -> dict[str, Tensor]:
    return {"q_proj.weight": torch.randn(64, 64), "k_proj.weight": torch.randn(16, 64),
            "v_proj.weight": torch.randn(16, 64), "o_proj.weight": torch.randn(64, 64)}  # fmt: skip


LLAMA_ERRORS = {
    "longrope": ({"rope_parameters": {"rope_type": "longrope", "factor": 2.0,
                                      "rope_theta": 1e4}},
                 None, "rope_type='longrope' is not supported"),
    "yarn": ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, None, "'yarn'"),
    "head_dim": ({"head_dim": 16}, None, r"q_proj.weight: expected shape \(128, 64\)"),
    "shape": ({}, ("k_proj.weight", torch.randn(8, 64)),
              r"k_proj.weight: expected shape \(16, 64\), got \(8, 64\)"),
    "unknown": ({}, ("rotary.weight", torch.randn(8)), r"unknown keys \['rotary.weight'\]"),
    "qk-norm width": ({}, ("q_norm.weight", torch.randn(5)), r"q_norm.weight must be \(head_dim,\)"),
    "missing": ({}, ("v_proj.weight", None), r"missing keys \['v_proj.weight \(16, 64\)'\]"),
    "bias missing": ({"attention_bias": True}, None, r"missing keys \['q_proj.bias \(64,\)'"),
}  # fmt: skip


@pytest.mark.parametrize(("config", "change", "message"), LLAMA_ERRORS.values(),
                         ids=LLAMA_ERRORS.keys())  # fmt: skip
def test_attention_from_llama_refuses(config: dict[str, Any], change: Any, message: str) -> None:
    state = llama_state()
    if change is not None:
        key, value = change
        if value is None:
            del state[key]
        else:
            state[key] = value
    base = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
            "max_position_embeddings": 32}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        attention_from_llama(state, {**base, **config})


def test_attention_from_llama_needs_a_config() -> None:
    with pytest.raises(TypeError, match="config must be a transformers config or its dict"):
        attention_from_llama(llama_state(), 64)
    with pytest.raises(ValueError, match=r"missing \['num_attention_heads'\]"):
        attention_from_llama(llama_state(), {"hidden_size": 64})


BASE = {"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
        "max_position_embeddings": 32}  # fmt: skip


def from_llama(state: Any = ..., config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """A call of attention_from_llama: llama_state() unless `state`, BASE updated by `config`."""
    return lambda: attention_from_llama(llama_state() if state is ... else state,
                                        {**BASE, **(config or {})}, **kwargs)  # fmt: skip


FLOAT64 = {**llama_state(), "v_proj.weight": torch.randn(16, 64, dtype=torch.float64)}
ROPE_HALF = {"rope_parameters": {"rope_type": "default", "rope_theta": 0.5}}
A_NUMBER = r"must be a finite number > 1 \(RoPE's base\), got"
LAYER_TYPES = r"config's layer_types must be a list of strings, one per layer .*got"
# (call, error, message): arguments and config values of the wrong kind, named: not torch's,
# float()'s or a dict's error, nor a string taken for a number or for a truthy flag
LLAMA_ARGUMENTS = {
    "no state dict": (from_llama(None), TypeError,
                      r"state_dict must be a mapping from names to tensors .*, got NoneType"),
    "a list": (from_llama([llama_state()]), TypeError, r"state_dict must be a .*, got list"),
    "a key not a str": (from_llama({**llama_state(), 0: torch.zeros(1)}), TypeError,
                        r"state_dict's keys must be str \(tensor names\), got 0 \(int\)"),
    "prefix an int": (from_llama(prefix=0), TypeError,
                      r"prefix must be a str \(e\.g\. 'model\.layers\.0\.self_attn\.'\), got 0 "
                      r"\(int\)"),
    "prefix None": (from_llama(prefix=None), TypeError, r"prefix must be a str .*got None"),
    "layer a str": (from_llama(layer="0"), TypeError, r"layer must be an int, got '0' \(str\)"),
    "context_length a str": (from_llama(context_length="8"), TypeError,
                             r"^context_length must be an int, got '8' \(str\)"),
    "mixed dtypes": (from_llama(FLOAT64), TypeError,
                     r"v_proj\.weight must have dtype torch\.float32, got torch\.float64"),
    "rope_theta a str": (from_llama(config={"rope_theta": "abc"}), ValueError,
                         f"config's rope_theta {A_NUMBER} 'abc'"),
    "rope_theta a numeral": (from_llama(config={"rope_theta": "1e4"}), ValueError,
                             f"config's rope_theta {A_NUMBER} '1e4'"),
    "rope_theta None": (from_llama(config={"rope_theta": None}), ValueError,
                        f"config's rope_theta {A_NUMBER} None"),
    "rope_theta below 1": (from_llama(config=ROPE_HALF), ValueError,
                           rf"config's rope_parameters\['rope_theta'\] {A_NUMBER} 0\.5"),
    "rope_parameters a list": (from_llama(config={"rope_parameters": [1.0]}), TypeError,
                               r"config's rope_parameters must be a dict .*, got \[1\.0\] "
                               r"\(list\)"),
    "attention_bias a str": (from_llama(config={"attention_bias": "false"}), TypeError,
                             r"config's attention_bias must be True or False, got 'false'"),
    "attention_dropout a str": (from_llama(config={"attention_dropout": "0.1"}), TypeError,
                                r"config's attention_dropout must be a float in \[0, 1\), got "
                                r"'0\.1'"),
    "max_position_embeddings a str": (from_llama(config={"max_position_embeddings": "32"}),
                                      TypeError, r"config's max_position_embeddings must be an "
                                                 r"int, got '32'"),
    "layer_types a str": (from_llama(config={"layer_types": "full_attention"}), TypeError,
                          f"{LAYER_TYPES} 'full_attention'"),
    "layer_types an int": (from_llama(config={"layer_types": 2}), TypeError,
                           f"{LAYER_TYPES} 2"),
    "head_dim 0": (from_llama(config={"head_dim": 0}), ValueError,
                   r"head_dim must be >= 1, got 0"),
    "key/value heads": (from_llama(config={"num_key_value_heads": 3}), ValueError,
                        r"config's num_key_value_heads=3 must divide num_attention_heads=8"),
}  # fmt: skip


@pytest.mark.parametrize(("call", "error", "message"), LLAMA_ARGUMENTS.values(),
                         ids=LLAMA_ARGUMENTS.keys())  # fmt: skip
def test_attention_from_llama_names_a_bad_argument(call: Any, error: type[Exception],
                                                   message: str) -> None:  # fmt: skip
    with pytest.raises(error, match=message):
        call()


def test_attention_from_llama_takes_none_for_a_configs_optional_values() -> None:
    """A config.json may write null for what it leaves at the default."""
    config = {**BASE, "attention_bias": None, "attention_dropout": None, "head_dim": None}
    att = attention_from_llama(llama_state(), config)
    assert att.dropout.p == 0.0 and att.W_query.bias is None and att.head_dim == 8


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"causal": False}, "att has not causal"),
        ({}, r"att has no RoPE \(rope=False\)"),
        ({"rope": True, "window": 4, "sinks": 1}, r"att has attention sinks"),
        ({"rope": True, "d_out": 32}, "att has d_in=64 != d_out=32"),
        ({"rope": True}, "att.out_proj.bias is not zero, .*o_proj has no bias"),
    ],
)
def test_attention_to_llama_refuses(kwargs: dict[str, Any], message: str) -> None:
    d_out = kwargs.pop("d_out", 64)
    att = MultiHeadAttention(64, d_out, 32, 0.0, num_heads=8, **kwargs)
    with pytest.raises(ValueError, match=message):
        attention_to_llama(att)
    with pytest.raises(TypeError, match="att must be a MultiHeadAttention, got Linear"):
        attention_to_llama(nn.Linear(2, 2))  # type: ignore[arg-type]


def test_config_json_must_agree_with_the_weights(transformers: ModuleType, tmp_path: Path) -> None:
    """A block's tensors gone from the file, or another model's config: refused, not a smaller
    model loaded silently."""
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=40, n_positions=16, n_embd=24, n_layer=2, n_head=4))  # fmt: skip
    hf.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if ".h.1." not in k}, tmp_path / "model.safetensors"
    )
    with pytest.raises(ValueError, match=r"config.json says n_layer=2, but the weights hold 1"):
        gpt2_from_hf(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config.json must hold a JSON object, got a list"):
        gpt2_from_hf(tmp_path)


def test_a_layer_of_a_model_whose_layers_differ(transformers: ModuleType) -> None:
    """Qwen2: the first max_window_layers layers attend to everything, the rest in a window."""
    config = transformers.Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=3, sliding_window=4, use_sliding_window=True,
                                      max_window_layers=1, max_position_embeddings=64)  # fmt: skip
    state = {f"{n}_proj.weight": torch.randn(16 if n in "kv" else 32, 32) for n in "qkvo"}
    with pytest.raises(ValueError, match=r"config's layers attend differently .*: pass layer="):
        attention_from_llama(state, config)
    assert attention_from_llama(state, config, layer=0).window is None
    assert attention_from_llama(state, config, layer=2).window == 4
    with pytest.raises(
        ValueError, match=r"layer must be an index into the config's 3 layers, got 3"
    ):
        attention_from_llama(state, config, layer=3)
    bad = {**config.to_dict(), "num_key_value_heads": 0, "layer_types": None}
    with pytest.raises(ValueError, match=r"num_key_value_heads must be >= 1, got 0"):
        attention_from_llama(state, bad)
    del bad["max_position_embeddings"]
    with pytest.raises(
        ValueError, match=r"config has no max_position_embeddings: pass context_length"
    ):
        attention_from_llama(state, {**bad, "num_key_value_heads": 2})


# --- other layers of the Llama family: what the masks and score modifiers express ---

FAMILY = {
    "gemma2": ("Gemma2Config", "Gemma2Attention", {
        "head_dim": 8, "query_pre_attn_scalar": 20, "attn_logit_softcapping": 2.0,
        "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}),
    "granite": ("GraniteConfig", "GraniteAttention", {"attention_multiplier": 0.9}),
}  # fmt: skip


def family_layer(transformers: ModuleType, kind: str, layer_idx: int) -> tuple[Any, Any]:
    config_name, class_name, extra = FAMILY[kind]
    config = getattr(transformers, config_name)(**{**LLAMA, "num_hidden_layers": 2,
                                                   "attn_implementation": "eager", **extra})  # fmt: skip
    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    torch.manual_seed(3)
    layer = getattr(module, class_name)(config, layer_idx=layer_idx).double().eval()
    return layer, config


def eager_forward(layer: Any, x: Tensor, window: int | None) -> Tensor:
    """`layer(x)` with float64 RoPE and an additive causal (windowed) mask made here."""
    num_tokens, d = x.shape[1], layer.head_dim
    theta = layer.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(num_tokens, dtype=torch.float64)[None, :, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    i, j = torch.arange(num_tokens)[:, None], torch.arange(num_tokens)[None, :]
    seen = (j <= i) & ((i - j < window) if window else True)
    mask = torch.zeros(num_tokens, num_tokens, dtype=torch.float64).masked_fill(~seen, -math.inf)
    with torch.no_grad():
        out: Tensor = layer(x, position_embeddings=(angles.cos(), angles.sin()),
                            attention_mask=mask[None, None])[0]  # fmt: skip
    return out


@pytest.mark.parametrize(("kind", "layer_idx", "window"),
                         [("gemma2", 0, 4), ("gemma2", 1, None), ("granite", 0, None)])  # fmt: skip
def test_gemma2_and_granite_layers_load_with_their_scale_cap_and_windows(
    transformers: ModuleType, kind: str, layer_idx: int, window: int | None
) -> None:
    layer, config = family_layer(transformers, kind, layer_idx)
    att = attention_from_llama(layer.state_dict(), config, layer=layer_idx)
    assert att.window == window
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    with torch.no_grad():
        ours = att(x)
    torch.testing.assert_close(ours, reference_attention(att, x), atol=1e-10, rtol=0)
    # Hugging Face's eager attention takes its softmax in float32, whatever the dtype
    torch.testing.assert_close(ours, eager_forward(layer, x, window), atol=1e-6, rtol=0)
    with pytest.raises(
        ValueError, match=r"a Llama/Mistral attention layer .*att has (score|scale)"
    ):
        attention_to_llama(att)  # Llama's keys cannot say it


def test_a_qwen2_config_json_without_layer_types() -> None:
    """Qwen2's older config.json: a window only from layer max_window_layers on."""
    config = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 3, "sliding_window": 4, "use_sliding_window": True,
              "max_window_layers": 1, "max_position_embeddings": 64}  # fmt: skip
    state = {f"{n}_proj.weight": torch.randn(16 if n in "kv" else 32, 32) for n in "qkvo"}
    assert attention_from_llama(state, config, layer=0).window is None
    assert attention_from_llama(state, config, layer=2).window == 4
    off = {**config, "use_sliding_window": False}
    assert attention_from_llama(state, off).window is None  # every layer full


@pytest.mark.parametrize(
    ("setting", "named"),
    [({"clip_qkv": 8.0}, r"config sets clip_qkv=8\.0, which attention_from_llama does not apply"),
     ({"model_type": "cohere2"}, r"model_type='cohere2' is none of the families whose RoPE"),
     ({"use_qk_norm": True}, r"config sets use_qk_norm=True, which attention_from_llama does"),
     ({"attn_logit_softcapping": -1.0}, r"attn_logit_softcapping must be a finite number > 0"),
     ({"attention_multiplier": 0.5, "query_pre_attn_scalar": 16}, r"both attention_multiplier")],
)  # fmt: skip
def test_settings_it_cannot_express_are_refused_by_name(
    setting: dict[str, Any], named: str
) -> None:
    config = {"hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 64, **setting}
    state = {f"{n}_proj.weight": torch.randn(32, 32) for n in "qkvo"}
    with pytest.raises(ValueError, match=named):
        attention_from_llama(state, config)
    neutral = {**config, **dict.fromkeys(setting)}  # each set to None: loads
    neutral.pop("model_type", None)
    assert attention_from_llama(state, neutral).scale is None


def test_a_gemma2_config_json_without_layer_types() -> None:
    """Gemma 2's config.json: a window in every other layer, the first included."""
    config = {"model_type": "gemma2", "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 8, "num_hidden_layers": 2,
              "sliding_window": 4, "query_pre_attn_scalar": 8, "max_position_embeddings": 64}  # fmt: skip
    state = {f"{n}_proj.weight": torch.randn(16 if n in "kv" else 32, 32) for n in "qkvo"}
    assert attention_from_llama(state, config, layer=0).window == 4
    assert attention_from_llama(state, config, layer=1).window is None
