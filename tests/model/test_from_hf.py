"""Whole Llama-family models from transformers: `attention.from_hf`, logits and greedy tokens.

Each family is built tiny (2 layers, width 64) by transformers' own classes and configs, in
float64, with random norm gains. transformers computes RoPE's angles (and Gemma's norms) in
float32 whatever the model's dtype; `exact` points its `torch.float` / `torch.float32` at
float64 and runs Gemma's norm in the input's dtype, so that both sides evaluate the same
formulas in float64 and agree to 1e-10.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor

import attention
from attention.model.llama_block import LlamaModel
from tests.float64 import float64_casts

VOCAB = 100
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": VOCAB,
        "max_position_embeddings": 64, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None}  # fmt: skip

LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16,
           "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": 10000.0}  # fmt: skip
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "rope_theta": 10000.0}  # fmt: skip

# family: (transformers' class prefix, settings)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama 3.1": ("Llama", {"rope_parameters": LLAMA31}),
    "qwen3": ("Qwen3", {}),
    "olmo2": ("Olmo2", {}),
    "gemma3": ("Gemma3", {"layer_types": ["sliding_attention", "full_attention"],
                          "sliding_window": 4, "query_pre_attn_scalar": 24,
                          "rope_parameters": {
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
    "smollm3": ("SmolLM3", {"no_rope_layers": [1, 0]}),
    "mistral yarn": ("Mistral", {"sliding_window": 5, "rope_parameters": YARN}),
}  # fmt: skip


@pytest.fixture
def transformers() -> ModuleType:
    return pytest.importorskip("transformers", minversion="5.24")


def _gemma_norm(self: Any, x: Tensor) -> Tensor:
    """Gemma's RMSNorm without its float32 cast."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


@contextmanager
def exact(monkeypatch: Any) -> Iterator[None]:
    """transformers' float32 casts made float64 and Gemma's norm in the input's dtype, for the
    duration."""
    from transformers.models.gemma3 import modeling_gemma3

    monkeypatch.setattr(modeling_gemma3.Gemma3RMSNorm, "forward", _gemma_norm)
    with float64_casts():
        yield


def hf_model(transformers: ModuleType, family: str, **settings: Any) -> Any:
    """transformers' tiny `*ForCausalLM` of `family`, float64, eval, random norm gains."""
    prefix, extra = FAMILIES[family]
    config_class = getattr(transformers, f"{prefix}TextConfig" if prefix == "Gemma3"
                           else f"{prefix}Config")  # fmt: skip
    config = config_class(**{**TINY, **extra, **settings})
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config).double().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # Gemma's gains are 1 + g: around 0 there, 1 elsewhere
                param.normal_(0.0 if prefix == "Gemma3" else 1.0, 0.2)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_transformers(transformers: ModuleType, monkeypatch: Any,
                                   family: str) -> None:  # fmt: skip
    with exact(monkeypatch):
        theirs_model = hf_model(transformers, family)
        model = attention.from_hf(theirs_model)
        ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            theirs = theirs_model(ids).logits
            ours = model(ids)
    assert isinstance(model, LlamaModel) and isinstance(model, attention.GPTModel)
    assert ours.dtype == torch.float64 and ours.shape == (2, 20, VOCAB)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    assert float(theirs.std()) > 0.1  # logits that say something


def _padded(ids: Tensor, pads: int) -> tuple[Tensor, Tensor]:
    """Row 1 of `ids` with its first `pads` tokens replaced by left padding, and the mask."""
    mask = torch.ones_like(ids)
    mask[1, :pads] = 0
    return ids.masked_fill(mask == 0, 0), mask


GENERATING = [  # one fast family; the others, each a few seconds of transformers' generate
    family if family == "qwen3" else pytest.param(family, marks=pytest.mark.heavy(seconds=4))
    for family in FAMILIES
]


@pytest.mark.parametrize("family", GENERATING)
def test_greedy_generation_writes_transformers_tokens(transformers: ModuleType, monkeypatch: Any,
                                                      family: str) -> None:  # fmt: skip
    """Cached, and a left-padded batch (windows longer than the padding: transformers' windows
    count padding, this package's count tokens)."""
    with exact(monkeypatch):
        theirs_model = hf_model(transformers, family)
        model = attention.from_hf(theirs_model)
        ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
        prompt, mask = _padded(ids, 0 if "window" in str(FAMILIES[family][1]) else 3)
        theirs = theirs_model.generate(prompt, attention_mask=mask, max_new_tokens=10,
                                       do_sample=False, pad_token_id=0)  # fmt: skip
        ours = attention.generate(model, prompt, 10, attention_mask=mask)
        alone = attention.generate(model, ids[:1], 10)  # unpadded, cached
        uncached = attention.generate(model, ids[:1], 10, use_cache=False)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(alone, theirs[:1], rtol=0, atol=0)
    torch.testing.assert_close(uncached, alone, rtol=0, atol=0)


def _tiny(transformers: ModuleType, prefix: str, **settings: Any) -> Any:
    config = getattr(transformers, f"{prefix}Config")(**{**TINY, **settings})
    return getattr(transformers, f"{prefix}ForCausalLM")(config).eval()


@pytest.mark.parametrize(
    ("prefix", "settings", "named"),
    [
        ("Llama", {"mlp_bias": True}, "mlp_bias=True"),
        ("Llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                       "original_max_position_embeddings": 16,
                                       "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
         "rope_type='longrope'"),
        ("Granite", {"embedding_multiplier": 12.0}, "embedding_multiplier=12.0"),
        ("Cohere", {"logit_scale": 1.0}, "CohereLayerNorm computes neither"),
    ],
)  # fmt: skip
def test_what_it_does_not_apply_is_refused_by_name(transformers: ModuleType, prefix: str,
                                                   settings: dict[str, Any],
                                                   named: str) -> None:  # fmt: skip
    with pytest.raises(ValueError, match=named):
        attention.from_hf(_tiny(transformers, prefix, **settings))


def test_logits_that_differ_on_the_probe_are_refused(transformers: ModuleType) -> None:
    """A change no setting states (here a hook on the head) is caught by the probe."""
    model = _tiny(transformers, "Llama")
    model.lm_head.register_forward_hook(lambda module, args, out: out + 1.0)
    with pytest.raises(ValueError, match="logits differ from transformers'"):
        attention.from_hf(model)
    assert attention.from_hf(model, check=False).vocab_size == VOCAB


def test_not_a_transformers_model_is_refused() -> None:
    with pytest.raises(TypeError, match="hf_model must be a transformers"):
        attention.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="check must be True or False, got 'no'"):
        attention.from_hf(torch.nn.Linear(2, 2), check="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_heads_wider_than_the_model(transformers: ModuleType, monkeypatch: Any,
                                    family: str) -> None:  # fmt: skip
    """Qwen3's and Gemma 3's published shapes: h d_h = 4 * 32 = 128 heads' width, 64 model."""
    with exact(monkeypatch):
        theirs_model = hf_model(transformers, family, head_dim=32)
        model = attention.from_hf(theirs_model)
        ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            theirs, ours = theirs_model(ids).logits, model(ids)
    att = model.blocks[0].att
    assert (att.d_in, att.d_out, att.out_features) == (64, 128, 64)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
