"""The static decode step (`attention.model.decode`): what lets one CUDA graph hold a step.

On the CPU: the static step equals the dynamic one (tokens, greedy and sampled with a
generator; logits) and a float64 recomputation of the whole sequence; its kernel sees the
same shapes at every step; it reads no tensor value (it runs on `meta`). On CUDA the same
tests run the recorded graph.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from attention.layer.multihead import MultiHeadAttention
from attention.layer.softcap import softcap
from attention.layer.testing import sdpa_calls
from attention.layer.tokens import Tokens
from attention.model.decode import StaticDecode, supports_static
from attention.model.generation import generate, pad_prompts, stream
from attention.model.gpt import GPTModel
from tests.model.test_generation import VOCAB
from tests.model.test_generation import gpt as generation_gpt

VARIANTS = {
    "gpt2": {},
    "rope, gqa": {"rope_base": 10000.0, "n_kv_heads": 2},
    "rope, window (ring)": {"rope_base": 10000.0, "window": 8},
    "rope, window, sinks": {"rope_base": 10000.0, "window": 8, "sinks": 2},
}


def gpt(device: torch.device | str = "cpu", **extra: Any) -> GPTModel:
    """test_generation's model with a context of 40, on `device`."""
    return generation_gpt(context_length=40, **extra).to(device)


def batch(device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, VOCAB, (n,), generator=g) for n in (2, 9, 5)]
    idx, mask = pad_prompts(rows)
    return idx.to(device), mask.to(device)


@pytest.mark.parametrize("padded", [False, True], ids=["one-length", "padded"])
@pytest.mark.parametrize("extra", VARIANTS.values(), ids=VARIANTS.keys())
def test_static_decode_writes_the_dynamic_steps_tokens(
    device: torch.device, extra: dict[str, Any], padded: bool
) -> None:
    """Greedy and sampled (a generator per row), 50 tokens: past the context (40), so the
    linear caches refill and the rings run on with positions counting past it."""
    model = gpt(device, **extra)
    idx, mask = batch(device)
    kw: dict[str, Any] = {"attention_mask": mask} if padded else {}
    ids = idx if padded else idx[:, -5:]
    for sample in ({}, {"temperature": 1.0, "top_k": 20}):
        outs = []
        for static in (False, True):
            gens = [torch.Generator(device).manual_seed(s) for s in range(3)]
            outs.append(generate(model, ids, 50, static=static, generator=gens, **sample, **kw))
        assert outs[0].shape == (3, ids.shape[1] + 50)
        assert torch.equal(outs[0], outs[1]), sample


@pytest.mark.parametrize("extra", VARIANTS.values(), ids=VARIANTS.keys())
def test_each_static_step_equals_the_float64_sequence_recomputed(
    device: torch.device, extra: dict[str, Any]
) -> None:
    """Logits of 12 static steps after a padded prefill, against the whole sequence run again
    in float64 without a cache (the reference), row by row without its padding."""
    model = gpt(device, **extra)
    idx, mask = batch(device)
    caches = model.init_caches(3, 40)
    with torch.no_grad():
        model(idx, caches, attention_mask=mask)
        decoder = StaticDecode(model, caches)
        tokens = torch.randint(0, VOCAB, (3, 12), device=device)
        steps = torch.stack([decoder(tokens[:, i : i + 1]).clone() for i in range(12)], 1)
        reference = model.double()
        for row, length in enumerate(mask.sum(1).tolist()):
            own = torch.cat((idx[row, idx.shape[1] - length :], tokens[row]))[None]
            want = reference(own)[0, length:]  # (12, vocab): after each new token
            assert_close(steps[row].double(), want, atol=2e-5, rtol=1e-5)
    assert caches[0].length == idx.shape[1] + 12  # the host's count advanced


def test_the_kernel_sees_every_slot_at_every_step() -> None:
    """Static shapes: each step's SDPA gets the same `(b, 1, 1, slots)` mask, where the
    dynamic step's keys grow by one a step."""
    model = gpt()
    ids = torch.randint(0, VOCAB, (2, 6))
    shapes = {}
    for static in (False, True):
        with sdpa_calls() as calls:
            generate(model, ids, 5, static=static)
        shapes[static] = [call.mask_shape for call in calls[2:]]  # the decode steps' calls
    assert set(shapes[True]) == {(2, 1, 1, 40)}  # all 40 slots, masked by position
    assert shapes[False] == [None] * 8  # the live keys only, no mask: 7, 8, 9, 10 of them


