"""Hugging Face's GPT-2 holding the book's weights (`attention_bench.hf`): the same model.

The generation benchmark times both on the same weights; these tests check that they are the
same model: the same logits, and the same greedy tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attention.model.generation import generate
from attention.model.gpt import GPT_CONFIG_124M, GPTModel
from attention_bench.hf import hf_generate, to_hf_gpt2

pytest.importorskip("transformers", minversion="5.24")  # 5.24 names the cache `cache=`

SMALL = {"vocab_size": 96, "context_length": 48, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
         "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip


def _pair(cfg: dict[str, Any], dtype: torch.dtype = torch.float32) -> tuple[GPTModel, Any]:
    torch.manual_seed(0)
    model = GPTModel(cfg).to(dtype).eval()
    return model, to_hf_gpt2(model)


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["float32", "float64"]
)
def test_same_logits_as_ours_on_a_small_model(
    qkv_bias: bool, dtype: torch.dtype, tol: float
) -> None:
    model, hf = _pair({**SMALL, "qkv_bias": qkv_bias}, dtype)
    assert hf.dtype == dtype and not hf.training
    assert hf.config._attn_implementation == "sdpa"
    assert hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()  # untied
    ids = torch.randint(0, SMALL["vocab_size"], (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=tol, rtol=tol)


@pytest.mark.heavy(seconds=7)  # two 124M models; the small shapes above run in `tests`
def test_same_logits_as_ours_at_the_124m_shape() -> None:
    model, hf = _pair({**GPT_CONFIG_124M, "drop_rate": 0.0})
    n_params = sum(p.numel() for p in model.parameters())
    hf_params = sum(p.numel() for p in hf.parameters())
    # the same weights, plus the zero query/key/value biases HF's fused c_attn always has
    assert hf_params - n_params == 12 * 3 * 768
    ids = torch.randint(0, GPT_CONFIG_124M["vocab_size"], (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_generation_writes_the_same_tokens(batch: int) -> None:
    model, hf = _pair(SMALL)
    prompt = torch.randint(0, SMALL["vocab_size"], (batch, 8))
    ours = generate(model, prompt, 24)
    theirs = hf_generate(hf, prompt, 24)
    assert theirs.shape == (batch, 8 + 24)
    assert torch.equal(theirs, ours)  # greedy: the same argmax at every step


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"rope_base": 10000.0}, "rotary positions"),
        ({"n_kv_heads": 2}, "grouped-query attention"),
        ({"window": 8}, "a sliding window"),
    ],
)
def test_only_the_plain_gpt2_configuration(extra: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=f"plain GPT-2 configuration only; .*{named}"):
        to_hf_gpt2(GPTModel({**SMALL, **extra}))
