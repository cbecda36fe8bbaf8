"""Generation as users run it (`attention.model.generation`): batches of prompts of different lengths,
stops per row, top-k / top-p / temperature with generators, eval mode, streaming, bad input.

The central property: a left-padded batch writes, row by row, exactly the tokens each prompt
writes alone (greedy, and sampled with one generator per row), cached or not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from attention.model.generation import generate, pad_prompts, stream
from attention.model.gpt import GPTModel

LENGTHS = (3, 17, 64, 200)
VOCAB = 97
VARIANTS = {
    "learned positions": {},
    "rope, gqa": {"rope_base": 10000.0, "n_kv_heads": 2},
    "rope, window (unbounded)": {"rope_base": 10000.0, "window": 16},
}


def gpt(context_length: int = 232, **extra: Any) -> GPTModel:
    cfg = {"vocab_size": VOCAB, "context_length": context_length, "emb_dim": 32, "n_heads": 4,
           "n_layers": 2, "drop_rate": 0.0, "qkv_bias": True, **extra}  # fmt: skip
    torch.manual_seed(0)
    return GPTModel(cfg).eval()


def prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]


def own_part(out: torch.Tensor, row: int, length: int) -> torch.Tensor:
    """Row `row` of a left-padded batch's output, without its padding."""
    return out[row, max(LENGTHS) - length :]