@pytest.mark.parametrize("extra", [{}, VARIANTS["rope, window, sinks"]], ids=["gpt2", "ring"])
def test_a_static_step_reads_no_tensor_value(extra: dict[str, Any]) -> None:
    """On `meta` there are no values: a read on the host (what stops a CUDA graph) raises."""
    with torch.device("meta"):
        model = gpt("meta", **extra)
        caches = model.init_caches(2, 12)
        ids = torch.zeros(2, 5, dtype=torch.long)
    with torch.no_grad():
        model.logits(ids, caches)
        decoder = StaticDecode(model, caches, graph=False)
        assert decoder(ids[:, :1]).shape == (2, VOCAB)
        assert decoder(ids[:, :1]).shape == (2, VOCAB)
    assert caches[0].length == 7


@pytest.mark.parametrize("padded", [False, True], ids=["one-length", "padded"])
@pytest.mark.parametrize("extra", VARIANTS.values(), ids=VARIANTS.keys())
def test_static_and_dynamic_steps_mix_on_the_same_caches(
    extra: dict[str, Any], padded: bool
) -> None:
    """One cache contract: static steps (every slot) and dynamic steps (the filled slots)
    interleaved on the same caches, linear, ring, padded, with sinks, equal one uncached
    forward over the whole sequence (float64)."""
    model = gpt(**extra).double()
    idx, mask = batch("cpu")
    if not padded:
        idx, mask = idx[:, -5:], torch.ones(3, 5, dtype=torch.long)
    tokens = torch.randint(0, VOCAB, (3, 14), generator=torch.Generator().manual_seed(1))
    caches = model.init_caches(3, 40)
    with torch.no_grad():
        model(idx, caches, attention_mask=mask)
        decoder = StaticDecode(model, caches, graph=False)
        steps = []
        for i in range(14):  # static, dynamic, static, static, dynamic, ...
            token = tokens[:, i : i + 1]
            steps.append(model(token, caches)[:, -1] if i % 3 == 1 else decoder(token))
        whole = torch.cat((idx, tokens), dim=1)
        every = torch.cat((mask, torch.ones_like(tokens)), dim=1)
        want = model(whole, attention_mask=every)[:, idx.shape[1] :]  # after each new token
    assert_close(torch.stack(steps, dim=1), want, atol=1e-10, rtol=0)
    assert caches[0].length == whole.shape[1]


def test_a_cache_writes_each_row_at_its_positions_slot() -> None:
    """A padded prefill then a static step: a linear cache's rows fill their own next slots,
    a ring's take k + (p - k) mod w; each slot's position is kept per row."""
    model = gpt(**VARIANTS["rope, window, sinks"])
    idx, mask = batch("cpu")
    caches = model.init_caches(3)
    with torch.no_grad():
        model(idx, caches, attention_mask=mask)
    ring = caches[0]
    # rows of 2, 9 and 5 tokens: row 0 holds positions 0, 1 (sinks), row 1 0..9 in a ring of 10
    assert ring.positions[0, :2].tolist() == [0, 1]
    assert sorted(p for p in ring.positions[1, : ring.slots].tolist() if p >= 0) == list(range(9))
    assert ring.next.tolist() == [2, 9, 5]
    keys = torch.randn(3, ring.keys.shape[1], 1, 8)  # (b, h_kv, 1, d_h)
    positions = torch.tensor([[2], [9], [5]])
    with ring.static_steps():
        out, _, stored = ring.update(Tokens(3, 1, torch.device("cpu"), given=positions), keys,
                                     keys.clone())  # fmt: skip
    assert out.shape[2] == ring.slots and stored.pos.shape == (3, ring.slots)  # every slot
    slots = [2, 2 + (9 - 2) % 8, 5]  # 2 is past the sinks; 9 wraps onto slot 2 + 7 mod 8
    for row, slot in enumerate(slots):
        assert ring.positions[row, slot] == positions[row, 0]
        assert torch.equal(ring.keys[row, :, slot], keys[row, :, 0])
    assert ring.next.tolist() == [3, 10, 6]


