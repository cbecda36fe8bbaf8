"""The book's GPT, the key/value cache and generation.

A cache is only an optimisation: every output of a cached run must equal the uncached
computation of the same tokens, step by step, in every configuration.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.testing import assert_close

from attention import MultiHeadAttention
from attention.layer.cache import KVCache
from attention.layer.testing import padding_mask
from attention.model.generation import generate, generate_text_simple
from attention.model.gpt import GPT_CONFIG_124M, GPTModel
from tests.expected import BOOK_BATCH, BOOK_LOGITS_FIRST

# The book, chapter 4: "Every effort moves you", "Every day holds a" through GPTModel(124M)
# under torch.manual_seed(123), in training mode (dropout on), and "Hello, I am" greedily.
BOOK_LOGITS_LAST = torch.tensor([[0.4023, 0.0532], [-0.1858, 0.0388]])  # [:, 3, -2:]
BOOK_HELLO = [15496, 11, 314, 716]
BOOK_GREEDY = [27018, 24086, 47843, 30961, 42348, 7267, 49706, 43231, 47062, 34657]


@pytest.fixture(scope="module")
def book_model() -> GPTModel:
    torch.manual_seed(123)
    return GPTModel(GPT_CONFIG_124M)


@pytest.mark.slow(seconds=3)
def test_the_books_seeded_124m_model_prints_the_books_numbers(book_model: GPTModel) -> None:
    assert sum(p.numel() for p in book_model.parameters()) == 163_009_536
    with torch.no_grad():  # as in the book: fresh from the constructor, dropout on
        torch.manual_seed(123)
        model = GPTModel(GPT_CONFIG_124M)  # the same seed, then the forward pass
        out = model(BOOK_BATCH)  # (2, 4, 50257)
    assert out.shape == (2, 4, 50257)
    assert_close(out[:, 0, :3], BOOK_LOGITS_FIRST, atol=6e-5, rtol=0)
    assert_close(out[:, 3, -2:], BOOK_LOGITS_LAST, atol=6e-5, rtol=0)


@pytest.mark.slow(seconds=3)
def test_greedy_generation_reproduces_the_book_with_and_without_the_cache(
    book_model: GPTModel,
) -> None:
    book_model.eval()
    prompt = torch.tensor([BOOK_HELLO])
    simple = generate_text_simple(book_model, prompt, max_new_tokens=6, context_size=1024)
    assert simple[0].tolist() == BOOK_HELLO + BOOK_GREEDY[:6]
    for use_cache in (True, False):
        out = generate(book_model, prompt, max_new_tokens=10, use_cache=use_cache)
        assert out[0].tolist() == BOOK_HELLO + BOOK_GREEDY


# ----------------------------------------------------------------------------- the cache
D, H, CONTEXT = 16, 4, 24


def module(kv_heads: int, rope: bool, window: int | None) -> MultiHeadAttention:
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, D, CONTEXT, 0.0, H, qkv_bias=True, num_kv_heads=kv_heads,
                             rope=rope, window=window)  # fmt: skip
    return mha.double().eval()


@pytest.mark.parametrize(
    ("kv_heads", "rope", "window"), list(itertools.product([4, 2, 1], [False, True], [None, 1, 5]))
)
@pytest.mark.parametrize("chunks", [[20], [1] * 20, [7, 1, 1, 4, 7], [3, 17]])
@pytest.mark.parametrize("need_weights", [False, True])
def test_cached_equals_uncached_chunk_by_chunk(
    kv_heads: int, rope: bool, window: int | None, chunks: list[int], need_weights: bool
) -> None:
    """A prompt in one call or in chunks, then one token at a time: every output of every
    chunk equals the uncached run over the whole sequence, at those positions."""
    mha = module(kv_heads, rope, window)
    x = torch.randn(3, sum(chunks), D, dtype=torch.float64)
    with torch.no_grad():
        full = mha(x, need_weights=True)  # (3, T, D), weights (3, H, T, T)
        cache = mha.init_cache(3, max_tokens=CONTEXT)
        start = 0
        for n in chunks:
            part = x[:, start : start + n]
            if need_weights and cache.ring:  # columns: the ring's slots and the chunk
                out, weights = mha(part, need_weights=True, cache=cache)
                assert weights.shape[:3] == (3, H, n) and weights.shape[3] <= window + n
                assert_close(weights.sum(-1), torch.ones(3, H, n, dtype=weights.dtype))
            elif need_weights:
                out, weights = mha(part, need_weights=True, cache=cache)
                assert weights.shape == (3, H, n, start + n)
                assert_close(
                    weights, full[1][:, :, start : start + n, : start + n], atol=1e-12, rtol=0
                )
            else:
                out = mha(part, cache=cache)
            assert_close(out, full[0][:, start : start + n], atol=1e-12, rtol=0)
            start += n
    assert cache.length == sum(chunks)


@settings(max_examples=30, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 6), min_size=1, max_size=8).filter(lambda c: sum(c) <= 20),
    kv_heads=st.sampled_from([4, 2, 1]),
    rope=st.booleans(),
    window=st.sampled_from([None, 1, 2, 6]),
    pad=st.integers(0, 3),
)
def test_cached_equals_uncached_with_left_padded_prompts(
    chunks: list[int], kv_heads: int, rope: bool, window: int | None, pad: int
) -> None:
    """Batched generation pads short prompts on the left: the padding stays masked in the
    cache for every later step, and every real output equals the uncached one."""
    mha = module(kv_heads, rope, window)
    total = pad + sum(chunks)
    x = torch.randn(2, total, D, dtype=torch.float64)
    padding = padding_mask([total, total - pad], total, side="left")  # row 1: pad fillers
    with torch.no_grad():
        full = mha(x, padding, need_weights=True)[0]
        cache = mha.init_cache(2, max_tokens=CONTEXT)
        start, outs = 0, []
        for n in [pad, *chunks] if pad else chunks:
            outs.append(mha(x[:, start : start + n], padding[:, start : start + n], cache=cache))
            start += n
    assert_close(torch.cat(outs, dim=1), full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("cfg_extra", [{}, {"n_kv_heads": 2}, {"rope_base": 10000.0}, {"window": 3},
                                       {"n_kv_heads": 1, "rope_base": 500000.0, "window": 4}])  # fmt: skip
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_generation_is_the_same_with_and_without_the_cache(
    cfg_extra: dict[str, object], batch: int
) -> None:
    """Past the context length too: the cached loop refills its cache as the uncached one
    re-reads the last context_size tokens."""
    cfg = {"vocab_size": 64, "context_length": 12, "emb_dim": 16, "n_heads": 4,
           "n_layers": 2, "drop_rate": 0.0, "qkv_bias": True, **cfg_extra}  # fmt: skip
    torch.manual_seed(0)
    model = GPTModel(cfg).double().eval()
    prompt = torch.randint(0, 64, (batch, 5))
    cached = generate(model, prompt, max_new_tokens=15, use_cache=True)  # 20 > 12 tokens
    uncached = generate(model, prompt, max_new_tokens=15, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached.shape == (batch, 20)


def test_sampling_top_k_and_eos() -> None:
    cfg = {"vocab_size": 32, "context_length": 16, "emb_dim": 16, "n_heads": 2,
           "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
    torch.manual_seed(0)
    model = GPTModel(cfg).eval()
    prompt = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        logits = model(prompt)[0, -1]
    top2 = set(torch.topk(logits, 2).indices.tolist())
    torch.manual_seed(1)
    sampled = generate(model, prompt, max_new_tokens=1, temperature=1.0, top_k=2)
    assert sampled[0, -1].item() in top2  # top-k keeps only the 2 most likely
    greedy_next = int(logits.argmax())
    stopped = generate(model, prompt, max_new_tokens=5, eos_id=greedy_next)
    assert stopped.tolist() == [[1, 2, 3, greedy_next]]  # the end id is written, then stop


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m, c: m(torch.randn(2, 5, D, dtype=torch.float64), cache=c), ValueError,
         r"cache was made for batch_size=3, got a batch of 2"),
        (lambda m, c: [m(torch.randn(3, 6, D, dtype=torch.float64), cache=c) for _ in range(2)],
         ValueError, r"cache holds 6 of max_tokens=8 tokens: 6 more do not fit"),
        (lambda m, c: m.init_cache(3, max_tokens=CONTEXT + 1), ValueError,
         r"max_tokens=25 is longer than context_length=24"),
        (lambda m, c: (lambda e: e(torch.randn(3, 2, D), cache=e.init_cache(3)))(MultiHeadAttention(D, D, CONTEXT, 0.0, H, causal=False)),
         ValueError, r"cache is empty: the first cross-attention call passes key="),
        (lambda m, c: m(torch.randn(3, 2, D, dtype=torch.float64), cache="cache"), TypeError,
         r"cache must be a KVCache \(from init_cache\), got str"),
    ],
)  # fmt: skip
def test_cache_errors_name_both_numbers(
    call: Callable[[MultiHeadAttention, KVCache], object], error: type[Exception], match: str
) -> None:
    mha = module(2, True, None)
    cache = mha.init_cache(3, max_tokens=8)
    with pytest.raises(error, match=match):
        call(mha, cache)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: GPTModel({"vocab_size": 5}), ValueError, r"missing \['context_length'"),
        (lambda: GPTModel({**GPT_CONFIG_124M, "n_layer": 2}), ValueError, r"unknown \['n_layer'\]"),
        (lambda: GPTModel({**GPT_CONFIG_124M, "drop_rate": 1.5}), ValueError, r"drop_rate must be a probability"),
        (lambda: generate(torch.nn.Linear(2, 2), torch.tensor([[1]]), 2), TypeError, r"model must be a GPTModel"),
    ],
)  # fmt: skip
def test_model_and_generation_errors(
    call: Callable[[], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call()


def test_generation_argument_errors() -> None:
    cfg = {"vocab_size": 32, "context_length": 8, "emb_dim": 8, "n_heads": 2,
           "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
    model = GPTModel(cfg).eval()
    prompt = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0, got -1"):
        generate(model, prompt, 2, temperature=-1)
    with pytest.raises(ValueError, match=r"top_k must be >= 1, got 0"):
        generate(model, prompt, 2, top_k=0)
    with pytest.raises(ValueError, match=r"idx must be in 0 .. 31"):
        generate(model, torch.tensor([[40]]), 2)
    with pytest.raises(
        ValueError, match=r"0 cached \+ 9 new tokens is longer than context_length=8"
    ):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    "cfg_extra", [{}, {"rope_base": 10000.0, "window": 4, "n_kv_heads": 2, "sinks": 1}]
)
@pytest.mark.slow(seconds=3)
def test_a_decode_step_compiles_to_one_graph(cfg_extra: dict[str, object]) -> None:
    """No graph break (no host synchronisation, no data-dependent Python branch) in a decode
    step: `fullgraph=True` refuses any. The compiled step equals the eager one."""
    torch._dynamo.reset()
    cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
           "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False, **cfg_extra}  # fmt: skip
    model = GPTModel(cfg).eval()
    prompt, token = torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 1))
    step = torch.compile(model.logits, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        eager_caches, compiled_caches = model.init_caches(2), model.init_caches(2)
        model.logits(prompt, eager_caches)
        model.logits(prompt, compiled_caches)
        assert_close(step(token, compiled_caches), model.logits(token, eager_caches))
    assert compiled_caches[0].length == eager_caches[0].length == 7


@pytest.mark.inductor
@pytest.mark.heavy(seconds=20)  # with an empty compile cache: started among the first
@pytest.mark.xdist_group("inductor")  # one worker pays inductor's start-up for all
def test_a_decode_step_compiles_with_inductor() -> None:
    """The real backend on one block (the graph test above has two, each the same code)."""
    torch._dynamo.reset()
    cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4,
           "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False, "rope_base": 10000.0}  # fmt: skip
    model = GPTModel(cfg).eval()
    prompt, token = torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 1))
    step = torch.compile(model.logits, fullgraph=True)
    with torch.no_grad():
        eager_caches, compiled_caches = model.init_caches(2), model.init_caches(2)
        model.logits(prompt, eager_caches)
        model.logits(prompt, compiled_caches)
        assert_close(step(token, compiled_caches), model.logits(token, eager_caches),
                     atol=1e-5, rtol=1e-5)  # fmt: skip


def test_sampling_arguments_and_shared_caches_are_refused_by_name() -> None:
    cfg = {"vocab_size": 32, "context_length": 8, "emb_dim": 8, "n_heads": 2,
           "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
    model = GPTModel(cfg).eval()
    prompt = torch.tensor([[1, 2]])
    for kwargs, match in [
        ({"eos_id": 32}, r"eos_id must be in 0 .. 31 \(vocab_size=32\), got 32"),
        ({"temperature": float("inf")}, r"temperature must be a finite number >= 0, got inf"),
    ]:
        with pytest.raises(ValueError, match=match):
            generate(model, prompt, 2, **kwargs)  # type: ignore[arg-type]
    out = generate(model, prompt, 3, temperature=1e-40)  # tiny: greedy-like, not NaN
    assert torch.equal(out, generate(model, prompt, 3))
    cache = model.trf_blocks[0].att.init_cache(1, 8)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"caches must be distinct KVCache objects"):
        model(prompt, caches=[cache, cache])
    with pytest.raises(
        TypeError,
        match=r"caches must hold one cache per block \(a KVCache, or a linear layer's state",
    ):
        model(prompt, caches=[None, None])  # type: ignore[list-item]
    assert generate(model, prompt[:0], 3).shape == (0, 2)  # no row: nothing to write


def test_layer_norm_and_gelu_are_the_books_formulas() -> None:
    """The fused kernels compute the formulas the book writes out, to rounding."""
    from attention.model.gpt import GELU, LayerNorm

    x = torch.randn(4, 7, 16, dtype=torch.float64) * 3
    norm = LayerNorm(16).double()
    with torch.no_grad():
        norm.scale.uniform_(0.5, 2.0)
        norm.shift.uniform_(-1.0, 1.0)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    assert_close(norm(x), norm.scale * (x - mean) / torch.sqrt(var + 1e-5) + norm.shift)
    tanh = torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x**3))
    assert_close(GELU()(x), 0.5 * x * (1 + tanh))


def assert_one_greedy_pass(
    cfg: dict[str, object], model: GPTModel, out: torch.Tensor, prompt_tokens: int
) -> None:
    """`out`'s new tokens are what one uncached pass over all of it picks, greedily, through a
    copy of `model` (made from `cfg`) long enough to take it (RoPE: no weight depends on
    `context_length`)."""
    whole = GPTModel({**cfg, "context_length": out.shape[1]})
    whole = whole.to(model.tok_emb.weight.dtype).eval()
    whole.load_state_dict(model.state_dict())
    with torch.no_grad():
        greedy = whole(out[:, :-1]).argmax(-1)[:, prompt_tokens - 1 :]  # each next token
    assert torch.equal(greedy, out[:, prompt_tokens:])


def test_an_unbounded_model_takes_a_prompt_longer_than_its_context_in_chunks() -> None:
    cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": False, "rope_base": 10000.0, "window": 5}  # fmt: skip
    model = GPTModel(cfg).eval()
    prompt = torch.randint(0, 50, (2, 40))  # 2.5 x context_length
    assert_one_greedy_pass(cfg, model, generate(model, prompt, 8), 40)


def test_dropout_runs_in_training_and_is_skipped_in_eval() -> None:
    """The blocks skip their dropout calls in eval (the identity there), not in training."""
    cfg = {"vocab_size": 16, "context_length": 8, "emb_dim": 8, "n_heads": 2,
           "n_layers": 2, "drop_rate": 0.5, "qkv_bias": False}  # fmt: skip
    model = GPTModel(cfg)
    calls: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and "att" not in name:
            module.register_forward_hook(lambda m, i, o, name=name: calls.append(name))
    ids = torch.randint(0, 16, (2, 8))
    first, second = model(ids), model(ids)
    assert len(calls) == 2 * (1 + 2 * 2)  # drop_emb and two per block, each call
    assert not torch.allclose(first, second)
    calls.clear()
    model.eval()
    assert_close(model(ids), model(ids), atol=0, rtol=0)
    assert calls == []


def test_an_unbounded_model_generates_four_context_lengths_in_its_window() -> None:
    """RoPE and a window (with a sink) in every block: 4 x context_length tokens through ring
    buffers of window + sinks slots, allocated once, equal to one uncached pass."""
    cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": False, "rope_base": 10000.0, "window": 5,
           "sinks": 1}  # fmt: skip
    torch.manual_seed(0)
    model = GPTModel(cfg).double().eval()
    made: list[tuple[KVCache, int]] = []  # each cache, and where its keys were allocated
    init_caches = model.init_caches

    def record(*args: int) -> list[KVCache]:
        caches = init_caches(*args)
        made.extend((cache, cache.keys.data_ptr()) for cache in caches)
        return caches

    model.init_caches = record  # type: ignore[method-assign]
    prompt = torch.randint(0, 50, (2, 4))
    out = generate(model, prompt, 60)  # 64 tokens: 4 x context_length
    assert out.shape == (2, 64) and len(made) == 2
    for cache, keys_at in made:  # constant memory: the window and the sink, written in place
        assert cache.ring and cache.slots == 5 + 1 and cache.length == 63
        assert cache.keys.data_ptr() == keys_at
    assert_one_greedy_pass(cfg, model, out, 4)


@pytest.mark.parametrize("extra", [{}, {"rope_base": 10_000.0, "n_kv_heads": 1}])
def test_packed_documents_see_only_themselves(extra: dict[str, object]) -> None:
    torch.manual_seed(0)
    cfg = {"vocab_size": 20, "context_length": 16, "emb_dim": 16, "n_heads": 2, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": False, **extra}  # fmt: skip
    model = GPTModel(cfg).eval()
    a, b = torch.randint(20, (1, 5)), torch.randint(20, (1, 7))
    docs = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        packed = model(torch.cat([a, b], dim=1), document_ids=docs)
        assert_close(packed[:, :5], model(a))  # the first document: as if alone
        changed = model(torch.cat([a, b.flip(1)], dim=1), document_ids=docs)
    assert_close(changed[:, :5], packed[:, :5], atol=0, rtol=0)  # nothing leaks backwards
    if "rope_base" in extra:  # relative positions: the second document too is as if alone
        assert_close(packed[:, 5:], model(b), atol=2e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="document_ids: give them without caches"):
        model(a, document_ids=docs[:, :5], attention_mask=torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="document_ids"):
        model(a, document_ids=docs)  # (1, 12) for 5 tokens


SMALL = {"vocab_size": 50, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
         "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
ROPE_WINDOW = {"rope_base": 10000.0, "window": 4, "n_kv_heads": 2}


@pytest.mark.parametrize("extra", [{}, ROPE_WINDOW], ids=["gpt2", "rope-window-gqa"])
def test_hooks_on_a_blocks_attention_fire_inside_the_model(extra: dict[str, object]) -> None:
    """A block calls its attention module (the one forward), so its hooks see every call."""
    torch.manual_seed(0)
    model = GPTModel({**SMALL, **extra}).eval()
    seen: list[tuple[int, Tensor]] = []
    att = model.blocks[1].att
    hook = att.register_forward_hook(lambda m, args, out: seen.append((args[0].shape[1], out)))
    try:
        ids = torch.randint(0, 50, (2, 9))
        with torch.no_grad():
            model(ids)
            generate(model, ids[:, :5], max_new_tokens=3)
    finally:
        hook.remove()
    assert [n for n, _ in seen] == [9, 5, 1, 1]  # the whole forward; a prefill, two steps
    assert seen[0][1].shape == (2, 9, SMALL["emb_dim"])


@pytest.mark.parametrize("extra", [{}, ROPE_WINDOW], ids=["gpt2", "rope-window-gqa"])
def test_a_forward_and_a_decode_step_read_no_tensor_value(extra: dict[str, object]) -> None:
    """Metadata checks only: on `meta` (no values at all) any read of a value would raise."""
    with torch.device("meta"):
        model = GPTModel({**SMALL, **extra}).eval()
        caches = model.init_caches(2, 12)
        ids = torch.zeros(2, 5, dtype=torch.long)
    assert model.logits(ids, caches).shape == (2, 5, 50)
    assert model.logits(ids[:, :1], caches).shape == (2, 1, 50)
    assert caches[0].length == 6


@pytest.mark.parametrize(
    ("extra", "ceiling"), [({}, 78.5), (ROPE_WINDOW, 87.3)], ids=["gpt2", "rope-window-gqa"]
)
def test_a_decode_step_enters_no_more_python_functions_than_before(
    extra: dict[str, object], ceiling: float
) -> None:
    """Counted, not timed: the calls per layer-step bound what the checked module call may
    cost (a098dd2: 74.5 and 84.2 with torch 2.13; one position per token, the issue 35
    rework: 78.4 and 87.25, the queries' and keys' `Tokens`, the plan and its run)."""
    from attention_bench.calls import decode_calls

    model = GPTModel({**SMALL, "n_layers": 12, "context_length": 64, **extra}).eval()
    assert decode_calls(model)["per_layer"] <= ceiling


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"positions": torch.zeros(2, 4)},
            TypeError,
            "positions must be integers, got dtype torch.float32",
        ),
        ({"positions": torch.zeros(2, 3, dtype=torch.long)}, ValueError, r"\(2, 5\)"),
        ({"angles": (torch.zeros(5, 8),)}, ValueError, "angles must be RoPE's"),
        ({"angles": "cos, sin"}, ValueError, "angles must be RoPE's"),
        (
            {"angles": (torch.ones(5, 8, dtype=torch.long), torch.zeros(5, 8))},
            TypeError,
            r"angles must be floating-point \(cos, sin\), got cos of torch.int64",
        ),
        (
            {"angles": (torch.ones(5, 8), torch.zeros(5, 8, dtype=torch.long))},
            TypeError,
            r"got sin of torch.int64",
        ),
        (
            {"angles": (torch.ones(5, 8), torch.zeros(5, 8, device="meta"))},
            ValueError,
            r"angles must be on the input's device cpu, got sin on meta",
        ),
        ({"need_weights": 1}, TypeError, "need_weights"),
    ],
)
def test_the_forwards_model_arguments_are_checked_by_name(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    layer = MultiHeadAttention(16, 16, 8, 0.0, num_heads=2, rope=True)
    with pytest.raises(error, match=match):
        layer(torch.randn(2, 5, 16), **kwargs)


def test_angles_on_a_layer_without_rope_are_refused() -> None:
    layer = MultiHeadAttention(16, 16, 8, 0.0, num_heads=2)
    with pytest.raises(ValueError, match=r"rope=True \(rope=False\)"):
        layer(torch.randn(2, 5, 16), angles=(torch.zeros(5, 8), torch.zeros(5, 8)))
