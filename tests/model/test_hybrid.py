"""attention.model.hybrid: linear attention against its definition, and the hybrid GPT."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.testing import assert_close

from attention.layer.linear import linear_parallel
from attention.model.generation import generate
from attention.model.gpt import GPTModel, TransformerBlock
from attention.model.hybrid import (
    HybridGPTModel,
    LinearAttention,
    LinearBlock,
)

CFG = {"vocab_size": 40, "context_length": 12, "emb_dim": 16, "n_heads": 4, "n_layers": 4,
       "drop_rate": 0.0, "qkv_bias": True}  # fmt: skip
QWEN3_NEXT = ["linear_attention"] * 3 + ["full_attention"]  # its 3:1 pattern


def reference(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """The definition token by token, and the recurrence over the state `S_t`, `z_t`.

    `o_t = sum_{s<=t} (phi(q_t).phi(k_s)) v_s / sum_{s<=t} phi(q_t).phi(k_s)` by a double loop,
    and `o_t = phi(q_t)^T S_t / phi(q_t)^T z_t` with `S_t = S_{t-1} + phi(k_t) v_t^T`,
    `z_t = z_{t-1} + phi(k_t)`: `(B, H, T, d_v)` each.
    """
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    b, h, num_tokens, d_k = q.shape
    by_sum, by_state = torch.zeros_like(v), torch.zeros_like(v)
    state = q.new_zeros(b, h, d_k, v.shape[-1])  # S_t: (B, H, d_k, d_v)
    normaliser = q.new_zeros(b, h, d_k)  # z_t: (B, H, d_k)
    for t in range(num_tokens):
        num, den = torch.zeros_like(v[:, :, 0]), q.new_zeros(b, h, 1)
        for s in range(t + 1):
            weight = (phi_q[:, :, t] * phi_k[:, :, s]).sum(-1, keepdim=True)  # (B, H, 1)
            num, den = num + weight * v[:, :, s], den + weight
        by_sum[:, :, t] = num / den
        state = state + phi_k[:, :, t, :, None] * v[:, :, t, None, :]
        normaliser = normaliser + phi_k[:, :, t]
        read = (phi_q[:, :, t, :, None] * state).sum(-2)  # phi(q_t)^T S_t: (B, H, d_v)
        by_state[:, :, t] = read / (phi_q[:, :, t] * normaliser).sum(-1, keepdim=True)
    return by_sum, by_state


def test_the_layers_linear_attention_is_its_definition_and_its_recurrence() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 7, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 7, 4, generator=gen, dtype=torch.float64)  # d_v != d_k
    by_sum, by_state = reference(q, k, v)
    out = linear_parallel(q, k, v)  # what LinearAttention calls
    assert out.shape == (2, 3, 7, 4)
    assert_close(out, by_sum, atol=1e-10, rtol=0)
    assert_close(out, by_state, atol=1e-10, rtol=0)
    assert_close(out[:, :, 0], v[:, :, 0], atol=1e-12, rtol=0)  # token 0 reads only itself


def test_the_layer_is_the_loop_over_tokens_through_its_projections() -> None:
    torch.manual_seed(0)
    layer = LinearAttention(d_in=6, d_out=8, num_heads=2, qkv_bias=True).double()
    x = torch.randn(3, 9, 6, dtype=torch.float64)

    def heads(linear: torch.nn.Linear) -> Tensor:
        out: Tensor = linear(x).view(3, 9, 2, 4).transpose(1, 2)  # (b, h, T, d_h)
        return out

    expected, _ = reference(heads(layer.W_query), heads(layer.W_key), heads(layer.W_value))
    expected = layer.out_proj(expected.transpose(1, 2).reshape(3, 9, 8))  # (b, T, d_out)
    assert_close(layer(x), expected, atol=1e-10, rtol=0)


def test_a_later_token_changes_no_earlier_output() -> None:
    torch.manual_seed(0)
    layer = LinearAttention(8, 8, num_heads=2).double()
    x = torch.randn(2, 10, 8, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6] += 1.0  # token 6 only
    before, after = layer(x), layer(changed)
    assert_close(after[:, :6], before[:, :6], atol=1e-12, rtol=0)
    assert (after[:, 6:] - before[:, 6:]).abs().amax() > 1e-3  # and it does change its own

    model = HybridGPTModel({**CFG, "layer_types": QWEN3_NEXT}).double().eval()
    idx = torch.randint(40, (2, 12), generator=torch.Generator().manual_seed(1))
    later = idx.clone()
    later[:, 8] = (idx[:, 8] + 1) % 40
    with torch.no_grad():
        assert_close(model(later)[:, :8], model(idx)[:, :8], atol=1e-12, rtol=0)


def test_an_all_softmax_hybrid_is_the_plain_gpt() -> None:
    torch.manual_seed(3)
    plain = GPTModel(CFG).double().eval()
    torch.manual_seed(3)
    hybrid = HybridGPTModel({**CFG, "layer_types": ["full_attention"] * 4}).double().eval()
    torch.manual_seed(4)
    default = HybridGPTModel(CFG).double()  # no layer_types: all full, other weights
    default.load_state_dict(plain.state_dict())  # strict: the same parameters, by name
    idx = torch.randint(40, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = plain(idx)
        assert_close(hybrid(idx), expected, atol=1e-12, rtol=0)  # one seed, one model
        assert_close(default.eval()(idx), expected, atol=1e-12, rtol=0)
    caches = hybrid.init_caches(batch_size=3)  # all softmax: GPTModel's cached decoding
    with torch.no_grad():
        hybrid(idx[:, :11], caches)
        assert_close(hybrid(idx[:, 11:], caches)[:, -1], expected[:, -1], atol=1e-10, rtol=0)


@pytest.mark.parametrize("rope_base", [None, 10000.0])
def test_layer_types_choose_each_blocks_attention(rope_base: float | None) -> None:
    cfg = {**CFG, "layer_types": QWEN3_NEXT} | ({} if rope_base is None
                                               else {"rope_base": rope_base})  # fmt: skip
    model = HybridGPTModel(cfg)
    blocks = list(model.trf_blocks)
    assert [type(b) for b in blocks] == [LinearBlock] * 3 + [TransformerBlock]
    assert all(isinstance(b.att, LinearAttention) for b in blocks[:3])
    assert model.layer_types == QWEN3_NEXT and (model.pos_emb is None) == (rope_base is not None)
    linear_names = {name for name, _ in blocks[0].named_parameters()}
    assert {"att.W_query.weight", "att.W_key.bias", "att.out_proj.weight"} <= linear_names
    idx = torch.randint(40, (2, 12))
    loss = F.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    loss.backward()  # trains: every parameter of the linear layers gets a finite gradient
    grads = [p.grad for p in blocks[0].att.parameters()]  # type: ignore[union-attr]
    assert all(g is not None and bool(g.isfinite().all()) and g.abs().sum() > 0 for g in grads)


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"layer_types must have n_layers=4 entries, got 3"):
        HybridGPTModel({**CFG, "layer_types": QWEN3_NEXT[:3]})
    with pytest.raises(ValueError, match=r"layer_types must name only .*got 'sliding_attention'"):
        HybridGPTModel({**CFG, "layer_types": ["sliding_attention"] * 4})
    with pytest.raises(TypeError, match=r"layer_types must be a list of .* got str"):
        HybridGPTModel({**CFG, "layer_types": "linear_attention"})
    with pytest.raises(TypeError, match="cfg must be a dict"):
        HybridGPTModel([("n_layers", 4)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown"):
        HybridGPTModel({**CFG, "layer_type": QWEN3_NEXT})  # a misspelt key
    with pytest.raises(ValueError, match="d_out must be a multiple of num_heads=3, got 8"):
        LinearAttention(8, 8, num_heads=3)
    with pytest.raises(ValueError, match=r"x must be \(batch, num_tokens, d_in=8\), got \(2, 8\)"):
        LinearAttention(8, 8, num_heads=2)(torch.randn(2, 8))


def test_what_a_linear_layer_does_not_do_is_refused_by_name() -> None:
    model = HybridGPTModel({**CFG, "layer_types": ["full_attention", *QWEN3_NEXT[:3]]}).eval()
    idx = torch.randint(40, (2, 5))
    caches = model.init_caches(batch_size=2)
    with pytest.raises(TypeError, match=r"this LinearAttention layer's LinearCache .* got KVCache"):
        model(idx, GPTModel(CFG).init_caches(batch_size=2))
    with pytest.raises(
        ValueError, match=r"cache must hold a state \(2, 4, 4, 4\) .*got \(3, 4, 4, 4\)"
    ):
        model(idx, [caches[0], *model.init_caches(batch_size=3)[1:]])
    left = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])  # row 0 left-padded
    with pytest.raises(NotImplementedError, match="no attention_mask"):
        model(idx, caches, attention_mask=left)  # refused before the softmax layer 0 runs
    with pytest.raises(NotImplementedError, match="no attention_mask"):
        generate(model, idx, max_new_tokens=2, attention_mask=left)
    # a mask without padding is no padding
    assert_close(model(idx, attention_mask=torch.ones_like(left)), model(idx))
    assert [cache.length for cache in caches] == [0] * 4  # nothing half-updated
    with pytest.raises(NotImplementedError, match="no softmax weights"):
        model.attention_weights(idx)
    assert not model.unbounded


@pytest.mark.parametrize("kinds", [QWEN3_NEXT, ["linear_attention"] * 4],
                         ids=["qwen3-next", "all linear"])  # fmt: skip
def test_cached_decoding_is_the_whole_forward_and_the_state_does_not_grow(
    kinds: list[str],
) -> None:
    torch.manual_seed(0)
    model = HybridGPTModel({**CFG, "layer_types": kinds}).double().eval()
    idx = torch.randint(40, (2, 10))
    caches = model.init_caches(batch_size=2)
    assert [type(cache).__name__ for cache in caches] == [
        "LinearCache" if kind == "linear_attention" else "KVCache" for kind in kinds
    ]
    sizes = []
    with torch.no_grad():
        steps = [model(idx[:, :4], caches)]
        sizes.append(caches[0].nbytes)
        steps += [model(idx[:, t : t + 1], caches) for t in range(4, 10)]
        sizes.append(caches[0].nbytes)
        whole = model(idx)
    assert_close(torch.cat(steps, dim=1), whole, rtol=0, atol=1e-12)
    assert [cache.length for cache in caches] == [10] * 4
    assert sizes[0] == sizes[1] == 2 * 4 * (4 * 4 + 4) * 8  # (b, h, d_h, d_h + 1) float64s
    # past the context (12): generate refills the caches from the last 12 tokens
    cached = generate(model, idx[:, :3], max_new_tokens=20, context_size=12)
    assert torch.equal(cached, generate(model, idx[:, :3], max_new_tokens=20,
                                        context_size=12, use_cache=False))  # fmt: skip


def test_cached_decoding_at_positions_other_than_0_to_t() -> None:
    """Positions reach the softmax layer (RoPE) and not the linear ones: a prefill and steps at
    positions 7, 9, 11.. (row 0) and 20, 22.. (row 1), offset and with gaps, cached, equal the
    whole forward at those positions."""
    torch.manual_seed(0)
    cfg = {**CFG, "context_length": 40, "rope_base": 10_000.0, "layer_types": QWEN3_NEXT}
    model = HybridGPTModel(cfg).double().eval()
    idx = torch.randint(40, (2, 8))
    positions = 2 * torch.arange(8).expand(2, 8) + torch.tensor([[7], [20]])
    caches = model.init_caches(batch_size=2)
    with torch.no_grad():
        steps = [model.logits(idx[:, :5], caches, positions=positions[:, :5])]
        steps += [model.logits(idx[:, t : t + 1], caches, positions=positions[:, t : t + 1])
                  for t in range(5, 8)]  # fmt: skip
        whole = model.logits(idx, positions=positions)
    assert_close(torch.cat(steps, dim=1), whole, rtol=0, atol=1e-12)
    with torch.no_grad():  # and the positions matter: at 0..T-1 (no gaps) the logits differ
        assert (model.logits(idx) - whole).abs().max() > 1e-3
