"""Multi-head latent attention: naive = absorbed = uncached = cached, and equal to transformers'.

Every comparison is in float64 at 1e-10. transformers' `DeepseekV3Attention` is built tiny from
`DeepseekV3Config`, with its RMSNorm's float32 cast patched out and RoPE's angles given in
float64 (transformers computes them in float32): the same formulas, at full precision.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from attention import MultiHeadAttention
from attention.layer.latent import MultiHeadLatentAttention, yarn_softmax_factor
from attention.layer.masks import causal, documents, window
from attention.layer.score_mods import ScoreMod
from attention.layer.softcap import softcap
from attention.layer.testing import padding_mask
from tests.float64 import exact_rms_norm, hf_rope_angles

D_IN, H, R, D_N, D_R, D_V, T = 32, 4, 8, 6, 4, 5, 9
EXACT = {"atol": 1e-10, "rtol": 0.0}


def mla(q_lora_rank: int | None = 12, seed: int = 0, **options: Any) -> MultiHeadLatentAttention:
    """A tiny float64 layer with random norms (so that a misplaced one shows)."""
    torch.manual_seed(seed)
    layer = MultiHeadLatentAttention(
        D_IN, H, 32, kv_lora_rank=R, qk_nope_head_dim=D_N, qk_rope_head_dim=D_R,
        v_head_dim=D_V, q_lora_rank=q_lora_rank, **options,
    ).double().eval()  # fmt: skip
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if "layernorm" in name or name.endswith("bias"):
                param.normal_()
    return layer


def both(layer: MultiHeadLatentAttention, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The layer's call computed naive and absorbed."""
    results = []
    for absorb in (False, True):
        layer.absorb = absorb
        with torch.no_grad():
            results.append(layer(*args, **kwargs))
    return results[0], results[1]


def inputs(batch: int = 2, num_tokens: int = T, seed: int = 1) -> Tensor:
    return torch.randn(batch, num_tokens, D_IN, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)  # fmt: skip


@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("options", [
    {}, {"window": 3, "sinks": 1}, {"score_mods": [softcap(0.5)]}, {"causal": False},
    {"mask": causal() & documents(torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2]))},
])  # fmt: skip
def test_absorbed_equals_naive(q_lora_rank: int | None, options: dict[str, Any]) -> None:
    """Folding W_UK into the query and W_UV after the sum changes no output and no weight."""
    layer = mla(q_lora_rank, **options)
    x = inputs()
    naive, absorbed = both(layer, x, need_weights=True)
    assert naive[0].shape == (2, T, D_IN) and naive[1].shape == (2, H, T, T)
    assert_close(absorbed[0], naive[0], **EXACT)
    assert_close(absorbed[1], naive[1], **EXACT)
    fused = both(layer, x)  # the fused kernel's path, not the explicit one
    assert_close(fused[0], naive[0], **EXACT)
    assert_close(fused[1], naive[0], **EXACT)


def test_naive_is_attention_over_expanded_heads() -> None:
    """The naive path is the definition: keys [W_UK c; k_R] and values W_UV c per head, the
    scale 1/sqrt(d_N + d_R), a causal softmax; written out here by hand."""
    layer = mla()
    x = inputs(batch=1)
    with torch.no_grad():
        q_nope, q_rope, latent, k_rope = layer.project(x)
        w = layer.kv_b_proj.weight.view(H, D_N + D_V, R)
        kv = torch.einsum("tr,hdr->htd", latent[0, 0], w)  # (h, T, d_N + d_V)
        keys = torch.cat((kv[..., :D_N], k_rope[0].expand(H, T, D_R)), -1)
        query = torch.cat((q_nope[0], q_rope[0]), -1)
        scores = query @ keys.transpose(-1, -2) / math.sqrt(D_N + D_R)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
        context = scores.softmax(-1) @ kv[..., D_N:]  # (h, T, d_V)
        expected = layer.o_proj(context.transpose(0, 1).reshape(1, T, H * D_V))
    for out in both(layer, x):
        assert_close(out, expected, **EXACT)


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("options", [{}, {"window": 4, "sinks": 1}])
def test_cached_equals_uncached(absorb: bool, options: dict[str, Any]) -> None:
    """A prefill of 5 tokens, then one token at a time: what one call over all of them gives."""
    layer = mla(absorb=absorb, **options)
    x = inputs(num_tokens=T)
    cache = layer.init_cache(batch_size=2, max_tokens=T)
    with torch.no_grad():
        full = layer(x)
        parts = [layer(x[:, :5], cache=cache)]
        parts += [layer(x[:, t : t + 1], cache=cache) for t in range(5, T)]
    assert_close(torch.cat(parts, dim=1), full, **EXACT)
    assert cache.length == T