@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("extra", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.slow(seconds=2)
def test_a_padded_batch_writes_what_each_prompt_writes_alone(
    extra: dict[str, Any], use_cache: bool
) -> None:
    """Lengths 3, 17, 64 and 200 together; 232 positions, so the cached loop of the models
    with a context limit refills its caches (200 + 40 > 232)."""
    model = gpt(**extra)
    rows = prompts()
    idx, mask = pad_prompts(rows)
    assert idx.shape == (4, 200) and mask.sum(1).tolist() == list(LENGTHS)
    sample = {"temperature": 1.0, "top_k": 40, "top_p": 0.9}
    greedy = generate(model, idx, 40, attention_mask=mask, use_cache=use_cache)
    sampled = generate(model, idx, 40, attention_mask=mask, use_cache=use_cache, **sample,
                       generator=[torch.Generator().manual_seed(s) for s in range(4)])  # fmt: skip
    for i, row in enumerate(rows):
        alone = generate(model, row[None], 40, use_cache=use_cache)[0]
        assert torch.equal(own_part(greedy, i, len(row)), alone)
        alone = generate(model, row[None], 40, use_cache=use_cache, **sample,
                         generator=torch.Generator().manual_seed(i))[0]  # fmt: skip
        assert torch.equal(own_part(sampled, i, len(row)), alone)
    assert not torch.equal(greedy, sampled)


@pytest.mark.parametrize("extra", VARIANTS.values(), ids=VARIANTS.keys())
def test_padding_moves_no_position(extra: dict[str, Any]) -> None:
    """The forward with an attention_mask: a padded row's logits are its logits alone, and
    decoding on from padded caches continues each row's own positions."""
    model = gpt(**extra).double()
    short, long = torch.randint(0, VOCAB, (1, 5)), torch.randint(0, VOCAB, (1, 12))
    idx, mask = pad_prompts([short[0], long[0]])
    token = torch.randint(0, VOCAB, (2, 1))
    with torch.no_grad():
        caches = model.init_caches(2)
        padded = model(idx, caches, attention_mask=mask)  # (2, 12, V)
        step = model(token, caches)  # (2, 1, V): the next token of each row
        assert caches[0].next.tolist() == [6, 13]  # each row's next position: 5 + 1, 12 + 1
        for row, ids in enumerate((short, long)):
            alone = model(torch.cat((ids, token[row : row + 1]), dim=1))
            assert_close(padded[row, 12 - ids.shape[1] :], alone[0, :-1], atol=1e-12, rtol=0)
            assert_close(step[row, 0], alone[0, -1], atol=1e-12, rtol=0)


def test_each_row_stops_on_its_own_end_ids() -> None:
    """Row 0 writes an end id early: it is written, then the row holds `pad_id`; the other
    row goes on and writes what it writes alone; it all stops once every row has ended."""
    model = gpt()
    a, b = torch.randint(0, VOCAB, (1, 6)), torch.randint(0, VOCAB, (1, 6))
    free_a, free_b = generate(model, a, 12)[0, 6:], generate(model, b, 12)[0, 6:]
    end = int(free_a[2])  # row a's third token
    assert end not in free_b.tolist()
    out = generate(model, torch.cat((a, b)), 12, eos_id=[VOCAB - 1, end], pad_id=0)
    first = free_a.tolist().index(end)  # where row a ends
    assert out[0, 6:].tolist() == free_a[: first + 1].tolist() + [0] * (11 - first)
    assert torch.equal(out[1, 6:], free_b)  # not stopped by its neighbour
    both = generate(model, torch.cat((a, a)), 12, eos_id=end)
    assert both.shape == (2, 6 + first + 1)  # every row ended: no more steps
    assert (both[:, -1] == end).all()


def test_stream_yields_the_tokens_generate_writes() -> None:
    model = gpt(rope_base=10000.0)
    idx, mask = pad_prompts([[1, 2, 3], [4, 5, 6, 7, 8]])
    tokens = list(stream(model, idx, 7, attention_mask=mask, eos_id=3))
    out = generate(model, idx, 7, attention_mask=mask, eos_id=3)
    assert all(token.shape == (2, 1) for token in tokens)
    assert torch.equal(torch.cat([idx, *tokens], dim=1), out)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1.5"):
        stream(model, idx, 7, top_p=1.5)  # checked at the call, before any token


def test_eval_mode_inside_each_step_and_every_modules_mode_given_back() -> None:
    model = gpt()
    model.trf_blocks[0].drop_shortcut.p = 0.9  # type: ignore[union-attr]  # dropout would show
    prompt = torch.randint(0, VOCAB, (2, 5))
    expected = generate(model.eval(), prompt, 8)
    model.train()
    model.trf_blocks[1].eval()  # a submodule in its own mode
    modes = [m.training for m in model.modules()]
    assert torch.equal(generate(model, prompt, 8), expected)
    assert [m.training for m in model.modules()] == modes
    first, second = stream(model, prompt, 8), stream(model, prompt, 8)
    tokens = [next(first), next(second)]
    assert [m.training for m in model.modules()] == modes  # between steps: the caller's
    tokens += [*first, *second]  # two streams of one model, interleaved: each as if alone
    assert torch.equal(torch.cat([prompt, *tokens[:1], *tokens[2:9]], dim=1), expected)
    assert [m.training for m in model.modules()] == modes


def test_generators_make_sampling_reproducible_and_leave_the_global_rng_alone() -> None:
    model = gpt()
    prompt = torch.randint(0, VOCAB, (3, 4))
    torch.manual_seed(5)
    before = torch.get_rng_state()
    one = generate(model, prompt, 10, temperature=1.5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), before)
    again = generate(model, prompt, 10, temperature=1.5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(one, again)
    torch.manual_seed(7)  # the global generator (Hugging Face's), seeded alike, draws alike
    assert torch.equal(one, generate(model, prompt, 10, temperature=1.5))


def test_top_k_larger_than_the_vocabulary_and_top_p_one_filter_nothing() -> None:
    model = gpt()
    prompt = torch.randint(0, VOCAB, (2, 4))

    def sampled(**kwargs: Any) -> torch.Tensor:
        g = torch.Generator().manual_seed(3)
        return generate(model, prompt, 10, temperature=1.0, generator=g, **kwargs)

    plain = sampled()
    assert torch.equal(sampled(top_k=VOCAB + 50), plain)  # clamped, as Hugging Face does
    assert torch.equal(sampled(top_p=1.0), plain)
    assert torch.equal(sampled(top_p=1e-6), generate(model, prompt, 10))  # the top token only


def test_top_p_keeps_the_nucleus_as_hugging_face_does() -> None:
    transformers = pytest.importorskip(
        "transformers", minversion="5.24"
    )  # 5.24 names the cache `cache=`
    from attention.model.sampling import nucleus

    logits = torch.randn(4, VOCAB, dtype=torch.float64) * 3
    for top_p in (0.1, 0.5, 0.9, 0.99):
        theirs = transformers.TopPLogitsWarper(top_p)(None, logits.clone())
        assert torch.equal(nucleus(logits, top_p).isinf(), theirs.isinf())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"idx": torch.tensor([1, 2])}, ValueError, r"idx must be \(batch, num_tokens\) with at least one token, got shape \(2,\) \(one prompt: idx\[None\]\)"),
        ({"idx": torch.zeros(1, 0, dtype=torch.long)}, ValueError, r"with at least one token, got shape \(1, 0\)"),
        ({"idx": [[1, 2], [3]]}, ValueError, r"idx rows must have one length, got \[2, 1\] \(pad_prompts pads prompts\)"),
        ({"temperature": float("inf"), "top_k": 3}, ValueError, r"temperature must be a finite number >= 0, got inf"),
        ({"temperature": True}, TypeError, r"temperature must be a number >= 0, got True"),
        ({"temperature": "1"}, TypeError, r"temperature must be a number >= 0, got '1'"),
        ({"eos_id": "a"}, TypeError, r"eos_id must be a token id \(an int, or a list of ints\), got 'a'"),
        ({"eos_id": -1}, ValueError, r"eos_id must be in 0 .. 96 \(vocab_size=97\), got -1"),
        ({"eos_id": 1.5}, TypeError, r"eos_id must be a token id \(an int, or a list of ints\), got 1.5"),
        ({"eos_id": [3, 97]}, ValueError, r"eos_id must be in 0 .. 96 \(vocab_size=97\), got 97"),
        ({"pad_id": 97}, ValueError, r"pad_id must be in 0 .. 96 \(vocab_size=97\), got 97"),
        ({"top_k": 0}, ValueError, r"top_k must be >= 1, got 0"),
        ({"top_p": 0.0}, ValueError, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": True}, TypeError, r"top_p must be a number in \(0, 1\], got True"),
        ({"generator": 7}, TypeError, r"generator must be a torch.Generator or a list of one per row"),
        ({"generator": [torch.Generator()]}, ValueError, r"generator must be one torch.Generator per row: 2 rows, got 1"),
        ({"attention_mask": torch.ones(2, 3)}, TypeError, r"attention_mask must be bool or integer"),
        ({"attention_mask": torch.ones(2, 4, dtype=torch.long)}, ValueError, r"attention_mask must have the ids' shape \(2, 3\), got \(2, 4\)"),
        ({"attention_mask": torch.tensor([[1, 1, 2], [1, 1, 1]])}, ValueError, r"attention_mask must hold only 0 \(padding\) and 1 \(a token\), got 2"),
        ({"attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])}, ValueError, r"attention_mask must pad on the left"),
        ({"attention_mask": torch.tensor([[0, 0, 0], [1, 1, 1]])}, ValueError, r"attention_mask must pad on the left"),
        ({"max_new_tokens": -1}, ValueError, r"max_new_tokens must be >= 0, got -1"),
        ({"use_cache": 1}, TypeError, r"use_cache must be True or False, got 1 \(int\)"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    model = gpt(context_length=16)
    call = {"idx": torch.tensor([[1, 2, 3], [4, 5, 6]]), "max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=match):
        generate(model, **call)


def test_ids_as_lists_numpy_and_narrow_integer_dtypes() -> None:
    """What a user hands over is converted once and used converted."""
    model = gpt(context_length=16)
    ids = torch.tensor([[1, 2, 3]])
    expected = generate(model, ids, 4)
    with torch.no_grad():
        logits = model(ids)
        for other in ([[1, 2, 3]], np.array([[1, 2, 3]]), ids.to(torch.uint8), ids.short()):
            assert torch.equal(generate(model, other, 4), expected)  # type: ignore[arg-type]
            assert_close(model(other), logits)  # type: ignore[arg-type]


@pytest.mark.parametrize("extra", [{"window": 3}, {"rope_base": 10000.0, "window": 4, "sinks": 1}])
def test_padded_rows_with_windows_and_sinks_write_what_they_write_alone(
    extra: dict[str, Any],
) -> None:
    """Positions count real tokens: a window or a sink sees the same tokens, padded or not."""
    model = gpt(context_length=32, **extra).double()
    prompts_ = [[1, 2, 3, 4, 5, 6], [7, 8]]
    idx, mask = pad_prompts(prompts_)
    out = generate(model, idx, 9, attention_mask=mask)  # past the window: the ring wraps
    for row, prompt in enumerate(prompts_):
        alone = generate(model, torch.tensor([prompt]), 9)
        assert torch.equal(out[row, -9:], alone[0, -9:])


@pytest.mark.parametrize(
    ("prompts", "error", "match"),
    [
        ([], TypeError, r"prompts must be a non-empty list of token-id sequences"),
        ("abc", TypeError, r"prompts must be a non-empty list"),
        ([[1, 2], []], ValueError, r"prompts\[1\] must be a 1-D sequence of at least one token id, got shape \(0,\)"),
        ([[1, 2], [[3]]], ValueError, r"prompts\[1\] must be a 1-D sequence of at least one token id, got shape \(1, 1\)"),
        ([[1.5]], TypeError, r"prompts\[0\] must be integer ids"),
    ],
)  # fmt: skip
def test_pad_prompts_refuses_what_is_not_a_prompt(
    prompts: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        pad_prompts(prompts)


def test_a_smaller_context_size_holds_for_a_model_that_could_run_unbounded() -> None:
    """RoPE and a window could go on forever; asked for 3 tokens of context, the cached loop
    refills as the uncached one crops, and both write what the book's loop writes."""
    from attention.model.generation import generate_text_simple

    model = gpt(context_length=12, rope_base=500.0, window=5)
    prompt = torch.randint(0, VOCAB, (1, 8))
    book = generate_text_simple(model, prompt, 10, context_size=3)
    assert torch.equal(generate(model, prompt, 10, context_size=3), book)
    assert torch.equal(generate(model, prompt, 10, context_size=3, use_cache=False), book)


def test_numpy_numbers_tiny_temperatures_and_end_ids_as_a_tensor() -> None:
    model = gpt(context_length=16)
    prompt = torch.tensor([[1, 2, 3]])
    greedy = generate(model, prompt, 4)
    for temperature in (1e-46, 1e-300, np.float32(1e-46)):  # 0 in float32: greedy, not NaN
        assert torch.equal(generate(model, prompt, 4, temperature=temperature), greedy)
    same = generate(model, prompt, np.int64(4), top_k=np.int64(5), eos_id=np.int64(96))
    assert torch.equal(same, generate(model, prompt, 4, top_k=5, eos_id=96))
    end = int(greedy[0, 4])
    assert torch.equal(generate(model, prompt, 4, eos_id=torch.tensor([end, 96])), greedy[:, :5])


@pytest.mark.parametrize("extra", [{"window": 3}, {"rope_base": 10000.0, "window": 3, "sinks": 1}])
def test_padding_anywhere_changes_no_real_logit(extra: dict[str, Any]) -> None:
    """Padding between a row's tokens, or after cached ones, moves no position: a window and
    its sinks count real tokens."""
    model = gpt(context_length=16, **extra).double()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        alone = model(torch.tensor([[1, 4, 5]]))
        middle = model(ids, attention_mask=torch.tensor([[1, 0, 0, 1, 1]]))
        assert_close(middle[:, [0, 3, 4]], alone, atol=1e-12, rtol=0)
        caches = model.init_caches(1)
        model(ids[:, :3], caches)
        later = model(ids[:, 3:], caches, attention_mask=torch.tensor([[0, 1]]))[0, -1]
        assert_close(later, model(torch.tensor([[1, 2, 3, 5]]))[0, -1], atol=1e-12, rtol=0)


def test_pad_prompts_refuses_negative_ids() -> None:
    with pytest.raises(ValueError, match=r"prompts\[1\] must hold ids >= 0, got -5"):
        pad_prompts([[1], [1, -5]])
