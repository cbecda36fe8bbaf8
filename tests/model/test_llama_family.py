"""Llama-family attention layers that are not Llama's: each equal to transformers' own, or refused.

Helium, Ernie 4.5 and Cohere rotate interleaved pairs (loaded with their query and key rows
permuted), SmolLM3 and Llama 4 have layers without RoPE, Llama 4 chunks its RoPE layers and
tunes the temperature of the others. Every layer is built tiny by transformers' own classes
and configs, in float64, and compared with its forward at positions from 0 and from
elsewhere. transformers computes RoPE's angles in float32 and Ernie, Cohere and Llama 4
rotate in float32 whatever the dtype; the reference evaluates the same formulas in float64
(their float32 casts patched out), so the two agree to 1e-10.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor

from attention.layer.masks import causal
from attention.layer.multihead import MultiHeadAttention
from attention.layer.prefix_lm import prefix_lm
from attention.layer.softcap import softcap
from attention.model.checkpoints import attention_from_llama, gpt2_to_hf, gpt2_unsupported
from attention.model.gpt import GPTModel

T, WIDTH = 12, 64
TINY = {"hidden_size": WIDTH, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 4, "intermediate_size": 32, "vocab_size": 40,
        "max_position_embeddings": 64, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None, "attn_implementation": "sdpa"}  # fmt: skip
# sdpa: the eager path takes its softmax in float32 whatever the dtype

# family: (config class, attention class, settings, (cos, sin) form: halves, pairs or complex)
FAMILIES = {
    "helium": ("HeliumConfig", "HeliumAttention", {"attention_bias": True}, "halves"),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5Attention", {"use_bias": True}, "halves"),
    "cohere": ("CohereConfig", "CohereAttention", {"attention_bias": True}, "pairs"),
    "smollm3": ("SmolLM3Config", "SmolLM3Attention",
                {"use_sliding_window": True, "sliding_window": 5}, "halves"),
    "llama4": ("Llama4TextConfig", "Llama4TextAttention",
               {"use_qk_norm": True, "attention_chunk_size": 4, "floor_scale": 3,
                "attn_scale": 0.5}, "complex"),
}  # fmt: skip


@pytest.fixture
def transformers() -> ModuleType:
    return pytest.importorskip("transformers", minversion="5.24")


def _exact_pairs(module: ModuleType) -> Any:
    """Cohere's `apply_rotary_pos_emb` without its float32 cast."""

    def apply(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> Any:
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + module.rotate_half(q) * sin, k * cos + module.rotate_half(k) * sin

    return apply


def _exact_complex(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """Llama 4's `apply_rotary_emb` without its float32 cast."""
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    rotate = freqs_cis[:, :, None, :]
    return torch.view_as_real(xq_ * rotate).flatten(3), torch.view_as_real(xk_ * rotate).flatten(3)


def hf_layer(transformers: ModuleType, family: str, layer_idx: int, monkeypatch: Any,
             **settings: Any) -> tuple[Any, Any, ModuleType]:  # fmt: skip
    """transformers' attention layer `layer_idx` of `family` (random, float64, eval), its
    config and its modeling module, float32 casts patched out of its rotation."""
    config_name, class_name, extra, _ = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**TINY, **extra, **settings})
    name = "llama4" if family == "llama4" else family
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    if family == "ernie4_5":  # Helium's: the same rotation, without the cast
        helium = importlib.import_module("transformers.models.helium.modeling_helium")
        monkeypatch.setattr(module, "apply_rotary_pos_emb", helium.apply_rotary_pos_emb)
    elif family == "cohere":
        monkeypatch.setattr(module, "apply_rotary_pos_emb", _exact_pairs(module))
    elif family == "llama4":  # its rotation and its QK-norm, without their float32 casts
        monkeypatch.setattr(module, "apply_rotary_emb", _exact_complex)
        monkeypatch.setattr(module.Llama4TextL2Norm, "forward", module.Llama4TextL2Norm._norm)
    torch.manual_seed(10 + layer_idx)
    layer = getattr(module, class_name)(config, layer_idx=layer_idx).double().eval()
    with torch.no_grad():  # nonzero biases, so that a misplaced one shows
        for name_, param in layer.named_parameters():
            if name_.endswith("bias"):
                param.normal_()
    return layer, config, module


def hf_forward(layer: Any, family: str, x: Tensor, positions: Tensor, window: int | None,
               chunk: int | None) -> Tensor:  # fmt: skip
    """`layer(x)` at `positions` (for RoPE), with float64 angles and the model's mask: causal,
    within `window`, within the token's `chunk` (by token index, as transformers counts it)."""
    d, theta = layer.head_dim, layer.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions[..., None].double() * inv_freq  # (b, T, d/2)
    form = FAMILIES[family][3]
    if form == "complex":
        embeddings: Any = torch.polar(torch.ones_like(angles), angles)
    else:
        full = (
            torch.cat((angles, angles), -1) if form == "halves" else angles.repeat_interleave(2, -1)
        )
        embeddings = (full.cos(), full.sin())
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = j <= i
    if window is not None:
        seen &= i - j < window
    if chunk is not None:
        seen &= i // chunk == j // chunk
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~seen, -math.inf)[None, None]
    with torch.no_grad():
        out: Tensor = layer(x, position_embeddings=embeddings, attention_mask=mask)[0]
    return out