def test_hooks_run_on_every_static_step_on_the_cpu() -> None:
    model = gpt()
    seen: list[int] = []
    hook = model.blocks[0].att.register_forward_hook(lambda m, a, o: seen.append(a[0].shape[1]))
    try:
        generate(model, torch.randint(0, VOCAB, (1, 4)), 4, static=True)
    finally:
        hook.remove()
    assert seen == [4, 1, 1, 1]  # the prefill, then three steps


def test_sampling_draws_in_float32_whatever_the_models_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Hugging Face's generate: on CUDA the exponential draws behind torch.multinomial
    depend on the dtype, so drawing in the model's float64 gave other tokens for one seed."""
    dtypes = []
    original = torch.multinomial

    def spy(probs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        dtypes.append(probs.dtype)
        return original(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    for dtype in (torch.float64, torch.bfloat16):
        generate(gpt().to(dtype), torch.randint(0, VOCAB, (1, 4)), 3, temperature=1.0)
    assert dtypes == [torch.float32] * 6


def test_stream_takes_static_too() -> None:
    model = gpt()
    ids = torch.randint(0, VOCAB, (2, 3))
    tokens = list(stream(model, ids, 6, static=True))
    assert torch.equal(torch.cat([ids, *tokens], 1), generate(model, ids, 6, static=False))


def test_static_is_checked_by_name() -> None:
    model = gpt()
    ids = torch.randint(0, VOCAB, (1, 3))
    with pytest.raises(TypeError, match="static must be True or False"):
        generate(model, ids, 2, static="yes")  # type: ignore[arg-type]


def test_a_soft_capped_model_takes_the_static_step_on_the_cpu_only() -> None:
    """A soft cap has no additive form: the CPU's explicit path is static, CUDA's
    FlexAttention is not (it compiles and plans on the host)."""
    model = gpt()
    for block in model.blocks:
        capped = MultiHeadAttention(32, 32, 40, 0.0, num_heads=4, qkv_bias=True,
                                    score_mods=[softcap(30.0)])  # fmt: skip
        capped.load_state_dict(block.att.state_dict())
        block.att = capped.eval()
    assert supports_static(model)
    ids = torch.randint(0, VOCAB, (1, 4))
    assert torch.equal(generate(model, ids, 6, static=True), generate(model, ids, 6))
    if torch.cuda.is_available():
        cuda = model.to("cuda")
        assert not supports_static(cuda)
        with pytest.raises(ValueError, match="static=True"):
            generate(cuda, ids.cuda(), 2, static=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_on_cuda_the_step_is_recorded_once_and_replayed() -> None:
    model = gpt("cuda")
    caches = model.init_caches(1)
    ids = torch.randint(0, VOCAB, (1, 8), device="cuda")
    with torch.no_grad():
        model(ids[:, :4], caches)
        decoder = StaticDecode(model, caches)
        logits = [decoder(ids[:, i : i + 1]).clone() for i in range(4, 8)]
        assert decoder._graph is not None  # the first step warmed up, the second recorded
        want = model(ids)[0, 4:]
    assert_close(torch.cat(logits), want, atol=1e-4, rtol=1e-4)


def test_a_token_that_does_not_fit_is_refused_before_any_cache_moves() -> None:
    model = gpt()
    caches = model.init_caches(2, 12)
    with torch.no_grad():
        model.logits(torch.zeros(2, 5, dtype=torch.long), caches)
        decoder = StaticDecode(model, caches, graph=False)
        for token, words in (
            (
                torch.zeros(1, 1, dtype=torch.long),
                r"\(batch_size, 1\) = \(2, 1\), one per row, "
                r"got torch.int64 \(1, 1\)",
            ),  # broadcast
            (torch.zeros(2), r"got torch.float32 \(2,\)"),
            (torch.full((2, 1), 0.7), r"got torch.float32 \(2, 1\)"),  # truncated to 0
            (torch.full((2, 1), VOCAB), rf"token must be in 0 .. {VOCAB - 1}"),
        ):
            with pytest.raises(ValueError, match=words):
                decoder(token)
    assert all(cache.length == 5 for cache in caches)
