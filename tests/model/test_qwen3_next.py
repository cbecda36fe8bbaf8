"""A whole Qwen3-Next (dense feed-forward) from transformers: Gated DeltaNet layers, three in
four, and softmax layers with QK-norm, partial RoPE and an output gate, in one `LlamaModel`.

Built tiny by transformers' own classes, float64, every weight random. transformers runs its
torch fallbacks (no flash-linear-attention, no causal-conv1d) and casts to float32 in places;
`float64_casts(tensor_float=True)` keeps those in float64, so both sides agree to rounding.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

import attention
from attention.layer.gated_delta import GatedDeltaNet, GatedDeltaState
from attention.layer.multihead import MultiHeadAttention
from attention.model.llama_block import LlamaModel
from tests.float64 import float64_casts

# transformers' Qwen3-Next modules take about 7 s to import in a fresh process
SLOW = pytest.mark.slow(seconds=3)

EXACT = {"rtol": 0.0, "atol": 1e-10}
VOCAB, B, T = 50, 2, 9


@pytest.fixture
def transformers() -> ModuleType:
    return pytest.importorskip("transformers", minversion="5.24")


def tiny(transformers: ModuleType, **settings: Any) -> Any:
    """transformers' tiny `Qwen3NextForCausalLM`, float64, eval, every weight random."""
    config = transformers.Qwen3NextConfig(**{
        "hidden_size": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 6, "linear_conv_kernel_dim": 4,
        "num_hidden_layers": 4, "vocab_size": VOCAB, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "num_experts": 0,
        "max_position_embeddings": 64, "pad_token_id": None, "bos_token_id": None,
        "eos_token_id": None, **settings})  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3NextForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "A_log" not in name:  # keep the decay's rates as initialised
                param.copy_(torch.randn_like(param) * 0.3)
    return model


def ids(seed: int = 1) -> Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@SLOW
def test_its_layers_are_read_as_qwen3_next_lays_them_out(transformers: ModuleType) -> None:
    ours = attention.from_hf(tiny(transformers))
    assert isinstance(ours, LlamaModel)
    kinds = [type(block.att).__name__ for block in ours.blocks]
    assert kinds == ["GatedDeltaNet"] * 3 + ["MultiHeadAttention"]  # the 3:1 of layer_types
    softmax = ours.blocks[3].att
    assert isinstance(softmax, MultiHeadAttention) and softmax.W_gate is not None
    assert softmax.spec.qk_norm == "head" and softmax.rotary is not None
    assert softmax.rotary.dim == 2  # partial_rotary_factor 0.25 of head_dim 8


@SLOW
def test_equal_to_transformers_prefill_decode_and_positions(transformers: ModuleType) -> None:
    theirs = tiny(transformers)
    tokens = ids()
    with torch.no_grad(), float64_casts(tensor_float=True):
        ours = attention.from_hf(theirs)
        assert_close(ours(tokens), theirs(tokens).logits, **EXACT)
        # the prompt, then one token at a time: our caches against transformers' cache
        caches, cache = ours.init_caches(B), transformers.DynamicCache(config=theirs.config)
        prompt = tokens[:, :5]
        assert_close(ours(prompt, caches), theirs(prompt, cache=cache, use_cache=True).logits,
                     **EXACT)  # fmt: skip
        for t in range(5, T):
            step = tokens[:, t : t + 1]
            assert_close(ours(step, caches),
                         theirs(step, cache=cache, use_cache=True).logits, **EXACT)  # fmt: skip
        # positions other than 0..T-1 (the softmax layer's RoPE reads them)
        positions = torch.arange(T).expand(B, T) + torch.tensor([[7], [20]])
        assert_close(ours.logits(tokens, positions=positions),
                     theirs(tokens, position_ids=positions).logits, **EXACT)  # fmt: skip
    assert [type(c).__name__ for c in caches] == ["GatedDeltaState"] * 3 + ["KVCache"]
    assert all(c.length == T for c in caches)


@SLOW
def test_the_linear_layers_cache_does_not_grow(transformers: ModuleType) -> None:
    ours = attention.from_hf(tiny(transformers))
    caches, sizes = ours.init_caches(1), []
    with torch.no_grad():
        for chunk in (ids()[:1, :2], ids()[:1, 2:], ids(2)[:1, :1]):
            ours(chunk, caches)
            sizes.append([c.nbytes for c in caches[:3] if isinstance(c, GatedDeltaState)])
    assert sizes[0] == sizes[1] == sizes[2] and len(sizes[0]) == 3


@SLOW
def test_a_left_padded_batch_writes_each_rows_tokens(transformers: ModuleType) -> None:
    """Left padding read as zeros leaves each Gated DeltaNet state empty (transformers' rule):
    each row of a padded batch gets transformers' greedy tokens for that row alone."""
    with torch.no_grad(), float64_casts(tensor_float=True):
        theirs = tiny(transformers)
        ours = attention.from_hf(theirs)
        mask = torch.ones(B, 6, dtype=torch.long)
        mask[1, :3] = 0
        prompt = ids()[:, :6].masked_fill(mask == 0, 0)
        tokens = attention.generate(ours, prompt, 5, attention_mask=mask)[:, 6:]
        for row in range(B):
            alone = prompt[row : row + 1, mask[row] == 1]
            want = theirs.generate(alone, max_new_tokens=5, do_sample=False)[0, alone.shape[1] :]
            assert torch.equal(tokens[row], want), row
        # the padded row, then three decode steps, against the row alone: the softmax
        # layer's positions come from its own cache, which counts each row's real tokens
        batch, alone = ours.init_caches(B), ours.init_caches(1)
        padded_logits = ours(prompt, batch, attention_mask=mask)[1, 3:]
        assert_close(padded_logits, ours(prompt[1:, 3:], alone)[0], **EXACT)
        for token in tokens[1, :3].tolist():
            step = torch.tensor([[token]])
            assert_close(ours(step.expand(B, 1), batch)[1], ours(step, alone)[0], **EXACT)