def check_every_layer(transformers: ModuleType, family: str, monkeypatch: Any, offset: int,
                      **settings: Any) -> list[float]:  # fmt: skip
    """Load each layer of `family`, compare it with transformers' at positions from `offset`."""
    errors = []
    for layer_idx in range(TINY["num_hidden_layers"]):
        layer, config, _ = hf_layer(transformers, family, layer_idx, monkeypatch, **settings)
        att = attention_from_llama(layer.state_dict(), config, layer=layer_idx)
        settings = config.to_dict()
        assert att.rope == bool((settings.get("no_rope_layers") or [1] * 4)[layer_idx])
        kind = (settings.get("layer_types") or ["full_attention"] * 4)[layer_idx]
        window = settings["sliding_window"] if kind == "sliding_attention" else None
        chunk = settings["attention_chunk_size"] if kind == "chunked_attention" else None
        assert att.window == (window or chunk)  # how far back a query sees
        x = torch.randn(2, T, WIDTH, dtype=torch.float64)
        positions = (torch.arange(T) + offset)[None].expand(2, -1)
        with torch.no_grad():
            ours = att(x, positions=positions)
        theirs = hf_forward(layer, family, x, positions, window, chunk)
        torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=0)
        errors.append(float((ours - theirs).abs().max()))
    return errors


@pytest.mark.parametrize("offset", [0, 8])  # 8: a multiple of Llama 4's chunk of 4
@pytest.mark.parametrize("family", ["helium", "ernie4_5", "cohere", "smollm3"])
def test_every_layer_equals_transformers(transformers: ModuleType, monkeypatch: Any,
                                         family: str, offset: int) -> None:  # fmt: skip
    errors = check_every_layer(transformers, family, monkeypatch, offset)
    assert max(errors) < 1e-10


@pytest.mark.parametrize("offset", [0, 8])
def test_llama4_text_every_layer_equals_transformers(
    transformers: ModuleType, monkeypatch: Any, offset: int
) -> None:
    """RoPE layers chunked, every fourth layer NoPE and full. Its temperature tuning counts
    token indices, not `position_ids`: tested from 0, switched off for the other positions."""
    tuning = {"attn_temperature_tuning": offset == 0}
    errors = check_every_layer(transformers, "llama4", monkeypatch, offset, **tuning)
    assert max(errors) < 1e-10


@pytest.mark.parametrize("use_qk_norm", [True, False])
def test_llama4s_qk_norm_is_on_its_rope_layers_and_changes_them(
    transformers: ModuleType, monkeypatch: Any, use_qk_norm: bool
) -> None:
    """Llama 4's norm of each query and key head (no gains) on its RoPE layers: ours is the
    per-head QK-norm with its gains at one, frozen; without it the outputs differ."""
    layer, config, _ = hf_layer(transformers, "llama4", 0, monkeypatch, use_qk_norm=use_qk_norm)
    assert hasattr(layer, "qk_norm") == use_qk_norm
    att = attention_from_llama(layer.state_dict(), config, layer=0)
    assert att.spec.qk_norm == ("head" if use_qk_norm else None)
    if use_qk_norm:
        assert att.q_norm is not None and not att.q_norm.weight.requires_grad
        torch.testing.assert_close(att.q_norm.weight, torch.ones(16, dtype=torch.float64))
        other = {**config.to_dict(), "use_qk_norm": False}
        plain = attention_from_llama(layer.state_dict(), other, layer=0)
        x = torch.randn(1, T, WIDTH, dtype=torch.float64)
        with torch.no_grad():
            assert float((att(x) - plain(x)).abs().max()) > 1e-3
    nope = attention_from_llama(layer.state_dict(), config, layer=3)  # NoPE: no norm
    assert nope.spec.qk_norm is None


def test_the_temperature_changes_llama4s_nope_layer(transformers: ModuleType,
                                                    monkeypatch: Any) -> None:  # fmt: skip
    """The tuning is not a no-op at these lengths: without it the outputs differ."""
    layer, config, _ = hf_layer(transformers, "llama4", 3, monkeypatch)
    att = attention_from_llama(layer.state_dict(), config, layer=3)
    plain = attention_from_llama(layer.state_dict(), {**config.to_dict(),
                                                      "attn_temperature_tuning": False}, layer=3)  # fmt: skip
    x = torch.randn(1, T, WIDTH, dtype=torch.float64)
    with torch.no_grad():
        assert float((att(x) - plain(x)).abs().max()) > 1e-3