@pytest.mark.parametrize("absorb", [False, True])
def test_padded_batch_cached(absorb: bool) -> None:
    """Left padding: each row's real tokens, uncached and cached, give what the row alone does,
    and positions other than 0 .. T - 1 move RoPE, not the result's equality."""
    layer = mla(absorb=absorb)
    x = inputs(num_tokens=T)
    pad = padding_mask([T, T - 3], T, side="left")  # row 1: 3 padding tokens first
    with torch.no_grad():
        alone = [layer(x[:1]), layer(x[1:, 3:])]
        uncached = layer(x, pad)
        cache = layer.init_cache(batch_size=2, max_tokens=T + 3)
        prefill = layer(x[:, :6], pad[:, :6], cache=cache)
        steps = [layer(x[:, t : t + 1], cache=cache) for t in range(6, T)]
    cached = torch.cat([prefill, *steps], dim=1)
    for out in (uncached, cached):
        assert_close(out[:1], alone[0], **EXACT)
        assert_close(out[1:, 3:], alone[1], **EXACT)
    assert cache.positions[1, : T - 3].tolist() == list(range(T - 3))  # padding not stored


def test_cache_holds_the_latent_and_the_rope_key() -> None:
    """Per token and layer the cache holds kv_lora_rank + qk_rope_head_dim numbers, measured
    from its tensors; naive and absorbed write the same ones."""
    layer = mla()
    x = inputs()
    caches = []
    for absorb in (False, True):
        layer.absorb = absorb
        cache = layer.init_cache(batch_size=2, max_tokens=T)
        with torch.no_grad():
            layer(x, cache=cache)
        caches.append(cache)
    naive, absorbed = caches
    slots = naive.batch_size * naive.slots
    assert (naive.keys.numel() + naive.values.numel()) / slots == R + D_R
    assert naive.nbytes == 2 * T * (R + D_R) * 8  # float64
    assert naive.keys.shape == (2, 1, T, D_R) and naive.values.shape == (2, 1, T, R)
    assert_close(absorbed.keys, naive.keys, **EXACT)
    assert_close(absorbed.values, naive.values, **EXACT)
    with torch.no_grad():
        _, _, latent, k_rope = layer.project(x)
    assert_close(naive.values, latent, **EXACT)  # the latent itself, never expanded
    assert_close(naive.keys, k_rope, **EXACT)


