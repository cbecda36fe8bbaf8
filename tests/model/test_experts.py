"""The top-k mixture of experts: the definition, the work it skips, and whole Mixtral,
Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V3 and V3.2, Llama 4 and Qwen3-Next models from
transformers (float64)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.testing import assert_close

import attention
from attention.model.experts import Experts, MixtureOfExperts, Router
from attention.model.llama_block import LlamaModel, SwiGLU
from tests.float64 import float64_casts

D, H, E = 16, 24, 6


def mixture(normalize: bool = True, shared: bool = True) -> MixtureOfExperts:
    torch.manual_seed(0)
    moe = MixtureOfExperts(D, H, E, top_k=2, normalize=normalize,
                           shared_expert=SwiGLU(D, 20) if shared else None,
                           shared_gate=shared).double()  # fmt: skip
    with torch.no_grad():
        moe.gate.weight.mul_(3.0)  # routers that choose decisively
    return moe


def definition(moe: MixtureOfExperts, x: Tensor) -> Tensor:
    """The module's equations, one token at a time, every expert computed."""
    out = torch.zeros_like(x)
    up_gate, down = moe.experts.gate_up_proj, moe.experts.down_proj
    for n, token in enumerate(x):
        p = torch.softmax(moe.gate.weight @ token, dim=0)  # (E,)
        top = sorted(range(E), key=lambda e: -float(p[e].detach()))[: moe.top_k]
        total = sum(p[e] for e in top) if moe.gate.normalize else 1.0
        for e in top:
            g, u = (up_gate[e] @ token).chunk(2)
            out[n] += p[e] / total * (down[e] @ (F.silu(g) * u))
        if moe.shared_expert is not None:
            assert moe.shared_expert_gate is not None
            gate = torch.sigmoid(moe.shared_expert_gate.weight[0] @ token)
            out[n] += gate * moe.shared_expert(token[None])[0]
    return out


@pytest.mark.parametrize(("normalize", "shared"), [(True, False), (False, True)])
def test_equals_the_definition(normalize: bool, shared: bool) -> None:
    moe = mixture(normalize, shared)
    x = torch.randn(3, 5, D, dtype=torch.float64)
    assert_close(moe(x), definition(moe, x.view(-1, D)).view(3, 5, D), rtol=0, atol=1e-12)


