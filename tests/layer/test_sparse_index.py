"""DeepSeek sparse attention: the indexer's top-k as a mask, dense when k covers every key, and
the layer equal to transformers' `DeepseekV32Attention`, prefill and step by step.

Comparisons are in float64 at 1e-10. transformers' layer is built tiny from `DeepseekV32Config`
(random weights), its RMSNorm's float32 cast patched out, RoPE's angles given in float64, and
its SDPA path used (the eager path takes the softmax in float32).
Its indexer computes the scores in float32 (`q.float()`, `.float()` on the head weights), which
only decides *which* keys are read: each test checks first that both choose the same keys
(on these inputs the k-th and (k+1)-th scores differ by more than 1e-3, far above float32's
rounding: checked below), then that the outputs agree to 1e-10.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

import attention
from attention.layer.latent import MultiHeadLatentAttention
from attention.layer.masks import causal
from attention.layer.sparse_index import (
    IndexedCache,
    LightningIndexer,
    SparseLatentAttention,
    from_hf_sparse,
    topk_chosen,
    topk_mask,
)
from attention.layer.tokens import Tokens
from tests.float64 import exact_rms_norm
from tests.layer.test_latent import D_IN, D_N, D_R, D_V, H, R, T, angles, tiny_hf_layer

Q_LORA, H_I, D_I = 12, 3, 8  # the indexer; the latent widths are chapter 17 tests'
EXACT = {"atol": 1e-10, "rtol": 0.0}


def sizes(**change: Any) -> dict[str, Any]:
    return {"kv_lora_rank": R, "qk_nope_head_dim": D_N, "qk_rope_head_dim": D_R,
            "v_head_dim": D_V, "q_lora_rank": Q_LORA, "index_topk": 3, "index_n_heads": H_I,
            "index_head_dim": D_I, **change}  # fmt: skip


def dsa(seed: int = 0, **change: Any) -> SparseLatentAttention:
    """A tiny float64 layer with random norms (so that a misplaced one shows)."""
    torch.manual_seed(seed)
    layer = SparseLatentAttention(D_IN, H, 32, **sizes(**change)).double().eval()
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.normal_()
    return layer


def inputs(batch: int = 2, num_tokens: int = T, seed: int = 1) -> Tensor:
    return torch.randn(batch, num_tokens, D_IN, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)  # fmt: skip


def reference_chosen(layer: SparseLatentAttention, x: Tensor) -> Tensor:
    """The keys each query reads, from the definition, one (row, query, key) at a time:
    I_{t,s} = sum_j w_{t,j} ReLU(q_{t,j} . k_s / sqrt(d_I)), then the top k of s <= t."""
    ix = layer.indexer
    b, t, _ = x.shape
    pos = torch.arange(t, dtype=torch.float64)
    inv_freq = 1.0 / layer.rotary.base ** (torch.arange(0, D_R, 2, dtype=torch.float64) / D_R)
    cos, sin = (pos[:, None] * inv_freq).cos(), (pos[:, None] * inv_freq).sin()  # (T, d_R/2)

    def rope(v: Tensor, m: int) -> Tensor:  # halves: (v_i, v_{i + d_R/2}) turned by m theta_i
        a, c, rest = v[: D_R // 2], v[D_R // 2 : D_R], v[D_R:]
        return torch.cat((a * cos[m] - c * sin[m], c * cos[m] + a * sin[m], rest))

    assert layer.q_a_proj is not None and layer.q_a_layernorm is not None
    chosen = torch.zeros(b, t, t, dtype=torch.bool)
    with torch.no_grad():
        q_low = layer.q_a_layernorm(layer.q_a_proj(x))
        for row in range(b):
            keys = [rope(ix.k_norm(ix.wk(x[row, s])), s) for s in range(t)]
            for i in range(t):
                q = ix.wq_b(q_low[row, i]).view(H_I, D_I)
                w = ix.weights_proj(x[row, i]) / math.sqrt(H_I)
                score = [sum(float(w[j]) * max(0.0, float(rope(q[j], i) @ keys[s]) / math.sqrt(D_I))
                             for j in range(H_I)) for s in range(i + 1)]  # fmt: skip
                best = sorted(range(i + 1), key=lambda s: -score[s])[: layer.index_topk]
                chosen[row, i, best] = True
    return chosen


# ---- the top-k mask


def test_chosen_equals_the_definition() -> None:
    """The layer's choice is the top k of the indexer's scores among the visible keys, as a
    loop over rows, queries, keys and heads computes it."""
    layer = dsa(index_topk=3)
    x = inputs()
    with torch.no_grad():
        layer(x)
    assert layer.last_chosen is not None
    assert torch.equal(layer.last_chosen, reference_chosen(layer, x))  # bools: exact
    assert layer.last_chosen.sum(-1).tolist() == [[1, 2] + [3] * (T - 2)] * 2


def smallest_gap(layer: SparseLatentAttention, x: Tensor) -> float:
    """The smallest difference between a query's k-th and (k+1)-th visible indexer scores."""
    k, t = layer.index_topk, x.shape[1]
    with torch.no_grad():
        cos_sin = layer.rotary.of(Tokens(x.shape[0], t, x.device, start=0), x.dtype)
        assert layer.q_a_proj is not None and layer.q_a_layernorm is not None
        low = layer.q_a_layernorm(layer.q_a_proj(x))
        scores = layer.indexer(x, low, layer.indexer.keys(x, cos_sin), cos_sin)
    ranked = [scores[b, i, : i + 1].sort(descending=True).values
              for b in range(x.shape[0]) for i in range(k, t)]  # fmt: skip
    return min(float(r[k - 1] - r[k]) for r in ranked)