def test_score_mods_see_positions() -> None:
    """A score modifier reads the same (b, h, q, kv) on both paths, at given positions."""

    def slope(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return -0.1 * (h + 1) * (q - kv).abs()

    bias = ScoreMod(lambda s, b, h, q, kv: s + slope(b, h, q, kv), name="slope", bias=slope)
    layer = mla(score_mods=[bias])
    x = inputs()
    positions = torch.arange(T).repeat(2, 1) + torch.tensor([[0], [7]])
    naive, absorbed = both(layer, x, positions=positions)
    assert_close(absorbed, naive, **EXACT)
    plain = mla()
    with torch.no_grad():
        assert (naive - plain(x, positions=positions)).abs().max() > 1e-3  # it acts


# ---- transformers' DeepseekV3Attention


@pytest.fixture
def deepseek(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """transformers' DeepSeek-V3 modeling module, its RMSNorm without the float32 cast."""
    pytest.importorskip("transformers", minversion="5.24")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as module

    exact_rms_norm(module.DeepseekV3RMSNorm, monkeypatch)
    return module


def hf_attention(module: ModuleType, q_lora_rank: int | None, **settings: Any) -> Any:
    return tiny_hf_layer(module, "DeepseekV3", q_lora_rank=q_lora_rank, **settings)


def tiny_hf_layer(module: ModuleType, family: str, **settings: Any) -> Any:
    """transformers' `{family}Attention`, tiny, float64, this file's widths; its norms' gains
    and the biases drawn at random, so that a wrong one shows (they start at 1 and 0)."""
    import transformers

    config = getattr(transformers, f"{family}Config")(
        hidden_size=D_IN, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=R,
        qk_nope_head_dim=D_N, qk_rope_head_dim=D_R, v_head_dim=D_V, num_hidden_layers=1,
        vocab_size=10, intermediate_size=16, moe_intermediate_size=8,
        pad_token_id=None, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa",
        **settings,
    )  # fmt: skip
    torch.manual_seed(3)
    layer = getattr(module, f"{family}Attention")(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.normal_()
    return layer


def angles(positions: Tensor, base: float) -> tuple[Tensor, Tensor]:
    """RoPE's (cos, sin) as transformers lays them out, in float64."""
    return hf_rope_angles(positions, base, D_R)


def from_hf(hf: Any, **options: Any) -> MultiHeadLatentAttention:
    config = hf.config
    layer = MultiHeadLatentAttention(
        D_IN, H, 32, kv_lora_rank=R, qk_nope_head_dim=D_N, qk_rope_head_dim=D_R,
        v_head_dim=D_V, q_lora_rank=config.q_lora_rank, qkv_bias=config.attention_bias,
        rope_base=config.rope_parameters["rope_theta"], rope_interleave=config.rope_interleave,
        norm_eps=config.rms_norm_eps, **options,
    ).double().eval()  # fmt: skip
    layer.load_state_dict(hf.state_dict(), strict=True)
    return layer


@pytest.mark.parametrize("q_lora_rank", [None, 12])
@pytest.mark.parametrize("interleave", [True, False])
def test_equals_transformers(deepseek: ModuleType, q_lora_rank: int | None,
                             interleave: bool) -> None:  # fmt: skip
    """The same weights give transformers' outputs, naive and absorbed, at positions from 0
    and from elsewhere (a different offset per row)."""
    hf = hf_attention(deepseek, q_lora_rank, rope_interleave=interleave, attention_bias=True)
    layer = from_hf(hf)
    x = inputs()
    causal_mask = torch.zeros(T, T, dtype=torch.float64)
    causal_mask = causal_mask.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    for offset in (torch.tensor([[0], [0]]), torch.tensor([[3], [11]])):
        positions = torch.arange(T).repeat(2, 1) + offset
        with torch.no_grad():
            theirs = hf(x, position_embeddings=angles(positions, layer.rotary.base),
                        attention_mask=causal_mask[None, None])[0]  # fmt: skip
        for ours in both(layer, x, positions=positions):
            assert_close(ours, theirs, **EXACT)


def test_yarn_softmax_factor_equals_transformers(deepseek: ModuleType) -> None:
    """DeepSeek-V3's YaRN factor on the softmax, and a layer given it and the angles (as a model
    with YaRN's frequencies would), equal transformers' layer with that rope scaling."""
    yarn = {"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0, "mscale": 1.0,
            "original_max_position_embeddings": 4, "beta_fast": 32, "beta_slow": 1,
            "rope_theta": 10000.0}  # fmt: skip
    factor = yarn_softmax_factor(40.0, 1.0)
    assert factor == pytest.approx(deepseek.yarn_apply_mscale(yarn, 1.0), rel=1e-15)
    assert yarn_softmax_factor(1.0, 1.0) == yarn_softmax_factor(40.0, 0.0) == 1.0
    hf = hf_attention(deepseek, 12, rope_parameters=yarn, max_position_embeddings=160)
    assert hf.scaling == pytest.approx(factor / math.sqrt(D_N + D_R), rel=1e-15)
    layer = from_hf(hf, softmax_factor=factor)
    x = inputs()
    positions = torch.arange(T).repeat(2, 1)
    cos, sin = angles(positions * 0.37, 10000.0)  # any angles: the layer takes them as given
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)  # fmt: skip
    with torch.no_grad():
        theirs = hf(x, position_embeddings=(cos, sin), attention_mask=mask[None, None])[0]
    for ours in both(layer, x, angles=(cos[:, None], sin[:, None])):
        assert_close(ours, theirs, **EXACT)


# ---- bad input


@pytest.mark.parametrize(("change", "error", "match"), [
    ({"qk_rope_head_dim": 3}, ValueError, r"qk_rope_head_dim must be even .*, got 3"),
    ({"kv_lora_rank": 0}, ValueError, r"kv_lora_rank"),
    ({"q_lora_rank": 2.0}, TypeError, r"q_lora_rank"),
    ({"v_head_dim": None}, TypeError, r"v_head_dim"),
    ({"softmax_factor": -1.0}, ValueError, r"softmax_factor must be a finite number > 0"),
    ({"rope_interleave": "yes"}, TypeError, r"rope_interleave must be True or False"),
    ({"window": 3, "mask": causal()}, ValueError, r"pass mask= or window="),
])  # fmt: skip
def test_bad_arguments(change: dict[str, Any], error: type[Exception], match: str) -> None:
    sizes: dict[str, Any] = {"kv_lora_rank": R, "qk_nope_head_dim": D_N,
                             "qk_rope_head_dim": D_R, "v_head_dim": D_V}  # fmt: skip
    with pytest.raises(error, match=match):
        MultiHeadLatentAttention(D_IN, H, 32, **{**sizes, **change})


def test_bad_inputs() -> None:
    layer = mla()
    x = inputs()
    with pytest.raises(ValueError, match=r"d_in"):
        layer(x[..., :-1])
    with pytest.raises(TypeError, match=r"dtype"):
        layer(x.float())
    with pytest.raises(ValueError, match=r"positions must be integers of shape"):
        layer(x, positions=torch.arange(T)[None])
    with pytest.raises(ValueError, match=r"angles must be \(cos, sin\) of shape \(9, 4\) or "
                                         r"\(2 or 1, 1, 9, 4\); got cos \(9, 6\)"):  # fmt: skip
        layer(x, angles=(torch.ones(T, 6), torch.ones(T, 6)))
    cos = torch.ones(1, T, 4)  # transformers' (batch, T, d): its rows would meet the heads
    with pytest.raises(ValueError, match=r"got cos \(1, 9, 4\) and sin \(1, 9, 4\)"):
        layer(x, angles=(cos, cos))
    with pytest.raises(ValueError, match=r"got cos \(9, 4\) and sin \(5, 4\)"):
        layer(x, angles=(torch.ones(T, 4), torch.ones(5, 4)))
    with pytest.raises(TypeError, match=r"need_weights must be True or False"):
        layer(x, need_weights=1)  # type: ignore[call-overload]


def test_caches_of_another_layout_are_refused() -> None:
    """A latent cache and a multi-head one are told apart, even of the same key shape."""
    layer = mla()
    x = inputs()
    with pytest.raises(TypeError, match=r"cache must be a KVCache"):
        layer(x, cache={"keys": None})  # type: ignore[arg-type]
    mha = MultiHeadAttention(D_IN, 2 * D_R, 32, 0.0, num_heads=2, num_kv_heads=1).double()
    assert mha.init_cache(2).keys.shape[1:] == (1, 32, D_R)  # the latent cache's keys' shape
    with pytest.raises(ValueError, match=r"cache was made for .*value_dim=4.*value_dim=8"):
        layer(x, cache=mha.init_cache(2))
    with pytest.raises(ValueError, match=r"cache was made for .*value_dim=8.*value_dim=4"):
        mha(x, cache=layer.init_cache(2))
    windowed = mla(window=4)
    with pytest.raises(ValueError, match=r"cache keeps window=None.*window=4|layout"):
        windowed(x, cache=layer.init_cache(2))
    with pytest.raises(ValueError, match=r"max_tokens=33 is longer than context_length=32"):
        layer.init_cache(2, max_tokens=33)
    with pytest.raises(ValueError, match=r"cache needs a mask that hides the future"):
        mla(causal=False)(x, cache=layer.init_cache(2))


def test_repr_and_window_mask() -> None:
    layer = mla(mask=causal() & window(3))
    assert "kv_lora_rank=8" in repr(layer) and "absorb=False" in repr(layer)
    assert layer.init_cache(1).slots == 3  # a ring of the window
    assert layer.layout is not None and layer.layout[0] == "latent"


def test_published_latent_shapes_match_the_layer() -> None:
    """DeepSeek-V3's and Kimi K2's published widths, built as the layer (on `meta`: no
    numbers): its cache holds `cached_per_token` numbers per token, what the page prints."""
    from attention.model.shapes import LATENT, cached_per_token, kv_cache_bytes

    for shape in LATENT.values():
        with torch.device("meta"):
            layer = MultiHeadLatentAttention(
                shape.d_model, shape.num_heads, 16, kv_lora_rank=shape.kv_lora_rank,
                qk_nope_head_dim=shape.qk_nope_head_dim, qk_rope_head_dim=shape.qk_rope_head_dim,
                v_head_dim=shape.v_head_dim, q_lora_rank=shape.q_lora_rank,
            )  # fmt: skip
        cache = layer.init_cache(batch_size=1, max_tokens=16)
        assert (cache.keys.numel() + cache.values.numel()) // 16 == cached_per_token(shape) == 576
        assert kv_cache_bytes(shape, 10, batch=2) == 2 * 10 * 61 * 576 * 2
    deepseek = LATENT["DeepSeek-V3"]
    assert deepseek.expanded_per_token == 128 * (128 + 64 + 128)


def test_an_empty_batch_or_chunk_gives_empty_outputs() -> None:
    layer = mla()
    for batch, num_tokens in ((0, T), (2, 0)):
        out, weights = layer(inputs(batch, num_tokens), need_weights=True)
        assert out.shape == (batch, num_tokens, D_IN)
        assert weights.shape == (batch, H, num_tokens, num_tokens)


def test_a_call_that_fails_after_the_cache_took_its_chunk_spoils_it() -> None:
    ids = torch.tensor([[0, 0, 1, 1]])  # documents of 4 positions: the 5th reads past them
    layer = mla(mask=causal() & documents(ids))
    cache = layer.init_cache(2, 16)
    x = inputs(2, 5)
    layer(x[:, :4], cache=cache)
    with pytest.raises(TypeError, match=r"failed on"):
        layer(x[:, 4:], cache=cache)
    with pytest.raises(ValueError, match=r"cache: a call raised TypeError after the cache took "
                                         r"its chunk of 1 tokens"):  # fmt: skip
        layer(x[:, 4:], cache=cache)
    cache.reset()
    assert layer(x[:, :4], cache=cache).shape == (2, 4, D_IN) and cache.length == 4