def test_deepseek_routing_equals_the_definition() -> None:
    """Sigmoid scores, a bias for choosing only, 2 of 4 groups, normalised, scaled."""
    torch.manual_seed(1)
    moe = MixtureOfExperts(D, H, 8, top_k=3, scoring="sigmoid", groups=4, topk_group=2,
                           scale=2.5, choice_bias=True).double()  # fmt: skip
    bias = moe.gate.e_score_correction_bias
    assert bias is not None
    bias.normal_()
    x = torch.randn(30, D, dtype=torch.float64)
    weights, chosen = moe.route(x)
    for token, w, picked in zip(x, weights, chosen, strict=True):
        s = torch.sigmoid(moe.gate.weight.detach() @ token)  # (8,)
        c = (s + bias).tolist()
        groups = sorted(range(4), key=lambda g: -sum(sorted(c[2 * g : 2 * g + 2])[-2:]))[:2]
        allowed = [e for e in range(8) if e // 2 in groups]
        top = sorted(sorted(allowed, key=lambda e: -c[e])[:3])
        assert sorted(picked.tolist()) == top
        want = {e: 2.5 * float(s[e]) / sum(float(s[f]) for f in top) for e in top}
        got = dict(zip(picked.tolist(), w.tolist(), strict=True))
        assert got == pytest.approx(want, rel=1e-12)


def test_scaling_the_input_is_llama_4s_equation() -> None:
    """y = shared(x) + sum over chosen e of E_e(sigma(l_e) x)."""
    torch.manual_seed(2)
    moe = MixtureOfExperts(D, H, E, top_k=2, scoring="sigmoid", normalize=False,
                           scale_input=True, shared_expert=SwiGLU(D, 20)).double()  # fmt: skip
    x = torch.randn(7, D, dtype=torch.float64)
    logits = x @ moe.gate.weight.T  # (7, E)
    want = moe.shared_expert(x) if moe.shared_expert is not None else None
    assert want is not None
    for n in range(7):
        for e in logits[n].topk(2).indices.tolist():
            want[n] += moe.experts.run(e, torch.sigmoid(logits[n, e]) * x[n : n + 1])[0]
    assert_close(moe(x[None])[0], want, rtol=0, atol=1e-12)


def test_only_the_chosen_experts_run_on_only_their_tokens() -> None:
    moe = mixture(shared=False)
    with torch.no_grad():
        moe.gate.weight.zero_()
        moe.gate.weight[1, 0], moe.gate.weight[4, 0] = 50.0, 49.0  # token[0] > 0: experts 1, 4
    x = torch.randn(40, D, dtype=torch.float64)
    x[:, 0] = x[:, 0].abs() + 0.5
    calls: list[tuple[int, int]] = []
    run = moe.experts.run
    moe.experts.run = lambda e, t: calls.append((e, t.shape[0])) or run(e, t)  # type: ignore[method-assign]
    moe(x[None])
    assert sorted(calls) == [(1, 40), (4, 40)]  # 2 of 6 experts ran, each once over its tokens


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"top_k must be at most num_experts=4 .*got 5"):
        MixtureOfExperts(D, H, 4, top_k=5)
    with pytest.raises(ValueError, match=r"shared_expert must map \(n, emb_dim=16\) to \(n, 16\)"):
        MixtureOfExperts(D, H, 4, top_k=1, shared_expert=SwiGLU(8, 4))
    with pytest.raises(ValueError, match="shared_gate=True needs a shared_expert"):
        MixtureOfExperts(D, H, 4, top_k=1, shared_gate=True)
    cfg = {"vocab_size": 10, "context_length": 8, "emb_dim": D, "hidden_dim": H, "n_layers": 2,
           "layers": [{"num_heads": 2, "rope": True}] * 2}  # fmt: skip
    with pytest.raises(ValueError, match="cfg's experts must be a list of n_layers=2 entries"):
        LlamaModel({**cfg, "experts": [None]})
    with pytest.raises(ValueError, match=r"cfg's experts have unknown keys \['k'\]"):
        LlamaModel({**cfg, "experts": [None, {"num_experts": 4, "top_k": 1, "hidden_dim": 8,
                                               "k": 2}]})  # fmt: skip
    with pytest.raises(ValueError, match=r"cfg's experts need \['hidden_dim'\]"):
        LlamaModel({**cfg, "experts": [None, {"num_experts": 4, "top_k": 1}]})
    with pytest.raises(ValueError, match="shared_dim must be >= 1, got -3"):
        LlamaModel({**cfg, "experts": [None, {"num_experts": 4, "top_k": 1, "hidden_dim": 8,
                                               "shared_dim": -3}]})  # fmt: skip