@SLOW
def test_generation_cached_equals_uncached_and_refills(transformers: ModuleType) -> None:
    ours = attention.from_hf(tiny(transformers))
    prompt = ids()[:, :4]
    cached = attention.generate(ours, prompt, max_new_tokens=6, context_size=6)
    uncached = attention.generate(ours, prompt, max_new_tokens=6, context_size=6,
                                  use_cache=False)  # fmt: skip
    assert torch.equal(cached, uncached)  # integer tokens: the same argmax both ways


@SLOW
def test_what_a_linear_layer_does_not_take_is_refused_by_name(transformers: ModuleType) -> None:
    ours = attention.from_hf(tiny(transformers))
    tokens = ids()
    right = torch.ones_like(tokens)
    right[0, -2:] = 0  # padding after a token: the state would fade over it
    with pytest.raises(
        NotImplementedError, match=r"padding only on the left .* got padding after a token"
    ):
        ours(tokens, attention_mask=right)
    caches = ours.init_caches(B)
    ours(tokens[:, :3], caches)
    left = torch.ones_like(tokens[:, 3:])
    left[0, 0] = 0
    with pytest.raises(NotImplementedError, match="got padding in a later chunk"):
        ours(tokens[:, 3:], caches, attention_mask=left)
    assert [c.length for c in caches] == [3] * 4  # the refused chunk changed no cache
    with pytest.raises(NotImplementedError, match="GatedDeltaNet layer has no softmax weights"):
        ours.attention_weights(tokens)
    with pytest.raises(ValueError, match="static=True: this model has a linear-attention layer"):
        attention.generate(ours, tokens[:, :3], max_new_tokens=2, static=True)
    caches = ours.init_caches(B)
    caches[0], caches[3] = caches[3], caches[0]  # each layer's cache in another's place
    with pytest.raises(TypeError, match="cache must be this GatedDeltaNet layer's GatedDeltaState"):
        ours(tokens, caches)
    caches = ours.init_caches(B)
    caches[1] = ours.blocks[1].att.init_cache(B + 1)  # type: ignore[operator]
    with pytest.raises(
        ValueError, match=r"state.conv must have shape \(2, 56, 3\), got \(3, 56, 3\)"
    ):
        ours(tokens, caches)


@SLOW
def test_a_mixture_of_experts_of_another_layout_is_refused_by_name(
    transformers: ModuleType,
) -> None:
    theirs = tiny(transformers, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
                  shared_expert_intermediate_size=8)  # fmt: skip
    mlp = theirs.model.layers[0].mlp  # experts under a name from_hf does not know
    mlp.routed_experts = mlp.experts
    del mlp.experts
    with pytest.raises(ValueError, match=r"layer 0's feed-forward Qwen3NextSparseMoeBlock has "
                       r"\['gate', 'routed_experts', 'shared_expert', 'shared_expert_gate'\]: a "
                       "mixture of experts from_hf does not build"):  # fmt: skip
        attention.from_hf(theirs)


@SLOW
def test_a_gated_layer_loads_alone_and_is_not_exported_as_llama(transformers: ModuleType) -> None:
    theirs = tiny(transformers)
    state = {k: v for k, v in theirs.state_dict().items() if ".layers.3.self_attn." in k}
    att = attention.model.llama.attention_from_llama(state, theirs.config,
                                                     prefix="model.layers.3.self_attn.", layer=3)  # fmt: skip
    assert att.W_gate is not None
    q_rows = state["model.layers.3.self_attn.q_proj.weight"].unflatten(0, (4, 2, 8))
    assert torch.equal(att.W_gate.weight, q_rows[:, 1].flatten(0, 1))  # each head's second half
    with pytest.raises(ValueError, match=r"att has .*an output gate \(output_gate\)"):
        attention.model.llama.attention_to_llama(att)
    assert isinstance(attention.from_hf(theirs.model.layers[0].linear_attn), GatedDeltaNet)


def test_a_refused_chunk_leaves_every_cache_as_it_was() -> None:
    """A softmax layer before a linear one: padding after a token is refused before the first
    layer's cache takes the chunk."""
    torch.manual_seed(0)
    linear = GatedDeltaNet(16, num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=8)
    cfg = {"vocab_size": VOCAB, "context_length": 16, "emb_dim": 16, "hidden_dim": 32,
           "n_layers": 2, "layers": [{"num_heads": 2, "rope": True}, linear]}  # fmt: skip
    model = LlamaModel(cfg).eval()
    caches = model.init_caches(1)
    tokens = ids()[:1, :4]
    mask = torch.ones_like(tokens)
    mask[0, 2] = 0
    with pytest.raises(NotImplementedError, match="padding only on the left"):
        model(tokens, caches, attention_mask=mask)
    assert [cache.length for cache in caches] == [0, 0]
    with torch.no_grad():
        assert_close(model(tokens, caches), model(tokens), rtol=0, atol=1e-5)