def test_no_near_ties_at_the_cut() -> None:
    """These inputs leave a gap above 1e-3 at each query's cut: float32 scores
    (transformers') rank them as float64 ones do."""
    assert smallest_gap(dsa(index_topk=3), inputs()) > 1e-3


def test_topk_mask_is_a_mask_of_the_algebra() -> None:
    """`causal() & topk_mask(chosen)` evaluated at positions is `chosen & causal`, read per row;
    a chunk at `start` reads its own rows; positions outside the tensor are hidden."""
    scores = torch.randn(2, 4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    seen = torch.ones(4, 6, dtype=torch.bool).tril(2)[None]  # queries at 2..5 over keys 0..5
    chosen = topk_chosen(scores, 2, seen.expand(2, 4, 6))
    assert chosen.sum(-1).tolist() == [[2] * 4] * 2
    mask = causal() & topk_mask(chosen, start=2)
    grid = mask.grid(torch.arange(2, 6).expand(2, 4), torch.arange(6).expand(2, 6))
    assert grid.shape == (2, 1, 4, 6)
    assert torch.equal(grid[:, 0], chosen)
    outside = topk_mask(chosen, start=2).grid(torch.arange(8), torch.arange(8))
    assert not outside[:2].any() and not outside[:, 6:].any()


@pytest.mark.parametrize("absorb", [False, True])
def test_dense_when_k_covers_every_key(absorb: bool) -> None:
    """With k >= T every query reads every key it sees: the dense causal latent layer."""
    layer = dsa(index_topk=T, absorb=absorb)
    dense = MultiHeadLatentAttention(D_IN, H, 32, **{
        k: v for k, v in sizes().items() if not k.startswith("index")}).double().eval()  # fmt: skip
    dense.load_state_dict(layer.state_dict(), strict=False)
    dense.absorb = absorb
    x = inputs()
    with torch.no_grad():
        out, weights = layer(x, need_weights=True)
        ref, ref_weights = dense(x, need_weights=True)
        assert_close(layer(x), ref, **EXACT)  # the planner's kernel call too
    assert_close(out, ref, **EXACT)
    assert_close(weights, ref_weights, **EXACT)
    assert layer.last_chosen is not None
    assert torch.equal(layer.last_chosen[0], torch.ones(T, T, dtype=torch.bool).tril())


def test_sparse_reads_only_the_chosen_keys() -> None:
    """With k < T the weights are zero outside the chosen keys, sum to one over them, and the
    output differs from the dense layer's."""
    layer = dsa(index_topk=3)
    x = inputs()
    with torch.no_grad():
        out, weights = layer(x, need_weights=True)
    assert layer.last_chosen is not None
    chosen = layer.last_chosen[:, None]  # (b, 1, T, S)
    assert weights.masked_fill(chosen, 0.0).abs().max() == 0.0
    assert_close(weights.sum(-1), torch.ones(2, H, T, dtype=torch.float64), **EXACT)
    dense = dsa(index_topk=T)
    with torch.no_grad():
        assert (dense(x) - out).abs().max() > 1e-3


@pytest.mark.parametrize("absorb", [False, True])
def test_cached_equals_uncached(absorb: bool) -> None:
    """A prefill of 4 tokens, then one at a time: each step chooses among every cached key
    (the indexer's keys are cached), and the outputs are one uncached call's."""
    layer = dsa(index_topk=3, absorb=absorb)
    x = inputs()
    cache = layer.init_cache(batch_size=2, max_tokens=T)
    assert isinstance(cache, IndexedCache) and cache.index_keys.shape == (2, T, D_I)
    with torch.no_grad():
        full = layer(x)
        chosen = layer.last_chosen
        parts = [layer(x[:, :4], cache=cache)]
        for t in range(4, T):
            parts.append(layer(x[:, t : t + 1], cache=cache))
            assert layer.last_chosen is not None and chosen is not None
            assert torch.equal(layer.last_chosen[:, 0], chosen[:, t, : t + 1])
    assert_close(torch.cat(parts, dim=1), full, **EXACT)
    assert cache.nbytes == 2 * T * (R + D_R + D_I) * 8


# ---- transformers' DeepseekV32Attention


@pytest.fixture
def deepseek(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """transformers' DeepSeek-V3.2 modeling module, its RMSNorm without the float32 cast."""
    pytest.importorskip("transformers", minversion="5.24")
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as module

    exact_rms_norm(module.DeepseekV32RMSNorm, monkeypatch)
    return module


def hf_attention(module: ModuleType, topk: int, **settings: Any) -> Any:
    """transformers' DeepSeek-V3.2 layer, tiny: chapter 17's widths with an indexer."""
    settings = dict(q_lora_rank=Q_LORA, index_topk=topk, index_n_heads=H_I, index_head_dim=D_I,
                    n_routed_experts=4, n_group=1, topk_group=1, num_experts_per_tok=2,
                    attention_bias=True, **settings)  # fmt: skip
    return tiny_hf_layer(module, "DeepseekV32", **settings)


def hf_call(hf: Any, x: Tensor, start: int, cache: Any = None) -> tuple[Tensor, Tensor]:
    """transformers' output for a chunk at `start`, and the keys its indexer chose `(b, T, S)`."""
    b, t, _ = x.shape
    s = start + t
    positions = torch.arange(start, s).expand(b, t)
    mask = torch.zeros(t, s, dtype=torch.float64).masked_fill(
        ~torch.ones(t, s, dtype=torch.bool).tril(start), -math.inf)[None, None]  # fmt: skip
    cos_sin = angles(positions, hf.config.rope_parameters["rope_theta"])
    chosen: list[Tensor] = []
    hook = hf.indexer.register_forward_hook(lambda m, a, out: chosen.append(out))
    try:
        with torch.no_grad():
            out = hf(x, position_embeddings=cos_sin, attention_mask=mask, cache=cache,
                     position_ids=positions)[0]  # fmt: skip
    finally:
        hook.remove()
    picked = torch.zeros(b, t, s, dtype=torch.bool).scatter(-1, chosen[0].long(), True)
    return out, picked & (mask[:, 0] == 0)


@pytest.mark.parametrize("topk", [3, T])
@pytest.mark.parametrize("absorb", [False, True])
def test_equals_transformers_prefill(deepseek: ModuleType, topk: int, absorb: bool) -> None:
    """The same weights choose the same keys and give transformers' outputs; read by the
    package's entry point, `attention.from_hf`, which hands the module to `from_hf_sparse`."""
    hf = hf_attention(deepseek, topk)
    layer = attention.from_hf(hf)
    assert isinstance(layer, SparseLatentAttention) and not layer.training
    layer.absorb = absorb
    x = inputs()
    assert topk == T or smallest_gap(layer, x) > 1e-3  # float32 ranks as float64 here
    theirs, their_chosen = hf_call(hf, x, 0)
    with torch.no_grad():
        ours = layer(x)
    assert layer.last_chosen is not None
    assert torch.equal(layer.last_chosen, their_chosen)
    assert_close(ours, theirs, **EXACT)


def test_equals_transformers_step_by_step(deepseek: ModuleType) -> None:
    """A prefill of 4 tokens, then one token at a time, both with their caches: the same keys
    chosen among all cached ones, the same outputs."""
    from transformers import DynamicCache

    hf = hf_attention(deepseek, 3)
    layer = from_hf_sparse(hf)
    x = inputs()
    assert smallest_gap(layer, x) > 1e-3  # float32 ranks as float64 here
    hf_cache = DynamicCache(config=hf.config)
    cache = layer.init_cache(batch_size=2, max_tokens=T)
    for start, stop in [(0, 4), *((t, t + 1) for t in range(4, T))]:
        theirs, their_chosen = hf_call(hf, x[:, start:stop], start, hf_cache)
        with torch.no_grad():
            ours = layer(x[:, start:stop], cache=cache)
        assert layer.last_chosen is not None
        assert torch.equal(layer.last_chosen, their_chosen)
        assert_close(ours, theirs, **EXACT)
    assert hf_cache.layers[0].indexer_keys.shape == (2, T, D_I)
    assert_close(cache.index_keys, hf_cache.layers[0].indexer_keys, **EXACT)


def test_from_hf_sparse_reads_the_softmax_factor_and_refuses_other_ropes(
    deepseek: ModuleType,
) -> None:
    """YaRN's softmax factor is read into the scale (transformers' `scaling`); a RoPE scaling
    it does not read is refused by name."""
    yarn = {"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 1.0, "mscale": 1.0,
            "original_max_position_embeddings": 4, "beta_fast": 32, "beta_slow": 1,
            "rope_theta": 10000.0}  # fmt: skip
    hf = hf_attention(deepseek, 3, rope_parameters=yarn, max_position_embeddings=160)
    layer = from_hf_sparse(hf)
    assert layer.scale == pytest.approx(hf.scaling, rel=1e-15)
    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    hf = hf_attention(deepseek, 3, rope_parameters=linear)
    with pytest.raises(ValueError, match=r"rope_type='linear'; the latent layer's loader reads"):
        from_hf_sparse(hf)


# ---- bad input


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda s, v: topk_chosen(s, 0), ValueError, r"topk must be >= 1, got 0"),
    (lambda s, v: topk_chosen(s, 7), ValueError,
     r"topk must be at most the number of keys S=6 of scores \(batch, T, S\) = \(2, 4, 6\), "
     r"got 7"),
    (lambda s, v: topk_chosen(s, 2.0), TypeError, r"topk must be an int, got 2.0"),
    (lambda s, v: topk_chosen(s[0], 2), ValueError, r"scores must have 3 dimensions, got shape"),
    (lambda s, v: topk_chosen(s.long(), 2), TypeError, r"scores must be a floating-point"),
    (lambda s, v: topk_chosen(s, 2, v[..., :5]), ValueError,
     r"seen must be bool of shape \(batch or 1, T, S\) = \(2 or 1, 4, 6\), got torch.bool "
     r"\(2, 4, 5\)"),
    (lambda s, v: topk_mask(v.int()), TypeError, r"chosen must be a bool tensor.*got torch.int32"),
    (lambda s, v: topk_mask(v[0]), ValueError, r"chosen must have 3 dimensions, got shape"),
    (lambda s, v: topk_mask(v, start=-1), ValueError, r"start must be >= 0, got -1"),
])  # fmt: skip
def test_bad_topk_arguments(call: Any, error: type[Exception], match: str) -> None:
    scores = torch.randn(2, 4, 6, dtype=torch.float64)
    with pytest.raises(error, match=match):
        call(scores, torch.ones(2, 4, 6, dtype=torch.bool))