def test_the_router_and_the_experts_name_bad_input() -> None:
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        Router(D, 4, 0)
    with pytest.raises(TypeError, match="top_k must be an int"):
        Router(D, 4, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hidden_dim must be >= 1, got 0"):
        Experts(D, 0, 4, F.silu)
    moe = mixture()
    with pytest.raises(ValueError, match=r"\(num_tokens, d_in\) with d_in=16, got a 1-d tensor"):
        moe.route(torch.randn(D, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"d_in=16, got last dimension 7 \(shape \(3, 7\)\)"):
        moe.route(torch.randn(3, 7, dtype=torch.float64))
    with pytest.raises(
        TypeError, match=r"expected a floating-point input .* got dtype torch.int64"
    ):
        moe.route(torch.ones(3, D, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x must be \(num_tokens, emb_dim=16\), got \(2, 3, 16\)"):
        moe.route(torch.randn(2, 3, D, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"expert must be in 0 \.\. 5, got -1"):
        moe.experts.run(-1, torch.randn(3, D, dtype=torch.float64))


def test_weights_are_finite_where_every_chosen_sigmoid_underflows() -> None:
    router = Router(D, 4, 2, scoring="sigmoid")  # normalised: DeepSeek's + 1e-20
    with torch.no_grad():
        router.weight.fill_(1e4)
    weights, _ = router(-torch.ones(2, D))
    assert torch.equal(weights, torch.zeros(2, 2))


def test_a_bfloat16_router_scores_in_float32() -> None:
    router = Router(D, 6, 2)
    x = torch.randn(50, D)
    weights, chosen = router.bfloat16()(x.bfloat16())
    wide = Router(D, 6, 2)
    wide.load_state_dict({k: v.float() for k, v in router.state_dict().items()})
    want, picked = wide(x.bfloat16().float())  # the same rounded inputs and weights
    assert weights.dtype == torch.bfloat16 and torch.equal(chosen, picked)
    assert_close(weights.float(), want, rtol=0, atol=4e-3)  # bfloat16's rounding of the result


SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 50, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
         "max_position_embeddings": 64, "pad_token_id": None, "bos_token_id": None,
         "eos_token_id": None}  # fmt: skip
EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("Mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2 moe": ("Qwen2Moe", {**EXPERTS, "shared_expert_intermediate_size": 24}),
    "qwen3 moe": ("Qwen3Moe", {**EXPERTS, "norm_topk_prob": False}),
    "qwen3 moe, normalised": ("Qwen3Moe", {**EXPERTS, "norm_topk_prob": True}),
    "olmoe": ("Olmoe", EXPERTS),
    "deepseek v3": ("DeepseekV3", {"n_routed_experts": 8, "num_experts_per_tok": 3,
                                   "moe_intermediate_size": 16, "n_group": 4, "topk_group": 2,
                                   "n_shared_experts": 1, "first_k_dense_replace": 1,
                                   "num_hidden_layers": 3, "kv_lora_rank": 8, "q_lora_rank": 12,
                                   "qk_rope_head_dim": 4, "qk_nope_head_dim": 4,
                                   "v_head_dim": 8, "head_dim": 4}),
    "deepseek v3.2": ("DeepseekV32", {"n_routed_experts": 8, "num_experts_per_tok": 3,
                                      "moe_intermediate_size": 16, "n_group": 4,
                                      "topk_group": 2, "n_shared_experts": 1,
                                      "first_k_dense_replace": 1, "num_hidden_layers": 3,
                                      "kv_lora_rank": 8, "q_lora_rank": 12,
                                      "qk_rope_head_dim": 4, "qk_nope_head_dim": 4,
                                      "v_head_dim": 8, "head_dim": 4, "num_key_value_heads": 4,
                                      "index_topk": 4, "index_n_heads": 2, "index_head_dim": 8,
                                      "attn_implementation": "eager"}),
    "llama 4": ("Llama4Text", {"num_local_experts": 4, "num_experts_per_tok": 1,
                               "num_hidden_layers": 4, "interleave_moe_layer_step": 2,
                               "intermediate_size_mlp": 40, "attention_chunk_size": 4,
                               "no_rope_layers": [1, 1, 1, 0]}),
    "qwen3 next": ("Qwen3Next", {**EXPERTS, "shared_expert_intermediate_size": 24,
                                 "num_hidden_layers": 4, "decoder_sparse_step": 2,
                                 "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                 "linear_key_head_dim": 8, "linear_value_head_dim": 6}),
}  # fmt: skip


def hf_moe(transformers: ModuleType, family: str) -> Any:
    prefix, extra = FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(**{**SMALL, **extra})
    config._experts_implementation = "eager"  # the grouped kernel takes no float64
    torch.manual_seed(0)
    name = "Llama4ForCausalLM" if prefix == "Llama4Text" else f"{prefix}ForCausalLM"
    model = getattr(transformers, name)(config).double().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "A_log" not in name:
                param.copy_(torch.randn_like(param) * 0.3)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's: chooses, not weighs
                buffer.copy_(torch.randn_like(buffer) * 0.3)
    return model


@pytest.mark.slow(seconds=4)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_whole_mixture_models_equal_transformers(family: str) -> None:
    transformers = pytest.importorskip("transformers", minversion="5.24")
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), float64_casts(tensor_float=True):
        theirs = hf_moe(transformers, family)  # RoPE's frequencies made in float64 too
        ours = attention.from_hf(theirs)
        want = theirs(ids).logits
        assert_close(ours(ids), want, rtol=0, atol=1e-12 * float(want.abs().max()) + 1e-12)
        # at positions other than 0..T-1, which RoPE reads (the routers do not). Offsets are
        # multiples of Llama 4's chunk of 4: its chunks are ours by position, transformers'
        # by index (`position_ids` moves only its RoPE), the same where the two agree.
        positions = torch.arange(9).expand(2, 9) + torch.tensor([[8], [20]])
        if family == "deepseek v3.2":  # its indexer's top-k is by slot: no positions yet
            with pytest.raises(ValueError, match=r"SparseLatentAttention takes no .*positions"):
                ours.logits(ids, positions=positions)
        else:
            want = theirs(ids, position_ids=positions).logits
            assert_close(ours.logits(ids, positions=positions), want, rtol=0,
                         atol=1e-12 * float(want.abs().max()) + 1e-12)  # fmt: skip
        # a left-padded batch, against transformers on each row alone (its padded batch
        # fails in DeepSeek-V3's attention)
        mask = torch.ones(2, 6, dtype=torch.long)
        mask[1, :2] = 0 if family != "deepseek v3.2" else 1  # its layer takes no padding
        prompt = ids[:, :6].masked_fill(mask == 0, 0)
        tokens = attention.generate(ours, prompt, 6, attention_mask=mask)[:, 6:]
        for row in range(2):
            alone = prompt[row : row + 1, mask[row] == 1]
            theirs_row = theirs.generate(alone, max_new_tokens=6, do_sample=False)
            assert torch.equal(tokens[row], theirs_row[0, alone.shape[1] :]), row
    kinds = {type(block.ff).__name__ for block in ours.blocks}
    assert "MixtureOfExperts" in kinds
    if family == "deepseek v3.2":  # the indexer's top 4 of 9 keys: sparse attention
        assert {type(b.att).__name__ for b in ours.blocks} == {"SparseLatentAttention"}
    if family == "deepseek v3":  # first_k_dense_replace=1; latent attention in every layer
        assert [type(b.ff).__name__ for b in ours.blocks] == ["SwiGLU"] + ["MixtureOfExperts"] * 2
        assert {type(b.att).__name__ for b in ours.blocks} == {"MultiHeadLatentAttention"}
    if family == "llama 4":  # experts every other layer, scaling the experts' inputs
        assert [type(b.ff).__name__ for b in ours.blocks] == ["SwiGLU", "MixtureOfExperts"] * 2
        assert all(b.ff.scale_input for b in ours.blocks[1::2])  # type: ignore[union-attr]
    if family == "qwen3 next":  # decoder_sparse_step=2: layers 1 and 3 have experts
        assert [type(b.ff).__name__ for b in ours.blocks] == ["SwiGLU", "MixtureOfExperts"] * 2


@pytest.mark.slow(seconds=2)
def test_a_router_of_another_rule_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers", minversion="5.24")
    theirs = hf_moe(transformers, "mixtral")
    router = type(theirs.model.layers[0].mlp.gate)

    def sigmoid_router(self: Any, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = F.linear(x, self.weight)
        scores, chosen = torch.sigmoid(logits).topk(self.top_k, dim=-1)
        return logits, scores, chosen

    monkeypatch.setattr(router, "forward", sigmoid_router)
    with pytest.raises(
        ValueError, match="layer 0's router MixtralTopKRouter computes none of the routings"
    ):
        attention.from_hf(theirs)


@pytest.mark.slow(seconds=3)
@pytest.mark.parametrize(
    ("family", "dtype", "atol"),
    [("mixtral", torch.bfloat16, 0.02), ("qwen3 moe", torch.float64, 1e-6)],
)
def test_a_users_bfloat16_or_double_model_loads(
    family: str, dtype: torch.dtype, atol: float
) -> None:
    """Not under float64_casts: a bfloat16 model, and a `.double()` one whose router takes its
    softmax in float32 (Qwen's), are read as they are, their routing found on a float64 copy."""
    transformers = pytest.importorskip("transformers", minversion="5.24")
    theirs = hf_moe(transformers, family).to(dtype)
    ours = attention.from_hf(theirs)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = theirs(ids).logits
        assert_close(ours(ids), want, rtol=0, atol=atol * float(want.abs().max()))
    assert ours.tok_emb.weight.dtype == dtype


@pytest.mark.slow(seconds=3)
@pytest.mark.parametrize(
    ("family", "extra"),
    [
        ("deepseek v3", {"n_shared_experts": 0}),
        ("qwen2 moe", {"shared_expert_intermediate_size": 0}),
    ],
)
def test_a_shared_expert_of_width_0_is_none(family: str, extra: dict[str, int]) -> None:
    transformers = pytest.importorskip("transformers", minversion="5.24")
    prefix, base = FAMILIES[family]
    config = getattr(transformers, f"{prefix}Config")(**{**SMALL, **base, **extra})
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    theirs = getattr(transformers, f"{prefix}ForCausalLM")(config).eval()
    ours = attention.from_hf(theirs)  # its empty weights (and Qwen's gate of them) add 0
    mixtures = [block.ff for block in ours.blocks if isinstance(block.ff, MixtureOfExperts)]
    assert mixtures and all(m.shared_expert is None and m.shared_expert_gate is None
                            for m in mixtures)  # fmt: skip
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = theirs(ids).logits
        assert_close(ours(ids), want, rtol=0, atol=1e-5 * float(want.abs().max()))