def test_interleaved_rows_are_permuted_not_copied(transformers: ModuleType,
                                                  monkeypatch: Any) -> None:  # fmt: skip
    """Loaded as Llama's (no permutation), Helium's layer computes something else."""
    layer, config, _ = hf_layer(transformers, "helium", 0, monkeypatch)
    as_llama = {**config.to_dict(), "model_type": "llama"}
    att = attention_from_llama(layer.state_dict(), as_llama, layer=0)
    x = torch.randn(1, T, WIDTH, dtype=torch.float64)
    positions = torch.arange(T)[None]
    with torch.no_grad():
        wrong = att(x, positions=positions)
    theirs = hf_forward(layer, "helium", x, positions, None, None)
    assert float((wrong - theirs).abs().max()) > 1e-2


REFUSED = {
    "cohere qk norm": ("cohere", {"use_qk_norm": True}, r"CohereConfig sets use_qk_norm=True"),
}  # fmt: skip


@pytest.mark.parametrize(("family", "settings", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_a_setting_it_does_not_apply_is_refused_by_name(
    transformers: ModuleType, monkeypatch: Any, family: str, settings: dict[str, Any],
    message: str,
) -> None:  # fmt: skip
    config_name, _, extra, _ = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**TINY, **extra, **settings})
    state = {f"{n}_proj.weight": torch.randn(32 if n in "kv" else 64, 64) for n in "qkvo"}
    for layer_idx in range(TINY["num_hidden_layers"]):
        with pytest.raises(ValueError, match=message):
            attention_from_llama(state, config, layer=layer_idx)


BASE = {"hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 64}
STATE = {f"{n}_proj.weight": torch.randn(32, 32) for n in "qkvo"}


@pytest.mark.parametrize(
    ("setting", "named"),
    [({"use_attention_gate": True}, r"config sets use_attention_gate=True, which"),
     ({"sliding_window_pattern": 6}, r"sets sliding_window_pattern=6"),
     ({"qk_layernorm": True, "rope_interleave": True}, r"sets qk_layernorm=True, rope_interleave=True")],
)  # fmt: skip
def test_an_unknown_attention_setting_is_refused(setting: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        attention_from_llama(STATE, {**BASE, **setting})
    off = {key: False for key in setting}  # switched off: nothing to apply
    assert attention_from_llama(STATE, {**BASE, **off}).rope


def test_settings_of_the_rest_of_the_model_are_not_refused() -> None:
    """The feed-forward, the vocabulary, the norms: whatever their values, and unknown ones
    whose names say nothing of attention."""
    rest = {"vocab_size": 7, "intermediate_size": 3, "mlp_bias": True, "rms_norm_eps": 0.1,
            "logit_scale": 0.5, "final_logit_softcapping": 30.0, "num_local_experts": 16,
            "output_attentions": True, "some_new_ffn_width": 12}  # fmt: skip
    assert attention_from_llama(STATE, {**BASE, **rest}).num_heads == 4


def test_nope_layers_from_the_interval_alone() -> None:
    """A `config.json` with `no_rope_layer_interval` but no list: every n-th layer has none."""
    config = {**BASE, "num_hidden_layers": 6, "no_rope_layer_interval": 3}
    ropes = [attention_from_llama(STATE, config, layer=i).rope for i in range(6)]
    assert ropes == [True, True, False, True, True, False]
    with pytest.raises(ValueError, match=r"layers attend differently \(no_rope_layers: \[0, 1\]\)"):
        attention_from_llama(STATE, config)
    with pytest.raises(TypeError, match=r"no_rope_layers must be a list of 1 \(RoPE\) and 0"):
        attention_from_llama(STATE, {**BASE, "no_rope_layers": [1, 2]})


def test_gpt2_unsupported_asks_each_attention_what_it_computes() -> None:
    """A prefix-LM GPT is no GPT-2: refused by name, as RoPE and grouped heads are."""
    cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": True}  # fmt: skip
    assert gpt2_unsupported(GPTModel(cfg)) == []
    model = GPTModel(cfg)
    for block in model.trf_blocks:  # each block's attention a prefix-LM
        block.att = MultiHeadAttention(32, 32, 16, 0.0, 4, qkv_bias=True, mask=prefix_lm(3))
    assert model.trf_blocks[0].att.rule != causal()
    assert gpt2_unsupported(model) == ["the mask causal() | prefix(3) (GPT-2's: causal())"]
    with pytest.raises(ValueError, match=r"this model uses the mask causal\(\) \| prefix\(3\)"):
        gpt2_to_hf(model)
    block = model.trf_blocks[1]
    block.att = MultiHeadAttention(32, 32, 16, 0.0, 4, qkv_bias=True, scale=0.5,
                                   score_mods=[softcap(5.0)], sink_logit=True)  # fmt: skip
    assert gpt2_unsupported(model)[1:] == [
        "sink logits (sink_logit)",
        "score modifiers [softcap(5)]",
        "a scale of its own (scale=0.5)",
    ]