@pytest.mark.parametrize(("change", "error", "match"), [
    ({"index_topk": 0}, ValueError, r"index_topk must be >= 1, got 0"),
    ({"index_n_heads": 1.5}, TypeError, r"index_n_heads must be an int"),
    ({"index_head_dim": 2}, ValueError,
     r"index_head_dim must be at least qk_rope_head_dim=4 .*, got 2"),
])  # fmt: skip
def test_bad_layer_arguments(change: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        SparseLatentAttention(D_IN, H, 32, **sizes(**change))


def test_bad_calls() -> None:
    layer = dsa()
    x = inputs()
    with pytest.raises(ValueError, match=r"takes no key_padding_mask, document_ids or positions"):
        layer(x, positions=torch.arange(T).expand(2, T))
    plain = MultiHeadLatentAttention(D_IN, H, 32, **{
        k: v for k, v in sizes().items() if not k.startswith("index")}).double()  # fmt: skip
    with pytest.raises(ValueError, match=r"a cache from its own init_cache; got a KVCache"):
        layer(x, cache=plain.init_cache(2))
    with pytest.raises(TypeError, match=r"module must be transformers' DeepSeek-V3.2 attention"):
        from_hf_sparse(plain)
    with pytest.raises(ValueError, match=r"d_in"):
        layer(x[..., :-1])


def test_indexer_shapes() -> None:
    """Scores `(b, T, S)`; keys `(b, S, d_I)`; nonzero weights make signed scores."""
    ix = LightningIndexer(D_IN, Q_LORA, H_I, D_I, D_R).double()
    x = inputs()
    pos = angles(torch.arange(T), 10000.0)
    cos_sin = (pos[0][:, : D_R // 2].repeat(1, 2), pos[1][:, : D_R // 2].repeat(1, 2))
    keys = ix.keys(x, cos_sin)
    assert keys.shape == (2, T, D_I)
    scores = ix(x, torch.randn(2, T, Q_LORA, dtype=torch.float64), keys, cos_sin)
    assert scores.shape == (2, T, T)


def test_gradients_reach_the_attention_not_the_indexer() -> None:
    """As in transformers and DeepSeek's training, the main loss trains the latent attention's
    weights; the indexer (no_grad, trained by its own loss) gets no gradient from it."""
    layer = dsa().train()
    layer(inputs()).square().sum().backward()
    grads = {name: p.grad for name, p in layer.named_parameters()}
    assert all(g is None for name, g in grads.items() if name.startswith("indexer."))
    assert all(g is not None and g.abs().max() > 0 for name, g in grads.items()
               if not name.startswith("indexer."))  # fmt: skip


def test_seen_of_another_batch_is_refused_by_name() -> None:
    scores, seen = torch.rand(2, 3, 5), torch.ones(3, 3, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"seen must be bool of shape \(batch or 1, T, S\) = "
                                         r"\(2 or 1, 3, 5\), got torch.bool \(3, 3, 5\)"):  # fmt: skip
        topk_chosen(scores, 2, seen)
